"""The registry client (PROTOCOL.md §16): register under a lease, resolve, watch.

    registry = await Registry.connect("tcp://127.0.0.1:7400")
    lease = await registry.register([InstanceSpec("search", "tcp://10.0.0.5:7000")], ttl=10.0)
    found = await registry.resolve("search")          # Resolved: epoch, revision, instances
    changed = await registry.watch("search", found)   # answers once the service changed
    search = await registry.service("search")         # direct calls, as the Rust ServiceClient
    reply = await registry.relay(TOP, query, key="user-7")  # or through the controller
    await lease.deregister()
    await registry.close()

The registry is an ordinary Volley service (``volley.registry``) whose structured messages
are JSON (§16.2). A ``Lease`` renews itself every third of its ttl and registers again at
once when the controller no longer holds it whole (``known = false``), as §16.5 says servers
do.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from .client import Client
from .codec import BOOL, JSON, RAW, U32, UNIT, UTF8, Codec, Method
from .errors import CodecError, UnknownMethodError, VolleyError
from .hashing import stable_hash
from .relay import relay_outcome, relay_request
from .service_client import ServiceClient
from .tasks import cancel_and_wait

SERVICE = "volley.registry"
DEFAULT_TTL = 10.0
# How long a watch may be held by the controller (it caps this itself, reference: 60 s).
DEFAULT_WATCH_TIMEOUT = 30.0


def _method(name: str, request: Codec, reply: Codec) -> Method:
    return Method(SERVICE, name, request, reply)


REGISTER = _method("register", JSON, JSON)
RENEW = _method("renew", JSON, JSON)
DEREGISTER = _method("deregister", JSON, U32)
RESOLVE = _method("resolve", UTF8, JSON)
WATCH = _method("watch", JSON, JSON)
ALLOC_CLIENT_ID = _method("alloc_client_id", UNIT, U32)
RELEASE_CLIENT_ID = _method("release_client_id", U32, BOOL)
CLAIM_CLIENT_ID = _method("claim_client_id", U32, UNIT)
INFO = _method("info", UNIT, JSON)
LIST = _method("list", UNIT, JSON)
RELAY = _method("relay", RAW, RAW)


# Replaces the computed host id (§16.1), as it does for the Rust implementation.
HOST_ID_ENV = "VOLLEY_HOST_ID"


def host_id() -> str | None:
    """This process's host id (§16.1), computed as the Rust implementation does: the kernel's
    boot id and the network namespace, ``BOOT_ID/net:[INODE]`` (``$VOLLEY_HOST_ID`` if set).
    ``None`` where they cannot be read (not Linux)."""
    override = os.environ.get(HOST_ID_ENV, "").strip()
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return None


@dataclass(frozen=True)
class InstanceSpec:
    """One service offered at one address, to register (§16.2 ``InstanceSpec``).

    ``local_addresses`` (revision 2, §16.2.1) are more addresses of the same instance that only
    callers on its host can open (``shm://…``, ``unix://…``), for clients that prefer them
    (the Rust ``ServiceClient`` with ``prefer_local``); ``host_id`` says which host, and is
    needed with them: ``host_id()`` gives this one's."""

    service: str
    address: str
    weight: int = 1
    metadata: dict[str, str] = field(default_factory=dict)
    host_id: str = ""
    local_addresses: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        o: dict[str, Any] = {
            "service": self.service,
            "address": self.address,
            "weight": self.weight,
            "metadata": self.metadata,
        }
        # Left out when empty, so a registration without them is revision 1's (§16.2.1).
        if self.host_id:
            o["host_id"] = self.host_id
        if self.local_addresses:
            o["local_addresses"] = list(self.local_addresses)
        return o


@dataclass(frozen=True)
class Instance:
    """A registered instance as the registry lists it (§16.2 ``Instance``). This package calls
    ``address`` (it cannot open shared memory): ``local_addresses`` are there to read."""

    id: int
    lease: int
    service: str
    address: str
    weight: int = 1
    metadata: dict[str, str] = field(default_factory=dict)
    host_id: str = ""
    local_addresses: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, o: dict[str, Any]) -> "Instance":
        local = _field(o, "local_addresses", list, [])
        if not all(isinstance(a, str) for a in local):
            raise CodecError(f"the registry's field 'local_addresses' is {local!r}, not a list of strings")
        return cls(
            id=_int(o, "id"),
            lease=_int(o, "lease"),
            service=_str(o, "service"),
            address=_str(o, "address"),
            weight=_int(o, "weight", 1),
            metadata=dict(o.get("metadata") or {}),
            host_id=_field(o, "host_id", str, ""),
            local_addresses=tuple(local),
        )


