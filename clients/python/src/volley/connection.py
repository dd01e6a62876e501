"""One client connection: preamble, writer, reader, the table of calls waiting for answers.

The connection is an asyncio ``Protocol``: bytes arrive in ``data_received``, are decoded whole
frames at a time, and each answer completes the future of the call with its id (PROTOCOL.md
§7.3). Messages to send are queued and written together once per turn of the event loop, so
calls made together leave in one write without any timer (§9.3). When the connection ends,
every call still waiting fails at once, exactly once.

A single call costs the event loop as little as it can: no task, no timer of its own. Its
future (a ``Call``) is what the caller awaits; the reader completes it in the turn its answer
arrives. The deadlines of all the calls on a connection sit in one heap, served by one loop
timer armed for the earliest: a call adds an entry and, as every call of a client usually has
the same timeout, almost never moves the timer. Answered calls leave the heap lazily, from its
front (calls are answered about in the order they were made, so the heap stays about as small
as the number of calls in flight).
"""

from __future__ import annotations

import asyncio
from heapq import heappop, heappush
from math import inf
from typing import Any, Callable

from . import proto
from .batch import BatchCall
from .decoder import Decoder
from .outbox import Outbox
from .errors import (
    CallTimeoutError,
    Code,
    CodecError,
    ConnectionLostError,
    ProtocolViolationError,
    UnauthenticatedError,
    code_name,
    error_for,
)
from .proto import (
    BATCH_REPLY,
    ERROR,
    GOAWAY,
    PING,
    PONG,
    REPLY,
    STREAM_CREDIT,
    STREAM_END,
    STREAM_ITEM,
    WireError,
)
from .streams import ClientStream

_TIMED_OUT = "the call's deadline passed before an answer"


class Call(asyncio.Future):
    """The future of one call in flight: its answer (decoded with ``decode``, unless that is
    ``None``), or the error it ended with. Cancelling it (the caller's task was cancelled, say)
    forgets the call on its connection and tells the server (§9.4)."""

    __slots__ = ("conn", "rid", "decode")

    def cancel(self, msg: Any = None) -> bool:
        if not self.done():
            self.conn.forget(self.rid, cancel=True)
        return super().cancel(msg)


