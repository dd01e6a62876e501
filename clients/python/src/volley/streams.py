"""Streams on the client (PROTOCOL.md §9.9): server streams, client streams, both ways.

    async for line in client.stream(TAIL, query):          # one request, items back
        ...
    total = await client.client_stream(SUM, numbers)       # items up, one reply
    async for d in client.bidi_stream(DOUBLE, numbers):    # both ways
        ...

A stream is one entry of its connection's table of outstanding ids (``Connection.pending``),
a ``ClientStream``: the reader hands it the server's messages for its id. Items wait in a deque
until the caller takes them, and credit goes back to the server each time the caller has taken
half of the window, so the items not yet taken are bounded by the window whatever the server's
pace (a slow reader does not make memory grow). The items the caller sends (shapes 2 and 3) go
as the server grants credit, and as the socket takes them.

A stream ends once: with the server's end (``StreamEnd``, or a client stream's ``Reply``), an
``Error`` (raised to the caller after the items before it), the stream's deadline
(``CallTimeoutError``; the connection's one timer serves it, as it serves calls), the
connection's end, or the caller closing it early (``aclose``, leaving ``async with``, or
dropping the iterator), which sends ``Cancel``: the server stops its producer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from heapq import heappush
from typing import TYPE_CHECKING, Any, AsyncIterable, Callable, Iterable

from . import proto
from .codec import RAW
from .errors import (
    CallTimeoutError,
    Code,
    CodecError,
    ProtocolViolationError,
    TooLargeError,
    UsageError,
    error_for,
)

if TYPE_CHECKING:
    from .connection import Connection

# Items the server may send ahead of the caller, by default (as the Rust client's).
DEFAULT_WINDOW = 256

_TIMED_OUT = "the stream's deadline passed before it ended"


class ClientStream:
    """The client's side of one open stream, as its connection sees it: the table entry for
    its id (with ``done`` and ``set_exception``, as a call's future has)."""

    __slots__ = (
        "conn",
        "rid",
        "shape",
        "items",
        "waiter",
        "ended",
        "error",
        "reply",
        "allowance",
        "taken",
        "half",
        "credit",
        "credit_waiter",
        "sent_end",
        "sent_budget",
    )

    def __init__(self, conn: "Connection", rid: int, shape: int, window: int, sent_budget: bool):
        self.conn = conn
        self.rid = rid
        self.shape = shape
        self.items: deque[bytes] = deque()
        self.waiter: asyncio.Future | None = None
        self.ended = False
        self.error: BaseException | None = None
        self.reply: bytes | None = None
        # Items the server may still send (the credit granted minus the items received).
        self.allowance = window
        # Items the caller took since credit was last granted, and how many make a grant.
        self.taken = 0
        self.half = max(window // 2, 1)
        # Items this side may still send (shapes 2 and 3: the server's grants).
        self.credit = 0
        self.credit_waiter: asyncio.Future | None = None
        # Shapes 2 and 3: whether this side's StreamEnd (or a Cancel) went.
        self.sent_end = shape == proto.SHAPE_SERVER
        self.sent_budget = sent_budget

    # -- as the connection's table entry -----------------------------------------------------

    def done(self) -> bool:
        return self.ended

    def set_exception(self, error: BaseException) -> None:
        """The connection ended, or the stream's deadline passed (the connection has then
        forgotten the id and sent ``Cancel``)."""
        if isinstance(error, CallTimeoutError):
            error = CallTimeoutError(_TIMED_OUT)
        self.sent_end = True
        self._end(error)

    # -- messages from the server ------------------------------------------------------------

    def on_item(self, payload: bytes) -> None:
        if self.ended or self.shape == proto.SHAPE_CLIENT:
            return  # a client stream takes no items (§9.9, unknown ids)
        self.allowance -= 1
        if self.allowance < 0:
            self.abandon(ProtocolViolationError("the server sent a stream item beyond the credit granted"))
            return
        self.items.append(payload)
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    def on_credit(self, credit: int) -> None:
        if self.ended or self.shape == proto.SHAPE_SERVER:
            return
        self.credit += credit
        w = self.credit_waiter
        if w is not None and credit:
            self.credit_waiter = None
            if not w.done():
                w.set_result(None)

    def on_end(self, kind: int, m: tuple) -> None:
        """The server's end of the stream: ``StreamEnd``, ``Reply`` or ``Error`` (the
        connection has dropped the id from its table)."""
        if self.ended:
            return
        if kind == proto.ERROR:
            error = error_for(m[2], m[3])
            if m[2] == Code.DEADLINE_EXCEEDED and self.sent_budget:
                error = CallTimeoutError(f"{_TIMED_OUT} (the server stopped it: {m[3]})")
            self._end(error)
        elif kind == proto.REPLY and self.shape == proto.SHAPE_CLIENT:
            self.reply = m[2]
            self._end(None)
        elif kind == proto.STREAM_END and self.shape != proto.SHAPE_CLIENT:
            self._end(None)
        else:
            self._end(ProtocolViolationError(f"the server ended a stream of shape {self.shape} with kind 0x{kind:02x}"))
        if not self.sent_end:
            # This side still had items to send: it sends none now, and says so (§9.9, Ids).
            self.sent_end = True
            if self.conn.dead is None:
                self.conn.send(proto.cancel_message(self.rid))

    def _end(self, error: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.error = error
        for attr in ("waiter", "credit_waiter"):
            w = getattr(self, attr)
            if w is not None:
                setattr(self, attr, None)
                if not w.done():
                    w.set_result(None)

    # -- the caller's side -------------------------------------------------------------------

    def abandon(self, error: BaseException | None = None) -> None:
        """The caller no longer wants the stream (or cannot go on with it: ``error``): forget
        it and send ``Cancel`` (§9.9)."""
        if not self.ended:
            self.sent_end = True
            self.conn.forget(self.rid, cancel=True)
            self.items.clear()
            self._end(error)

    async def next_payload(self) -> bytes | None:
        """The next item's payload (granting credit as items are taken), or ``None`` at the
        end; raises the error the stream ended with (once)."""
        items = self.items
        while not items:
            if self.ended:
                error, self.error = self.error, None
                if error is not None:
                    raise error
                return None
            self.waiter = w = self.conn.loop.create_future()
            await w
        payload = items.popleft()
        self.taken += 1
        if self.taken >= self.half and not self.ended:
            self.grant()
        return payload

    def grant(self) -> None:
        """Gives the server back the credit of the items taken since the last grant."""
        self.conn.send(proto.stream_credit_message(self.rid, self.taken))
        self.allowance += self.taken
        self.taken = 0

    async def wait_end(self) -> None:
        while not self.ended:
            self.waiter = w = self.conn.loop.create_future()
            await w

    async def send_all(self, requests: Iterable[Any] | AsyncIterable[Any], encode: Callable[[Any], bytes]) -> None:
        """Sends every request as an item, each once the server has granted room for it and
        the socket can take it, then ``StreamEnd``. Stops when the stream has ended."""
        conn, rid = self.conn, self.rid
        item = proto.stream_item_message
        async for request in _each(requests):
            while self.credit <= 0:
                if self.ended:
                    return
                self.credit_waiter = w = conn.loop.create_future()
                await w
            if conn.paused:
                await conn.writable()
            if self.ended:
                return
            message = item(rid, encode(request))
            if len(message) > proto.MAX_FRAME_LEN:
                raise CodecError(f"a stream item of {len(message)} bytes exceeds the frame limit")
            conn.send(message)
            self.credit -= 1
        if not self.ended and not self.sent_end:
            self.sent_end = True
            conn.send(proto.stream_end_message(rid))


async def _each(requests: Iterable[Any] | AsyncIterable[Any]):
    if hasattr(requests, "__aiter__"):
        async for r in requests:
            yield r
    else:
        for r in requests:
            yield r


class ItemStream:
    """The items of a server stream (or a both-way stream), as an async iterator. Opened by
    the first ``__anext__`` (or ``async with``). Close it early with ``aclose()`` (leaving
    ``async with`` does, and so does dropping it): the server is sent ``Cancel``."""

    def __init__(self, client, method, shape: int, request: Any, requests, timeout: float | None, window: int):
        if timeout is not None and timeout <= 0:
            raise ValueError("a timeout is positive")
        if window < 2:
            raise ValueError("a stream's window is at least 2 items")
        self._client = client
        self._method = method
        self._shape = shape
        self._request = request
        self._requests = requests
        self._timeout = timeout
        self._window = window
        self._decode = None if method.reply is RAW else method.reply.decode
        self._state: ClientStream | None = None
        self._feeder: asyncio.Task | None = None
        self._closed = False

    async def _open(self) -> ClientStream:
        if self._closed:
            raise UsageError("the stream was closed")
        payload = self._method.request.encode(self._request) if self._shape == proto.SHAPE_SERVER else b""
        state = await open_stream(self._client, self._method, self._shape, payload, self._window, self._timeout)
        self._state = state
        if self._shape == proto.SHAPE_BOTH:
            self._feeder = asyncio.get_running_loop().create_task(
                _feed(state, self._requests, self._method.request.encode)
            )
        return state

    def __aiter__(self) -> "ItemStream":
        return self

    async def __anext__(self) -> Any:
        state = self._state or await self._open()
        items = state.items
        if items:
            # An item is waiting (the usual case while the server keeps ahead): taken here,
            # without another coroutine.
            payload = items.popleft()
            state.taken += 1
            if state.taken >= state.half and not state.ended:
                state.grant()
        else:
            try:
                payload = await state.next_payload()
            except asyncio.CancelledError:
                raise  # the reader was cancelled, not the stream: it may read on
            except BaseException:
                self._stop_feeder()
                raise
            if payload is None:
                self._stop_feeder()
                raise StopAsyncIteration
        if self._decode is None:
            return payload
        try:
            return self._decode(payload)
        except CodecError:
            await self.aclose()
            raise

    @property
    def id(self) -> int | None:
        """The stream's request id, once it is open."""
        return self._state.rid if self._state is not None else None

    async def aclose(self) -> None:
        """Ends the stream here: the server is sent ``Cancel`` unless it has ended already."""
        self._closed = True
        if self._state is not None:
            self._state.abandon()
        self._stop_feeder()

    def _stop_feeder(self) -> None:
        if self._feeder is not None and not self._feeder.done():
            self._feeder.cancel()

    async def __aenter__(self) -> "ItemStream":
        if self._state is None:
            await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # A constructor that refused its arguments left no state behind.
        state = getattr(self, "_state", None)
        if state is not None and not state.ended:
            # Dropped before its end: cancel it from the loop (this may run anywhere).
            try:
                state.conn.loop.call_soon_threadsafe(state.abandon)
            except RuntimeError:  # the loop is closed: so is the connection
                pass
        feeder = getattr(self, "_feeder", None)
        if feeder is not None and not feeder.done():
            try:
                feeder.get_loop().call_soon_threadsafe(feeder.cancel)
            except RuntimeError:
                pass


async def _feed(state: ClientStream, requests, encode) -> None:
    """A both-way stream's requests, sent by a task of their own; a request that fails to
    come or to encode ends the stream with that error."""
    try:
        await state.send_all(requests, encode)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the caller's iterable or codec failed: the stream ends with it
        state.abandon(e)


async def open_stream(client, method, shape: int, payload: bytes, window: int, timeout: float | None) -> ClientStream:
    """Opens a stream of ``shape`` on the client's connection; a server that did not announce
    ``STREAMS`` is sent nothing (``UsageError``)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    conn = await client._connection()
    if not conn.streams:
        raise UsageError(f"the server at {client.address} takes no streams (its preamble did not announce STREAMS)")
    if conn.paused:
        await conn.writable()
    if conn.lost is not None:
        raise conn.lost
    ext = None
    if deadline is not None:
        left = deadline - loop.time()
        if left <= 0:
            raise CallTimeoutError("the stream's deadline passed before it could be opened")
        ext = client._extensions(conn, left)
    rid = client.sequence.next(conn.pending)
    credit = window if shape != proto.SHAPE_CLIENT else 0
    message = proto.stream_open_message(rid, 0, method.names, shape, credit, payload, ext)
    if len(message) > proto.MAX_FRAME_LEN:
        limit = proto.MAX_FRAME_LEN
        raise TooLargeError(f"a stream open of {len(message)} bytes exceeds the frame limit of {limit} bytes")
    state = ClientStream(conn, rid, shape, credit, ext is not None)
    conn.pending[rid] = state
    conn.send(message)
    if deadline is not None:
        heappush(conn.deadlines, (deadline, rid, state))
        if deadline < conn.timer_at:
            conn._arm(deadline)
    return state


async def client_stream(client, method, requests, timeout: float | None) -> Any:
    """Sends ``requests`` as the items of a client stream, then waits for its one reply."""
    if timeout is not None and timeout <= 0:
        raise ValueError("a timeout is positive")
    state = await open_stream(client, method, proto.SHAPE_CLIENT, b"", 0, timeout)
    # The requests go from a task of their own, so that the stream's end (its reply, an
    # error, its deadline) is seen even while the caller's iterable is waiting.
    feeder = asyncio.get_running_loop().create_task(_feed(state, requests, method.request.encode))
    try:
        await state.wait_end()
    except BaseException:
        state.abandon()  # the caller was cancelled: tell the server
        raise
    finally:
        if not feeder.done():
            feeder.cancel()
    if state.error is not None:
        raise state.error
    return method.reply.decode(state.reply)