@dataclass(frozen=True)
class Resolved:
    """A service's instances at one revision (§16.2 ``Resolved``, the reply of resolve and
    watch). Pass it to ``Registry.watch`` to wait for the next change."""

    service: str
    epoch: int
    revision: int
    known: bool
    settling: bool
    instances: tuple[Instance, ...]

    @classmethod
    def from_json(cls, o: Any) -> "Resolved":
        if not isinstance(o, dict):
            raise CodecError(f"a Resolved is a JSON object, not {type(o).__name__}")
        return cls(
            service=_str(o, "service"),
            epoch=_int(o, "epoch"),
            revision=_int(o, "revision"),
            known=_bool(o, "known"),
            settling=_bool(o, "settling"),
            instances=tuple(Instance.from_json(i) for i in _list(o, "instances")),
        )


def _field(o: dict, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    if name not in o:
        if default is not None:
            return default
        raise CodecError(f"the registry's answer lacks the field {name!r}")
    v = o[name]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise CodecError(f"the registry's field {name!r} is {v!r}, not a {kind}")
    return v


def _int(o: dict, name: str, default: int | None = None) -> int:
    return _field(o, name, int, default)


def _str(o: dict, name: str) -> str:
    return _field(o, name, str)


def _bool(o: dict, name: str) -> bool:
    return _field(o, name, bool)


def _list(o: dict, name: str) -> list:
    return _field(o, name, list)


class Registry:
    """A connection to a registry controller. Create with ``Registry.connect``.

    ``credential`` is the registration credential (§16.3) sent with register, renew and
    deregister; ``token`` the connection token (§6.11), if the controller requires them.
    """

    def __init__(self, client: Client, credential: str = ""):
        self.client = client
        self.credential = credential
        self._claimed_on: int | None = None
        # Service clients made here: their watches are closed with the registry.
        self.services: set[ServiceClient] = set()

    @classmethod
    async def connect(cls, address: str, *, credential: str = "", **options: Any) -> "Registry":
        """Connects and takes a client id from the controller (``alloc_client_id``): every
        request id this registry's client makes carries it (§7.1, §16.5)."""
        client = await Client.connect(address, **options)
        registry = cls(client, credential)
        client_id = await client.call(ALLOC_CLIENT_ID, None)
        client.sequence.reset(client_id)
        registry._claimed_on = client.connections
        return registry

    @property
    def client_id(self) -> int:
        return self.client.client_id

    async def _call(self, method: Method, request: Any, **options: Any) -> Any:
        await self._claim()
        return await self.client.call(method, request, **options)

    async def _claim(self) -> None:
        """Claims the client id again on a new connection (§16.5), so the controller does not
        hand it to another client. An older controller without the method is fine (§16.3)."""
        await self.client.ensure_connected()
        if self._claimed_on == self.client.connections:
            return
        self._claimed_on = self.client.connections
        try:
            await self.client.call(CLAIM_CLIENT_ID, self.client_id)
        except UnknownMethodError:
            pass

    async def resolve(self, service: str) -> Resolved:
        """The service's instances now. ``known`` is false if it never registered."""
        return Resolved.from_json(await self._call(RESOLVE, service))

    async def watch(
        self, service: str, since: Resolved | None = None, *, timeout: float = DEFAULT_WATCH_TIMEOUT
    ) -> Resolved:
        """Waits until the service changes after ``since`` (answers at once without it, or if
        the controller restarted since), or until ``timeout`` seconds pass: then the answer
        is the unchanged state (compare its ``revision``)."""
        request = {
            "service": service,
            "epoch": since.epoch if since else 0,
            "from_revision": since.revision if since else 0,
            "timeout_ms": int(timeout * 1000),
            "client_id": self.client_id,
        }
        # The call itself may take the whole watch, plus the time to answer.
        return Resolved.from_json(await self._call(WATCH, request, timeout=timeout + self.client.timeout))

    async def register(self, instances: list[InstanceSpec], *, ttl: float = DEFAULT_TTL) -> "Lease":
        """Registers ``instances`` under a new lease of ``ttl`` seconds and keeps it alive
        until ``Lease.deregister`` (or ``Lease.stop``)."""
        lease = Lease(self, list(instances), ttl)
        await lease._register()
        lease._task = asyncio.get_running_loop().create_task(lease._keep_alive())
        return lease

    async def service(self, name: str, **client_options: Any) -> ServiceClient:
        """A client of the service ``name`` that calls its instances directly, following the
        registry's changes (``client_options`` go to each instance's ``Client``)."""
        service = await ServiceClient(self, name, **client_options).start()
        self.services.add(service)
        return service

    async def relay(
        self,
        method: Method,
        request: Any,
        *,
        key: Any = None,
        address: str | None = None,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> Any:
        """Calls ``method`` through the controller (§16.4): on the instance that owns ``key``
        on the ring (``stable_hash``), at ``address``, or else by the controller's balancing."""
        payload = method.request.encode(request)
        key_hash = None if key is None else stable_hash(key)
        budget = self.client.timeout if timeout is None else timeout
        body = relay_request(
            method.service,
            method.name,
            payload,
            key_hash=key_hash,
            address=address,
            timeout_ms=max(1, int(budget * 1000)),
            idempotent=idempotent,
        )
        # The controller's own deadline is the forwarded call's: allow the hop on top of it.
        reply = await self._call(RELAY, body, timeout=budget + self.client.timeout)
        return method.reply.decode(relay_outcome(reply))

    async def info(self) -> dict[str, bool]:
        """What the controller requires: ``registration_credential``, ``token``, ``durable``."""
        return await self._call(INFO, None)

    async def list(self) -> dict[str, Any]:
        """Every service and instance (the ``Listing`` JSON object of §16.2)."""
        return await self._call(LIST, None)

    async def close(self) -> None:
        """Closes the service clients made here, then the connection."""
        for service in list(self.services):
            await service.close()
        await self.client.close()

    async def __aenter__(self) -> "Registry":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Lease:
    """Instances registered under one lease, renewed in the background (§16.5): every third
    of the ttl; at once under a new lease when the controller answers ``known = false``;
    every tenth of the ttl while renewals fail."""

    def __init__(self, registry: Registry, instances: list[InstanceSpec], ttl: float):
        if ttl <= 0:
            raise ValueError("a lease's ttl is positive")
        self.registry = registry
        self.instances = instances
        self.requested_ttl = ttl
        self.lease = 0
        self.ttl = ttl
        self.instance_ids: list[int] = []
        self.epoch = 0
        # How many times the instances were registered (1 after the first registration).
        self.registrations = 0
        self.last_error: VolleyError | None = None
        self._task: asyncio.Task | None = None

    async def _register(self) -> None:
        request = {
            "lease": 0,
            "ttl_ms": int(self.requested_ttl * 1000),
            "instances": [i.to_json() for i in self.instances],
            "credential": self.registry.credential,
        }
        reply = await self.registry._call(REGISTER, request)
        if not isinstance(reply, dict):
            raise CodecError(f"a Registered is a JSON object, not {type(reply).__name__}")
        self.lease = _int(reply, "lease")
        self.ttl = _int(reply, "ttl_ms") / 1000
        self.instance_ids = [int(i) for i in _list(reply, "instance_ids")]
        self.epoch = _int(reply, "epoch")
        self.registrations += 1

    async def renew(self) -> bool:
        """Renews once; registers again under a new lease if the controller does not hold
        this one whole. Returns whether the old lease was still known."""
        reply = await self.registry._call(RENEW, {"lease": self.lease, "credential": self.registry.credential})
        if not isinstance(reply, dict):
            raise CodecError(f"a Renewed is a JSON object, not {type(reply).__name__}")
        if _bool(reply, "known"):
            return True
        await self._register()
        return False

    async def _keep_alive(self) -> None:
        pause = self.ttl / 3
        while True:
            await asyncio.sleep(pause)
            try:
                await self.renew()
                self.last_error = None
                pause = self.ttl / 3
            except VolleyError as e:
                self.last_error = e
                pause = self.ttl / 10

    async def stop(self) -> None:
        """Stops renewing (the lease lapses after its ttl)."""
        await cancel_and_wait(self._task)
        self._task = None

    async def deregister(self) -> int:
        """Stops renewing and revokes the lease; returns how many instances it removed."""
        await self.stop()
        request = {"lease": self.lease, "credential": self.registry.credential}
        return await self.registry._call(DEREGISTER, request)
