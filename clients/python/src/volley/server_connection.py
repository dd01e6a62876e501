"""The server side of one connection: preamble, token check, dispatch, answers, GoAway.

Bytes arrive in ``data_received``; each whole frame is decoded and checked before any of its
messages is acted on. Consecutive requests for one method form a run, served as one batch
(PROTOCOL.md §9.2); a BatchRequest is a run of its own and gets one BatchReply. Answers are
queued in the ``Outbox`` and leave together. A protocol error answers what came before it,
then ``GoAway(Protocol)`` and close (§10); a half-close by the client is answered in full,
then the connection closes (§9.6.1).
"""

from __future__ import annotations

import asyncio
import hmac
import socket
from typing import TYPE_CHECKING

from . import proto
from .decoder import Decoder
from .errors import Code
from .outbox import Outbox
from .proto import (
    AUTH,
    BATCH_REPLY,
    BATCH_REQUEST,
    CANCEL,
    ERROR,
    PING,
    REPLY,
    REQUEST,
    STREAM_CREDIT,
    STREAM_END,
    STREAM_ITEM,
    STREAM_OPEN,
    WireError,
)
from .server_streams import IN_WINDOW, ServerStream

if TYPE_CHECKING:
    from .server import Server

# After a GoAway, how long the server keeps reading (and dropping) before it closes, so that
# closing with unread bytes cannot reset the connection before the peer read the GoAway (§10).
LINGER = 1.0


