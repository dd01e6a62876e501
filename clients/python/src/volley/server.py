"""``Server``: serves Python handlers to Volley clients in any language (asyncio).

    server = Server()
    server.handle(Method("echo", "echo"), lambda payload: payload)      # per request
    server.handle_batch(Method("rank", "score", JSON, JSON), score_all)  # a list at a time
    address = await server.listen("tcp://127.0.0.1:0")
    lease = await server.register("tcp://127.0.0.1:7400")  # optional: by name, via a registry
    ...
    await server.shutdown()  # deregisters, answers what it read, GoAway(ShuttingDown), closes

A handler takes the decoded request and returns the reply value (or a coroutine of it). It
fails a request by raising a ``RemoteError`` (``ApplicationError("why")`` or any code); any
other exception is answered ``Panicked`` (5) with a message that says only that (its text may
hold what a remote caller should not see: paths, queries, data), is logged here with its
traceback, and the server lives on; ``Server(expose_errors=True)`` sends the exception's type
and text too. A batch handler takes a
list of requests and returns one result per request: a value, or an exception for that item.
Requests whose payload does not decode are answered ``BadRequest`` (3) without the handler.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from typing import Any, Callable

from .address import Address, parse
from . import reflect
from .codec import Method
from . import health
from .errors import Code, CodecError, RemoteError, UsageError
from .outbox import Counters
from .registry import InstanceSpec, Lease, Registry
from .server_connection import ServerConnection
from .server_streams import StreamRoute, shape_name
from . import proto

Handler = Callable[[Any], Any]

log = logging.getLogger("volley.server")

# What a caller is told of a handler's unplanned exception, unless the server exposes errors.
HANDLER_FAILED = "the handler failed (the server's log has the details)"


class Route:
    """How one method is served: its codecs, and a handler per request or per batch."""

    def __init__(self, method: Method, handler: Handler, batch: bool, expose_errors: bool = False):
        self.method = method
        self.handler = handler
        self.batch = batch
        self.expose_errors = expose_errors

    async def serve(self, payloads: list[bytes]) -> list[tuple]:
        """One result per payload, in order: ``(True, reply)`` or ``(False, code, message)``."""
        results: list[Any] = [None] * len(payloads)
        values, positions = [], []
        for i, p in enumerate(payloads):
            try:
                values.append(self.method.request.decode(p))
                positions.append(i)
            except CodecError as e:
                results[i] = RemoteError(f"request could not be decoded: {e}", Code.BAD_REQUEST)
        if self.batch:
            replies = await self._batch(values)
        else:
            replies = [await _outcome(self.handler, v) for v in values]
        for i, r in zip(positions, replies):
            results[i] = r
        return [self._encoded(r) for r in results]

    async def _batch(self, values: list[Any]) -> list[Any]:
        if not values:
            return []
        out = await _outcome(self.handler, values)
        if isinstance(out, BaseException):
            return [out] * len(values)
        out = list(out)
        if len(out) != len(values):
            err = RemoteError(
                f"the batch handler returned {len(out)} results for {len(values)} requests", Code.INTERNAL
            )
            return [err] * len(values)
        return out

    def _encoded(self, result: Any) -> tuple:
        if isinstance(result, RemoteError):
            return (False, result.code, result.message)
        if isinstance(result, BaseException):
            log.error(
                "handler of %s/%s raised %s",
                self.method.service,
                self.method.name,
                type(result).__name__,
                exc_info=result,
            )
            if self.expose_errors:
                return (False, Code.PANICKED, f"the handler raised {type(result).__name__}: {result}")
            return (False, Code.PANICKED, HANDLER_FAILED)
        try:
            return (True, self.method.reply.encode(result))
        except CodecError as e:
            return (False, Code.INTERNAL, f"the reply could not be encoded: {e}")


async def _outcome(handler: Handler, arg: Any) -> Any:
    """The handler's return value, or the exception it raised."""
    try:
        out = handler(arg)
        if inspect.isawaitable(out):
            out = await out
        return out
    except Exception as e:  # every failure is the request's answer, never the server's end
        return e


