"""``Client``: calls a Volley server over tcp, tls or unix (asyncio).

    client = await Client.connect("tcp://127.0.0.1:7411")
    reply = await client.call(ECHO, b"hi")                  # one call
    replies = await client.call_batch(ECHO, [b"a", b"b"])   # one BatchRequest, one wait
    await client.close()

Calls made concurrently share the connection (pipelining) and leave in one write. Every call
has a deadline (``timeout``, default 30 s): enforced here, and sent to servers that accept
request extensions (PROTOCOL.md §6.2.2) so they can drop work nobody waits for. Request ids are
``client_id << 32 | sequence`` (§7). A connection that the server closed or sent GoAway on is
replaced by a new one for the next call; calls waiting on it fail with ``ConnectionLostError``.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl as ssl_module
import struct
from typing import Any, AsyncIterable, Awaitable, Iterable

from . import batch, proto, streams
from .address import open_connection, parse
from .codec import RAW, Method
from .connection import Connection
from .errors import (
    CallTimeoutError,
    ClosedError,
    ConnectionLostError,
    TooLargeError,
)
from .proto import MAX_BATCH_ITEMS, MAX_FRAME_LEN

DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 5.0
# Requests per BatchRequest, as the Rust client's default: a server admits a chunk whole or
# refuses it whole (Overloaded) against its bound of queued work, so small chunks let a big
# call through where one huge chunk would wait for an idle server (PROTOCOL.md §9.2).
DEFAULT_CHUNK = 128

_local_client_ids = itertools.count(1)

# A request's fixed head (kind, flags, id), its payload length, and an extension block that
# holds only a DEADLINE (block length 6, then the entry), each packed at once (§6.2, §6.2.2).
_REQUEST_HEAD = struct.Struct("<BBQ").pack
_U32 = struct.Struct("<I").pack
_DEADLINE_BLOCK = struct.Struct("<HBBI").pack


class Sequence:
    """The request ids of one client (§7.1): its client id above a wrapping 32-bit counter.
    Shared by every connection of the client, so its ids stay unique across them."""

    def __init__(self, client_id: int | None = None):
        self.client_id = client_id if client_id is not None else next(_local_client_ids)
        if not 0 <= self.client_id <= 0xFFFFFFFF:
            raise ValueError("a client id is a u32")
        self._high = self.client_id << 32
        self._seq = 0

    def reset(self, client_id: int) -> None:
        """Takes another client id (one a registry handed out, §16.5); the sequence goes on."""
        if not 0 < client_id <= 0xFFFFFFFF:
            raise ValueError(f"a client id is a non-zero u32, not {client_id}")
        self.client_id = client_id
        self._high = client_id << 32

    def next(self, pending: dict) -> int:
        """The next id not outstanding on the connection whose table is ``pending`` (§7.2)."""
        while True:
            rid = self._high | self._seq
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            if rid not in pending:
                return rid


class Client:
    """A connection to one server (reconnected on demand). Create with ``Client.connect``."""

    def __init__(
        self,
        address: str,
        *,
        token: bytes | str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        client_id: int | None = None,
        sequence: Sequence | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ):
        self.address = parse(address)
        self.token = token.encode() if isinstance(token, str) else token
        self.ssl = ssl
        self.sequence = sequence or Sequence(client_id)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._conn: Connection | None = None
        self._connecting = asyncio.Lock()
        self._closed = False
        self._ping_tokens = itertools.count(1)
        # How many connections this client has opened (a registry claims its id on each).
        self.connections = 0

    @classmethod
    async def connect(cls, address: str, **options: Any) -> "Client":
        """Connects now (so a wrong address or a refused connection fails here)."""
        client = cls(address, **options)
        await client._connection()
        return client

    async def ensure_connected(self) -> None:
        """Connects now if there is no usable connection (the next call would)."""
        await self._connection()

    @property
    def client_id(self) -> int:
        return self.sequence.client_id

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.dead is None:
            return conn
        if self._closed:
            raise ClosedError("the client is closed")
        async with self._connecting:
            if self._conn is not None and self._conn.dead is None:
                return self._conn
            self._conn = await self._open()
            self.connections += 1
            return self._conn

    async def _open(self) -> Connection:
        """A new connection, once the server's preamble has arrived (so every request knows
        whether it may carry extensions, §4.4)."""

        async def opened() -> Connection:
            _, conn = await open_connection(self.address, lambda: Connection(self.token), self.ssl)
            await conn.ready
            return conn

        try:
            conn = await asyncio.wait_for(opened(), self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectionLostError(
                f"connecting to {self.address} timed out after {self.connect_timeout} s", unsent=True
            ) from None
        except (OSError, ssl_module.SSLError) as e:
            raise ConnectionLostError(f"cannot connect to {self.address}: {e}", unsent=True) from None
        return conn

    def _budget(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else timeout
        if t <= 0:
            raise ValueError("a timeout is positive")
        return t

    @staticmethod
    def _extensions(conn: Connection, budget: float) -> proto.Extensions | None:
        """The request's extensions: the budget left (§6.2.2) to a server that takes them. A
        budget the field cannot hold (over 4,294,967,295 µs, about 71.6 minutes) is left out
        rather than cut: the server then sets no deadline, where a shorter one would have it
        give up on a caller still waiting."""
        if not conn.extensions:
            return None
        micros = int(budget * 1e6)
        if micros > proto.MAX_DEADLINE_MICROS:
            return None
        return proto.Extensions(deadline_micros=micros)

    def call(
        self, method: Method, request: Any, *, timeout: float | None = None, idempotent: bool = False
    ) -> Awaitable[Any]:
        """Sends one request; what it returns is awaited for the decoded reply, or raises
        (``RemoteError`` for an error reply, ``CallTimeoutError``, ``ConnectionLostError`` ...).

        On a connection that is up and can take more bytes, the request is encoded and queued
        before this returns, and what it returns is the call's own future (no task): the reader
        completes it when the answer arrives. Otherwise (connecting first, or waiting for the
        socket to drain) a task does the same once it can."""
        reply = method.reply
        return self._call(method, request, method.request.encode, None if reply is RAW else reply.decode, timeout, idempotent)

    def call_raw(
        self, method: Method, payload: bytes, *, timeout: float | None = None, idempotent: bool = False
    ) -> Awaitable[bytes]:
        """``call`` with the payloads as bytes, not encoded or decoded here."""
        return self._call(method, payload, RAW.encode, None, timeout, idempotent)

    def _call(self, method, request, encode, decode, timeout, idempotent) -> Awaitable[Any]:
        conn = self._conn
        loop = asyncio.get_running_loop()
        try:
            budget = self.timeout if timeout is None else timeout
            if budget <= 0:
                raise ValueError("a timeout is positive")
            if conn is None or conn.dead is not None or conn.paused:
                return loop.create_task(self._call_later(method, request, encode, decode, budget, idempotent))
            return self._start(conn, method, encode(request), decode, loop.time() + budget, budget, idempotent)
        except Exception as e:
            # Raised when awaited, as from a coroutine: a call in a gather fails in its place.
            failed = loop.create_future()
            failed.set_exception(e)
            return failed

    async def _call_later(self, method, request, encode, decode, budget, idempotent) -> Any:
        """The call on its way when it must wait first: for a connection, or for the socket."""
        deadline = asyncio.get_running_loop().time() + budget
        payload = encode(request)
        conn = await self._connection()
        await conn.writable()
        left = deadline - conn.loop.time()
        if left <= 0:
            raise CallTimeoutError("the call's deadline passed before its request could be sent")
        return await self._start(conn, method, payload, decode, deadline, left, idempotent)

    def _start(self, conn: Connection, method, payload: bytes, decode, deadline: float, left: float, idempotent: bool):
        rid = self.sequence.next(conn.pending)
        flags = proto.FLAG_IDEMPOTENT if idempotent else 0
        tail = method.names
        if conn.extensions:
            micros = int(left * 1e6)
            if micros <= proto.MAX_DEADLINE_MICROS:  # else left out, as in _extensions
                flags |= proto.FLAG_EXTENSIONS
                tail += _DEADLINE_BLOCK(6, proto.EXT_DEADLINE, 4, micros)
        message = b"".join((_REQUEST_HEAD(proto.REQUEST, flags, rid), tail, _U32(len(payload)), payload))
        if len(message) > MAX_FRAME_LEN:
            raise TooLargeError(f"a request of {len(message)} bytes exceeds the frame limit of {MAX_FRAME_LEN} bytes")
        return conn.start(rid, message, decode, deadline)

    async def call_batch(
        self,
        method: Method,
        requests: Iterable[Any],
        *,
        timeout: float | None = None,
        idempotent: bool = False,
        chunk: int = DEFAULT_CHUNK,
    ) -> list[Any]:
        """Calls ``method`` once per request, in BatchRequest chunks of ``chunk`` items (at
        most 65,536) sent together, and waits once. Returns one result per request, in order:
        the decoded reply, or the exception instance that item ended with (an error reply, a
        decode error, a timeout ...). A failure of a whole chunk (an unknown method, a lost
        connection) is every one of its items'."""
        budget = self._budget(timeout)
        deadline = asyncio.get_running_loop().time() + budget
        prepared = batch.Prepared(method, list(requests), min(max(chunk, 1), MAX_BATCH_ITEMS))
        conn = await self._connection()
        await conn.writable()
        left = deadline - conn.loop.time()
        if left <= 0:
            raise CallTimeoutError("the call's deadline passed before its requests could be sent")
        rids = [self.sequence.next(conn.pending) for _ in range(prepared.chunks)]
        call = batch.BatchCall(conn, rids, prepared.edges)
        flags = proto.FLAG_IDEMPOTENT if idempotent else 0
        ext = self._extensions(conn, left)
        frames = proto.batch_request_frames(
            rids, flags, method.names, prepared.payloads, prepared.edges, prepared.size, ext
        )
        await call.run(frames, deadline)
        return batch.results(method, prepared, call)

    def stream(
        self,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,
        window: int = streams.DEFAULT_WINDOW,
    ) -> streams.ItemStream:
        """Opens server stream ``method`` with ``request`` (PROTOCOL.md §9.9): an async
        iterator of the server's items, decoded with ``method.reply``. The server may send
        ``window`` items ahead of the reader; credit goes back as items are read. ``timeout``
        bounds the whole stream (none by default) and travels to the server. The stream opens
        with the first item asked for (or ``async with``); an ``Error`` from the server is
        raised after the items before it; ``aclose()``, leaving ``async with`` or dropping
        the iterator early sends ``Cancel``."""
        return streams.ItemStream(self, method, proto.SHAPE_SERVER, request, None, timeout, window)

    async def client_stream(
        self, method: Method, requests: Iterable[Any] | AsyncIterable[Any], *, timeout: float | None = None
    ) -> Any:
        """Calls client stream ``method`` (§9.9): sends each of ``requests`` (an iterable or
        an async iterable) as an item, as the server grants credit, then waits for the one
        reply. ``timeout`` bounds the whole stream (none by default)."""
        return await streams.client_stream(self, method, requests, timeout)

    def bidi_stream(
        self,
        method: Method,
        requests: Iterable[Any] | AsyncIterable[Any],
        *,
        timeout: float | None = None,
        window: int = streams.DEFAULT_WINDOW,
    ) -> streams.ItemStream:
        """Opens both-way stream ``method`` (§9.9): a task sends ``requests`` (an iterable or
        an async iterable, say an async generator reading a queue) as the server grants
        credit, while the returned async iterator reads the server's items, as ``stream``'s
        does."""
        return streams.ItemStream(self, method, proto.SHAPE_BOTH, None, requests, timeout, window)

    async def ping(self, timeout: float | None = None) -> float:
        """Sends a Ping and waits for its Pong (§9.5); returns the round trip in seconds."""
        budget = self._budget(timeout)
        conn = await self._connection()
        token = next(self._ping_tokens)
        fut = conn.loop.create_future()
        conn.pings[token] = fut
        start = conn.loop.time()
        conn.send(proto.ping_message(token))
        try:
            await asyncio.wait_for(fut, budget)
        except asyncio.TimeoutError:
            conn.pings.pop(token, None)
            raise CallTimeoutError(f"no pong within {budget} s") from None
        return conn.loop.time() - start

    @property
    def server_accepts_extensions(self) -> bool | None:
        """Whether the current connection's server announced EXTENSIONS (None: no connection)."""
        return self._conn.extensions if self._conn is not None else None

    @property
    def server_accepts_streams(self) -> bool | None:
        """Whether the current connection's server announced STREAMS (None: no connection)."""
        return self._conn.streams if self._conn is not None else None

    async def close(self, timeout: float | None = None) -> None:
        """Half-closes (§9.6.1): the calls already sent get their answers (waited for up to
        ``timeout``), then the connection closes. Calls after this raise ``ClosedError``."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.half_close()
        waiting = conn.waiting()
        if waiting:
            await asyncio.wait(waiting, timeout=self._budget(timeout))
        conn.close()

    async def __aenter__(self) -> "Client":
        await self._connection()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