class ServerConnection(asyncio.Protocol):
    def __init__(self, server: "Server"):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.outbox = Outbox(self.loop, server.counters)
        self.decoder = Decoder()
        self._head = b""
        self.preamble_done = False
        self.authed = not server.tokens
        # Handler runs not finished yet: their answers are still to come.
        self.tasks: set[asyncio.Task] = set()
        # The streams open on this connection, by id (§9.9).
        self.streams: dict[int, ServerStream] = {}
        self.stopped = False  # reads nothing more (a GoAway is on its way, or the peer closed)
        self.leaving = False  # a GoAway is on its way
        self.goaway_sent = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.outbox.transport = transport
        self.server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(proto.preamble(proto.FEATURE_EXTENSIONS | proto.FEATURE_STREAMS))
        if self.server.closing:
            self._leave(Code.SHUTTING_DOWN, "server is shutting down")

    def connection_lost(self, exc: Exception | None) -> None:
        self.stopped = True
        self._stop_streams()
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.stopped:
            return
        try:
            if not self.preamble_done:
                self._head += data
                if len(self._head) < proto.PREAMBLE_LEN:
                    return
                proto.check_preamble(self._head)
                data, self._head, self.preamble_done = self._head[proto.PREAMBLE_LEN :], b"", True
            self.decoder.feed(data)
            messages = self.decoder.messages()
            counters = self.server.counters
            counters.bytes_received += len(data)
            counters.messages_received += len(messages)
        except WireError as e:
            self._dispatch(e.before)
            self._leave(Code.PROTOCOL, str(e))
            return
        self._dispatch(messages)

    def eof_received(self) -> bool:
        """The client half-closed: answer everything read, then close (§9.6.1). A stream that
        ends inside a frame is broken: the answers already due still go, but no GoAway."""
        if not self.stopped:
            self.stopped = True
            # A half-closed client can send neither credit nor Cancel: its streams end (§9.9).
            self._stop_streams()
            self._spawn(self._finish())
        return True  # keep the write side open for the answers

    async def _finish(self) -> None:
        await self._drain_handlers()
        self.outbox.flush()
        if self.transport is not None:
            self.transport.close()

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch(self, messages: list[tuple]) -> None:
        run: list[tuple] = []  # consecutive requests for one method
        for m in messages:
            if self.stopped:
                return
            kind = m[0]
            if not self.authed:
                self._authenticate(m)
                continue
            if kind == REQUEST:
                if run and (run[0][3], run[0][4]) != (m[3], m[4]):
                    self._serve_run(run)
                    run = []
                run.append(m)
            elif kind == BATCH_REQUEST:
                self._serve_batch(m)
            elif kind == STREAM_ITEM:
                stream = self.streams.get(m[1])
                if stream is not None:
                    stream.on_item(m[2])
            elif kind == STREAM_CREDIT:
                stream = self.streams.get(m[1])
                if stream is not None:
                    stream.on_credit(m[2])
            elif kind == STREAM_OPEN:
                self._open_stream(m)
            elif kind == STREAM_END:
                stream = self.streams.get(m[1])
                if stream is not None:
                    stream.on_end()
            elif kind == CANCEL:
                # Advisory for a call; a stream's producer stops, and sends nothing more.
                stream = self.streams.get(m[1])
                if stream is not None:
                    stream.stop()
            elif kind == PING:
                self.outbox.send(proto.pong_message(m[1]))
            elif kind in (REPLY, ERROR, BATCH_REPLY):
                if run:
                    self._serve_run(run)
                self._leave(Code.PROTOCOL, "malformed message: a client sent a reply to the server")
                return
            # Pong, a client's GoAway and a later Auth change nothing (§9); nor do stream
            # messages for ids that are not open streams (§9.9).
        if run:
            self._serve_run(run)

    def _authenticate(self, m: tuple) -> None:
        if m[0] == AUTH and any(hmac.compare_digest(m[1], t) for t in self.server.tokens):
            self.authed = True
            return
        why = (
            "the token presented is not accepted"
            if m[0] == AUTH
            else "this server requires a token (none was presented)"
        )
        self._leave(Code.UNAUTHENTICATED, why)

    def _serve_run(self, run: list[tuple]) -> None:
        route = self.server.route(run[0][3], run[0][4])
        ids = [m[2] for m in run]
        if isinstance(route, tuple):
            self.outbox.send_many([proto.error_message(rid, *route) for rid in ids])
            return
        self._spawn(self._answer_run(route, ids, [m[6] for m in run]))

    async def _answer_run(self, route, ids: list[int], payloads: list[bytes]) -> None:
        results = await route.serve(payloads)
        out = []
        for rid, r in zip(ids, results):
            m = proto.reply_message(rid, r[1]) if r[0] else proto.error_message(rid, r[1], r[2])
            if len(m) > proto.MAX_FRAME_LEN:  # a message must fit in a frame (§5.2)
                m = proto.error_message(rid, Code.TOO_LARGE, f"a reply of {len(m)} bytes does not fit in a frame")
            out.append(m)
        self.outbox.send_many(out)

    def _serve_batch(self, m: tuple) -> None:
        rid, route = m[2], self.server.route(m[3], m[4])
        if isinstance(route, tuple):
            self.outbox.send(proto.error_message(rid, *route))
            return
        self._spawn(self._answer_batch(route, rid, m[6]))

    async def _answer_batch(self, route, rid: int, payloads: list[bytes]) -> None:
        message = proto.batch_reply_message(rid, await route.serve(payloads))
        if len(message) > proto.MAX_FRAME_LEN:
            message = proto.error_message(rid, Code.TOO_LARGE, "the batch reply does not fit in a frame")
        self.outbox.send(message)

    def _open_stream(self, m: tuple) -> None:
        """Opens stream ``m`` (a StreamOpen, §6.12), or answers why it cannot be."""
        _, _, rid, service, method, ext, shape, credit, payload = m
        route = self.server.stream_route(service, method, shape)
        if isinstance(route, tuple):
            self.outbox.send(proto.error_message(rid, *route))
            return
        if rid in self.streams:
            self.outbox.send(proto.error_message(rid, Code.BAD_REQUEST, f"stream id {rid:#x} is open already"))
            return
        stream = ServerStream(self, rid, route, credit)
        self.streams[rid] = stream
        if shape != proto.SHAPE_SERVER:
            # A stream that takes the client's items grants it its first window at once.
            stream.in_allowance = IN_WINDOW
            self.outbox.send(proto.stream_credit_message(rid, IN_WINDOW))
        if ext.deadline_micros is not None:
            stream.timer = self.loop.call_later(ext.deadline_micros / 1e6, stream.expire)
        task = self.loop.create_task(stream.run(payload))
        stream.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _stop_streams(self) -> None:
        for stream in list(self.streams.values()):
            stream.stop()

    def _fail_streams(self, code: int, message: str) -> None:
        for stream in list(self.streams.values()):
            stream.fail(code, message)

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _drain_handlers(self) -> None:
        """Waits for every handler run started on this connection (not for itself)."""
        current = asyncio.current_task()
        while True:
            running = [t for t in self.tasks if t is not current and not t.done()]
            if not running:
                return
            await asyncio.wait(running)

    # -- closing -----------------------------------------------------------------------------

    def _leave(self, code: int, message: str) -> None:
        """Stops reading at once (the rest of this read is not served either) and sends one
        GoAway: a second reason found before the first GoAway went out changes nothing."""
        if not self.leaving:
            self.leaving = self.stopped = True
            self._spawn(self.go_away(code, message))

    async def go_away(self, code: int, message: str) -> None:
        """Stops reading, answers what was read, sends the GoAway, shuts the write side and
        closes after a short linger (§9.6.2, §10)."""
        if self.transport is None or self.transport.is_closing():
            return
        self.stopped = True
        # Streams may last for ever: they end first, with the GoAway's reason (§9.9).
        self._fail_streams(code, message)
        await self._drain_handlers()
        if self.goaway_sent:  # a shutdown and a protocol error can both end a connection
            return
        self.goaway_sent = True
        self.outbox.send(proto.goaway_message(code, message))
        self.outbox.flush()
        t = self.transport
        if t.is_closing():
            return
        if t.can_write_eof():
            try:
                t.write_eof()
            except OSError:  # the client is gone already: nothing to linger for
                t.close()
                return
            self.loop.call_later(LINGER, t.close)
        else:
            t.close()