class Server:
    """Serves the handlers it was given on the addresses it listens on.

    ``token``: connections must present it (or one of a list of them) first (§6.11).
    ``expose_errors``: a handler's unplanned exception is answered with its type and text
    (for development; by default callers get a generic ``Panicked`` and the log the details).
    ``reflection``: answer ``volley.reflect`` (the default; see ``volley.reflect``).
    """

    def __init__(
        self,
        *,
        token: bytes | str | list | None = None,
        expose_errors: bool = False,
        reflection: bool = True,
    ):
        self.expose_errors = expose_errors
        tokens = token if isinstance(token, list) else [token] if token is not None else []
        self.tokens = [t.encode() if isinstance(t, str) else t for t in tokens]
        self.routes: dict[tuple[str, str], Route] = {}
        # Stream methods (§9.9); like the Rust server's, not listed by reflection.
        self.stream_routes: dict[tuple[str, str], StreamRoute] = {}
        self.services: set[str] = set()
        self.connections: set[ServerConnection] = set()
        self.addresses: list[str] = []
        self._listeners: list[asyncio.base_events.Server] = []
        self._leases: list[tuple[Registry, Lease]] = []
        self.closing = False
        # Messages and bytes sent and received on every connection, since the start.
        self.counters = Counters()
        # The health service every server answers (unless given a volley.health of its own).
        self.health = health.Health(self.services)
        self._health_routes = {
            (health.SERVICE, "check"): Route(health.CHECK, self.health.check, batch=False),
            (health.SERVICE, "watch"): Route(health.WATCH, self.health.watch, batch=False),
        }
        if reflection:
            # Not one of ``services``: a registry lists only the application's.
            listing = Route(reflect.LIST, lambda _: reflect.catalog(self.routes), batch=False)
            self.routes[(reflect.SERVICE, reflect.LIST.name)] = listing

    def handle(self, method: Method, handler: Handler) -> "Server":
        """Serves ``method`` one request at a time: ``handler(request) -> reply``."""
        return self._add(Route(method, handler, batch=False, expose_errors=self.expose_errors))

    def handle_batch(self, method: Method, handler: Handler) -> "Server":
        """Serves ``method`` a batch at a time: ``handler([request, ...]) -> [result, ...]``."""
        return self._add(Route(method, handler, batch=True, expose_errors=self.expose_errors))

    def handle_stream(self, method: Method, handler: Handler) -> "Server":
        """Serves server stream ``method`` (§9.9): ``handler(request)`` returns its items, as
        an async iterable (an async generator, say) or an iterable, or a coroutine of one.
        Items are pulled only while the caller's credit lasts; a cancel, the stream's
        deadline or a shutdown closes the generator. Raise a ``RemoteError`` to end the
        stream with that error after the items already sent."""
        return self._add(StreamRoute(method, handler, proto.SHAPE_SERVER, self.expose_errors))

    def handle_client_stream(self, method: Method, handler: Handler) -> "Server":
        """Serves client stream ``method`` (§9.9): ``handler(requests)`` reads the caller's
        items from ``requests`` (``async for``; reading grants the caller room for more) and
        returns the one reply (or a coroutine of it)."""
        return self._add(StreamRoute(method, handler, proto.SHAPE_CLIENT, self.expose_errors))

    def handle_bidi_stream(self, method: Method, handler: Handler) -> "Server":
        """Serves both-way stream ``method`` (§9.9): ``handler(requests)`` reads the caller's
        items from ``requests`` and returns its own items, as ``handle_stream``'s does."""
        return self._add(StreamRoute(method, handler, proto.SHAPE_BOTH, self.expose_errors))

    def _add(self, route: Route | StreamRoute) -> "Server":
        key = (route.method.service, route.method.name)
        if key in self.routes or key in self.stream_routes:
            raise UsageError(f"{key[0]}/{key[1]} already has a handler")
        (self.stream_routes if isinstance(route, StreamRoute) else self.routes)[key] = route
        self.services.add(route.method.service)
        return self

    async def listen(self, address: str, *, ssl=None) -> str:
        """Starts accepting on ``address`` (tcp port 0: the system picks one) and returns the
        address clients dial (the port filled in)."""
        a = parse(address)
        loop = asyncio.get_running_loop()
        factory = lambda: ServerConnection(self)  # noqa: E731
        if a.scheme == "unix":
            listener = await loop.create_unix_server(factory, a.path)
            bound = str(a)
        else:
            if a.scheme == "tls" and ssl is None:
                raise UsageError("a tls:// listener needs an ssl.SSLContext with its certificate")
            listener = await loop.create_server(factory, a.host, a.port, ssl=ssl if a.scheme == "tls" else None)
            port = listener.sockets[0].getsockname()[1]
            bound = str(Address(a.scheme, host=a.host, port=port))
        self._listeners.append(listener)
        self.addresses.append(bound)
        return bound

    def route(self, service: str, method: str) -> Route | tuple[int, str]:
        """The route of a request, or the error it is answered with (§8)."""
        r = self.routes.get((service, method))
        if r is not None:
            return r
        if service == health.SERVICE and service not in self.services:
            r = self._health_routes.get((service, method))
            if r is not None:
                return r
            return (Code.UNKNOWN_METHOD, f'service "{service}" has no method "{method}"')
        stream = self.stream_routes.get((service, method))
        if stream is not None:
            return (Code.BAD_REQUEST, f"{service}/{method} is {shape_name(stream.shape)}: it is opened with StreamOpen")
        if service in self.services:
            return (Code.UNKNOWN_METHOD, f'service "{service}" has no method "{method}"')
        return (Code.UNKNOWN_SERVICE, f'no service named "{service}"')

    def stream_route(self, service: str, method: str, shape: int) -> StreamRoute | tuple[int, str]:
        """The route of a stream opened as ``shape``, or the error its open is answered with."""
        r = self.stream_routes.get((service, method))
        if r is not None:
            if r.shape == shape:
                return r
            return (
                Code.BAD_REQUEST,
                f"{service}/{method} is {shape_name(r.shape)} (shape {r.shape}); "
                f"it was opened as {shape_name(shape)} ({shape})",
            )
        single = self.route(service, method)
        if isinstance(single, tuple):
            return single
        return (Code.BAD_REQUEST, f"{service}/{method} is a single-call method, not a stream (shape {shape})")

    def set_serving(self, service: str, serving: bool, reason: str = "") -> None:
        """Marks ``service`` as taking new calls or not (``volley.health`` answers
        ``not_serving`` with ``reason``): what only the server knows, such as a database it
        needs being down. It still answers the calls it gets."""
        self.health.set_serving(service, serving, reason)

    async def register(
        self, registry: str, *, ttl: float = 10.0, advertise: str | None = None, **options: Any
    ) -> Lease:
        """Registers every service at the address it listens on (or ``advertise``) with the
        registry controller at ``registry``, under one lease renewed until ``shutdown``.
        ``options`` go to ``Registry.connect`` (``credential``, ``token``)."""
        if not self.addresses and advertise is None:
            raise UsageError("listen before registering: the registry needs an address to list")
        address = advertise or self.addresses[0]
        reg = await Registry.connect(registry, **options)
        try:
            lease = await reg.register([InstanceSpec(s, address) for s in sorted(self.services)], ttl=ttl)
        except BaseException:
            await reg.close()
            raise
        self._leases.append((reg, lease))
        return lease

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (§9.6.2): deregisters, stops accepting, answers every request
        already read, then sends ``GoAway(ShuttingDown)`` and closes each connection."""
        self.closing = True
        self.health.start_draining()
        for reg, lease in self._leases:
            try:
                await lease.deregister()
            except Exception:  # the controller may be gone; the lease then lapses by itself
                pass
            await reg.close()
        self._leases.clear()
        for listener in self._listeners:
            listener.close()
        conns = list(self.connections)
        if conns:
            await asyncio.wait(
                [asyncio.ensure_future(c.go_away(Code.SHUTTING_DOWN, "server is shutting down")) for c in conns],
                timeout=timeout,
            )
        for listener in self._listeners:
            await listener.wait_closed()
        self._listeners.clear()

    async def serve_forever(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        """Serves until one of ``signals`` arrives (Ctrl-C, a service manager's stop), then
        shuts down gracefully (``shutdown``) and returns. Call it after ``listen``. Where the
        loop cannot take signals (not the main thread, Windows), it serves until cancelled,
        and shuts down then."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        taken = []
        for sig in signals:
            try:
                loop.add_signal_handler(sig, stop.set)
                taken.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            await stop.wait()
        finally:
            for sig in taken:
                loop.remove_signal_handler(sig)
            await self.shutdown()

    async def __aenter__(self) -> "Server":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()