class Connection(asyncio.Protocol):
    """The client side of one connection (§3). Created by ``Client``."""

    def __init__(self, token: bytes | None = None):
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.token = token
        self.decoder = Decoder()
        # id -> the future of the call waiting for it, the BatchCall of a batch's chunk, or
        # the ClientStream of an open stream.
        self.pending: dict[int, Call | BatchCall | ClientStream] = {}
        # The single calls' deadlines, a heap of (deadline, id, call), and the one loop timer
        # armed for the earliest (when it fires: ``timer_at``).
        self.deadlines: list[tuple[float, int, Call]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = inf
        self.pings: dict[int, asyncio.Future] = {}
        self.ready: asyncio.Future = self.loop.create_future()  # the server's features byte
        self.closed: asyncio.Future = self.loop.create_future()
        self._head = b""
        self.outbox = Outbox(self.loop)
        self._can_write = asyncio.Event()
        self._can_write.set()
        # Whether the socket's send buffer is full (the server is not reading): calls wait.
        self.paused = False
        self.extensions = False
        self.streams = False  # whether the server takes streams (§4.4)
        # Why no new call may use this connection (a GoAway, a failure, a close), or None.
        self.dead: str | None = None
        self.goaway: tuple[int, str] | None = None
        self.failure: Exception | None = None
        # What calls fail with once the connection has ended (None while it is up).
        self.lost: Exception | None = None
        self.on_message: Callable[[int], None] | None = None

    # -- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.outbox.transport = transport
        first = proto.preamble(0)
        if self.token is not None:
            first += proto.frames([proto.auth_message(self.token)])[0]
        transport.write(first)

    def data_received(self, data: bytes) -> None:
        try:
            if not self.ready.done():
                data = self._preamble(data)
                if not data:
                    return
            self.decoder.feed(data)
            messages = self.decoder.messages()
        except WireError as e:
            self._protocol_failure(str(e))
            return
        pending = self.pending
        for m in messages:
            # The answer to a single call, completed here, in the reader's turn.
            if m[0] == REPLY:
                entry = pending.pop(m[1], None)
                if type(entry) is Call:
                    if not entry.done():
                        if entry.decode is None:
                            entry.set_result(m[2])
                        else:
                            _decoded(entry, m[2])
                    continue
                if entry is not None:
                    pending[m[1]] = entry
            elif m[0] == STREAM_ITEM:
                # An item of a stream: to its queue, here too (a stream's per-item cost).
                entry = pending.get(m[1])
                if type(entry) is ClientStream:
                    entry.on_item(m[2])
                continue
            self._dispatch(m)

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = self.dead or "connection closed"
        err = self.lost = self._ending_error(exc)
        if not self.ready.done():
            self.ready.set_exception(err)
            self.ready.exception()  # marks it retrieved: the connect that awaited it may be gone
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.deadlines.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer, self.timer_at = None, inf
        for fut in self.pings.values():
            if not fut.done():
                fut.set_exception(err)
        self.pings.clear()
        self.paused = False
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True
        self._can_write.clear()

    def resume_writing(self) -> None:
        self.paused = False
        self._can_write.set()

    # -- reading -----------------------------------------------------------------------------

    def _preamble(self, data: bytes) -> bytes:
        """Collects the server's 8-byte preamble (§4.3); returns the bytes after it."""
        self._head += data
        if len(self._head) < proto.PREAMBLE_LEN:
            return b""
        features = proto.check_preamble(self._head)
        self.extensions = bool(features & proto.FEATURE_EXTENSIONS)
        self.streams = bool(features & proto.FEATURE_STREAMS)
        rest = self._head[proto.PREAMBLE_LEN :]
        self._head = b""
        self.ready.set_result(features)
        return rest

    def _dispatch(self, m: tuple) -> None:
        kind = m[0]
        if kind == REPLY or kind == BATCH_REPLY or kind == ERROR:
            entry = self.pending.pop(m[1], None)
            if entry is None or entry.done():
                return
            if type(entry) is ClientStream:
                entry.on_end(kind, m)
                return
            batch = type(entry) is BatchCall
            if kind == BATCH_REPLY and batch:
                entry.answer(m[1], m[2], m[3])
            elif kind == REPLY and not batch:
                entry.set_result(m[2])
            elif kind == ERROR:
                _failed(entry, m[1], error_for(m[2], m[3]))
            else:
                asked, got = ("BatchRequest", "Reply") if batch else ("Request", "BatchReply")
                _failed(entry, m[1], ProtocolViolationError(f"the server answered a {asked} with a {got}"))
        elif kind == STREAM_CREDIT:
            entry = self.pending.get(m[1])
            if type(entry) is ClientStream:
                entry.on_credit(m[2])
        elif kind == STREAM_END:
            entry = self.pending.get(m[1])
            if type(entry) is ClientStream and entry.shape != proto.SHAPE_CLIENT:
                del self.pending[m[1]]
                entry.on_end(kind, m)
        elif kind == PING:
            self.send(proto.pong_message(m[1]))
        elif kind == PONG:
            fut = self.pings.pop(m[1], None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif kind == GOAWAY:
            # No new calls here; keep reading until the server closes (§9.6).
            self.goaway = (m[1], m[2])
            self.dead = f"the server sent GoAway({code_name(m[1])}): {m[2]}"
        # Request, Cancel and Auth from a server are ignored (§9.1), and so are a StreamOpen
        # and stream messages for ids that are not open streams (§9.9).

    def _ending_error(self, exc: Exception | None) -> Exception:
        """What the calls still waiting fail with when the connection ends."""
        if self.failure is not None:
            return self.failure
        if self.goaway is not None:
            code, message = self.goaway
            if code == Code.UNAUTHENTICATED:
                return UnauthenticatedError(message)
            if code == Code.PROTOCOL:
                return ProtocolViolationError(f"the server closed the connection: {message}")
            return ConnectionLostError(f"{self.dead}; the connection closed", goaway_code=code)
        why = f": {exc}" if exc else ""
        return ConnectionLostError(f"the connection closed before an answer{why}")

    def _protocol_failure(self, reason: str) -> None:
        """The server sent bytes that break the protocol (§10): fail everything, say why, close."""
        self.failure = ProtocolViolationError(f"the server broke the protocol: {reason}")
        self.dead = str(self.failure)
        if self.transport is not None and not self.transport.is_closing():
            frame = proto.frames([proto.goaway_message(Code.PROTOCOL, reason)])[0]
            self.transport.write(frame)
            self.transport.close()

    # -- writing -----------------------------------------------------------------------------

    def send(self, message: bytes) -> None:
        self.outbox.send(message)

    def send_many(self, messages: list[bytes]) -> None:
        self.outbox.send_many(messages)

    def write_frame(self, frame: bytes) -> None:
        """Writes one whole frame now (a batch's: its frames are many and large, and the server
        can start on the first while the next is encoded)."""
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(frame)

    async def writable(self) -> None:
        """Waits while the socket's send buffer is full (the server is not reading)."""
        if not self._can_write.is_set():
            await self._can_write.wait()

    # -- calls -------------------------------------------------------------------------------

    def start(self, rid: int, message: bytes, decode: Callable[[bytes], Any] | None, deadline: float) -> Call:
        """Sends the request ``message`` of call ``rid`` and returns its future: the answer
        (through ``decode``), ``CallTimeoutError`` at ``deadline`` (then the id is dropped and
        a ``Cancel`` sent), or the error the connection ended with (at once if it already has:
        a call never waits on a closed connection)."""
        call = Call(loop=self.loop)
        call.conn = self
        call.rid = rid
        call.decode = decode
        if self.lost is not None:
            call.set_exception(self.lost)
            return call
        pending = self.pending
        if not pending and not self.outbox.queued():
            # Nothing in flight nor queued to share a write with (a caller making one call
            # after the other): it leaves now, a turn of the loop sooner.
            self.outbox.write_now(message)
        else:
            self.outbox.send(message)
        pending[rid] = call
        deadlines = self.deadlines
        while deadlines and deadlines[0][2].done():  # answered: its deadline no longer counts
            heappop(deadlines)
        heappush(deadlines, (deadline, rid, call))
        if deadline < self.timer_at:
            self._arm(deadline)
        return call

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(when, self._expire)
        self.timer_at = when

    def _expire(self) -> None:
        """The timer: every call whose deadline has come ends with ``CallTimeoutError`` (and
        is forgotten and cancelled); the timer is armed again for the next deadline."""
        self.timer, limit, self.timer_at = None, max(self.timer_at, self.loop.time()), inf
        deadlines, pending = self.deadlines, self.pending
        while deadlines:
            deadline, rid, call = deadlines[0]
            if deadline > limit and not call.done():
                self._arm(deadline)
                return
            heappop(deadlines)
            if not call.done():
                self.forget(rid, cancel=True)
                call.set_exception(CallTimeoutError(_TIMED_OUT))

    def expect_batch(self, call: BatchCall) -> None:
        """A batch's chunks, by id: each ends with its answer, or with the error the
        connection ended with (at once if it already has)."""
        if self.lost is not None:
            call.set_exception(self.lost)
        else:
            self.pending.update(dict.fromkeys(call.rids, call))

    def waiting(self) -> set[asyncio.Future]:
        """The futures of the calls still waiting (a batch's chunks share one); not streams,
        which a server ends once the client has half-closed (§9.9)."""
        return {
            entry if type(entry) is Call else entry.future
            for entry in self.pending.values()
            if not entry.done() and type(entry) is not ClientStream
        }

    def forget(self, rid: int, cancel: bool) -> None:
        """The caller stopped waiting for ``rid`` (timeout or cancellation): drop its entry and,
        if the connection is still up, tell the server (advisory, §9.4)."""
        if self.pending.pop(rid, None) is not None and cancel and self.dead is None:
            self.send(proto.cancel_message(rid))

    def close(self) -> None:
        self.dead = self.dead or "closed by the client"
        if self.transport is not None:
            self.transport.close()

    def half_close(self) -> None:
        """Flushes and shuts the write side (§9.6.1): the server answers what it read, then
        closes. TLS has no half-close; there the caller waits for the answers, then closes."""
        self.dead = self.dead or "closed by the client"
        self.outbox.flush()
        t = self.transport
        if t is not None and not t.is_closing() and t.can_write_eof():
            t.write_eof()


def _decoded(call: Call, payload: bytes) -> None:
    try:
        call.set_result(call.decode(payload))
    except CodecError as e:
        call.set_exception(e)


def _failed(entry: Call | BatchCall, rid: int, error: Exception) -> None:
    """Call ``rid`` ended with ``error`` (a single call, or one chunk of a batch)."""
    if type(entry) is BatchCall:
        entry.fail(rid, error)
    else:
        entry.set_exception(error)
