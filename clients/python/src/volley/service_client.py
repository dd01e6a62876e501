"""``ServiceClient``: calls a service by name, straight to its instances (direct mode,
PROTOCOL.md §16.5), picking them as the Rust ``ServiceClient`` does (§16.6).

    registry = await Registry.connect("tcp://127.0.0.1:7400")
    search = await registry.service("search")
    await search.call(TOP, query)                  # round-robin over the instances, by weight
    await search.call(TOP, query, key="user-7")    # the instance owning the key on the ring
    await search.close()

It resolves the service once, then keeps one watch outstanding, so instances that come and go
are picked up without a call failing. One connection per instance, all sharing the
registry's client id and request sequence (§7.1). A call its instance never ran (the
connection could not be made, or the server went away with ``GoAway(ShuttingDown)`` before
reading it, §9.6.2) goes to another instance at once, whatever the method; an idempotent call
whose connection failed is tried on another instance too. At most ``MAX_ATTEMPTS`` instances.

Streams (§9.9) open on one instance, picked as for a call, and stay there until they end:
``stream`` and ``bidi_stream`` return the async iterator of ``Client.stream``, and
``client_stream`` the one reply. An instance that cannot be connected to is passed over for
another, as for a call; once the open is sent it is never sent again (the stream's items may
already have been taken), as the Rust ``ServiceClient`` does.

    async for line in search.stream(TAIL, query):   # on one instance, round-robin
        ...
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterable, Iterable

from . import proto, streams
from .address import parse
from .client import Client
from .codec import Method
from .errors import ConnectionLostError, NoInstancesError, NotRegisteredError, UsageError, VolleyError
from .hashing import HashRing, stable_hash
from .tasks import cancel_and_wait

if TYPE_CHECKING:
    from .registry import Instance, Registry, Resolved

# Pause before a watch that failed is sent again (the controller may be restarting).
WATCH_RETRY = 0.25
# Most instances one call tries (as the Rust ServiceClient's default).
MAX_ATTEMPTS = 3


def candidates(service: str, instances: tuple["Instance", ...]) -> list["Instance"]:
    """The instances calls may go to, in the registry's order (§16.6): not another service's,
    weight at least 1, an address this package can dial, each address once."""
    out, seen = [], set()
    for i in instances:
        if i.service != service or i.weight < 1 or i.address in seen:
            continue
        try:
            parse(i.address)
        except UsageError:
            continue
        seen.add(i.address)
        out.append(i)
    return out


class ServiceClient:
    """Direct calls to the instances of one service. Create with ``Registry.service``."""

    def __init__(self, registry: "Registry", service: str, **client_options: Any):
        self.registry = registry
        self.service = service
        self.client_options = client_options
        self.resolved: Resolved | None = None
        self.instances: list[Instance] = []
        self._ring = HashRing([])
        self._rr = 0
        self._clients: dict[str, Client] = {}
        self._watch: asyncio.Task | None = None

    async def start(self) -> "ServiceClient":
        self._update(await self.registry.resolve(self.service))
        self._watch = asyncio.get_running_loop().create_task(self._watching())
        return self

    def _update(self, resolved: "Resolved") -> None:
        """Takes a new answer; one that lists nothing usable does not replace a non-empty
        list, and a settling controller's list is merged into the one held (§16.1, §16.5)."""
        held = self.resolved
        if held is not None and resolved.epoch == held.epoch and resolved.revision < held.revision:
            return  # an answer overtaken by a newer one
        found = candidates(self.service, resolved.instances)
        if resolved.settling:
            known = {i.address for i in found}
            found += [i for i in self.instances if i.address not in known]
        self.resolved = resolved
        if found or not self.instances:
            self.instances = found
            self._ring = HashRing([(i.address, i.weight) for i in found])

    async def _watching(self) -> None:
        while True:
            try:
                self._update(await self.registry.watch(self.service, self.resolved))
            except VolleyError:
                await asyncio.sleep(WATCH_RETRY)

    def pick(self, key: Any = None, skip: set[str] | None = None) -> "Instance":
        """The instance a call goes to: by the key's place on the ring, or round-robin by
        weight (§16.6); instances in ``skip`` are left out."""
        skip = skip or set()
        live = [i for i in self.instances if i.address not in skip]
        if not live:
            if self.resolved is not None and not self.resolved.known:
                raise NotRegisteredError(f"no service named {self.service!r} ever registered")
            raise NoInstancesError(f"no usable instance of {self.service!r}")
        if key is not None:
            index = self._ring.node(stable_hash(key), lambda n: self.instances[n].address in skip)
            return self.instances[index]
        x = self._rr % sum(i.weight for i in live)
        self._rr += 1
        total = 0
        for i in live:
            total += i.weight
            if total > x:
                return i
        raise AssertionError("unreachable: x is below the sum of the weights")

    def _client(self, address: str) -> Client:
        c = self._clients.get(address)
        if c is None:
            c = Client(address, sequence=self.registry.client.sequence, **self.client_options)
            self._clients[address] = c
        return c

    async def call(
        self, method: Method, request: Any, *, key: Any = None, idempotent: bool = False, **options: Any
    ) -> Any:
        """Calls ``method`` on the instance ``pick`` chooses (see ``Client.call``). A call that
        never ran, or an idempotent one whose connection failed, goes to the next instance."""
        tried: set[str] = set()
        instance = self.pick(key)
        while True:
            try:
                return await self._client(instance.address).call(method, request, idempotent=idempotent, **options)
            except ConnectionLostError as e:
                tried.add(instance.address)
                if not (idempotent or e.never_ran) or len(tried) >= MAX_ATTEMPTS:
                    raise
                try:
                    instance = self.pick(key, skip=tried)
                except (NoInstancesError, NotRegisteredError):
                    raise e from None

    async def call_batch(self, method: Method, requests: list[Any], *, key: Any = None, **options: Any) -> list[Any]:
        """One batch call to one instance (round-robin, or the key's), as ``Client.call_batch``."""
        return await self._client(self.pick(key).address).call_batch(method, requests, **options)

    async def _connected(self, key: Any = None) -> Client:
        """The client of an instance picked for a stream, connected: an instance that cannot
        be connected to is passed over (at most ``MAX_ATTEMPTS``), as for a call."""
        tried: set[str] = set()
        instance = self.pick(key)
        while True:
            client = self._client(instance.address)
            try:
                await client._connection()
                return client
            except ConnectionLostError as e:
                tried.add(instance.address)
                if len(tried) >= MAX_ATTEMPTS:
                    raise
                try:
                    instance = self.pick(key, skip=tried)
                except (NoInstancesError, NotRegisteredError):
                    raise e from None

    def stream(
        self,
        method: Method,
        request: Any,
        *,
        key: Any = None,
        timeout: float | None = None,
        window: int = streams.DEFAULT_WINDOW,
    ) -> streams.ItemStream:
        """Server stream ``method`` on one instance (round-robin, or the key's): an async
        iterator of its items, as ``Client.stream``; the instance is picked when it opens."""
        return _PickedStream(self, key, method, proto.SHAPE_SERVER, request, None, timeout, window)

    async def client_stream(
        self,
        method: Method,
        requests: Iterable[Any] | AsyncIterable[Any],
        *,
        key: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Client stream ``method`` on one instance (round-robin, or the key's), as
        ``Client.client_stream``: its one reply."""
        client = await self._connected(key)
        return await client.client_stream(method, requests, timeout=timeout)

    def bidi_stream(
        self,
        method: Method,
        requests: Iterable[Any] | AsyncIterable[Any],
        *,
        key: Any = None,
        timeout: float | None = None,
        window: int = streams.DEFAULT_WINDOW,
    ) -> streams.ItemStream:
        """Both-way stream ``method`` on one instance (round-robin, or the key's), as
        ``Client.bidi_stream``; the instance is picked when it opens."""
        return _PickedStream(self, key, method, proto.SHAPE_BOTH, None, requests, timeout, window)

    async def close(self) -> None:
        self.registry.services.discard(self)
        await cancel_and_wait(self._watch)
        self._watch = None
        for c in self._clients.values():
            await c.close()
        self._clients.clear()


class _PickedStream(streams.ItemStream):
    """An ``ItemStream`` whose client is an instance's, picked (and connected) when the stream
    opens."""

    def __init__(self, service: ServiceClient, key: Any, *args: Any):
        super().__init__(None, *args)
        self._service = service
        self._key = key

    async def _open(self) -> streams.ClientStream:
        if self._client is None:
            self._client = await self._service._connected(self._key)
        return await super()._open()
