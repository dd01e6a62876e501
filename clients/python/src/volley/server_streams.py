"""Streams on the server (PROTOCOL.md §9.9): the handlers' shapes and one open stream's state.

- a server stream (``Server.handle_stream``): ``handler(request)`` returns the items, as an
  async iterable (an async generator, typically) or a plain iterable, or a coroutine of one;
- a client stream (``Server.handle_client_stream``): ``handler(requests)`` takes the client's
  items as an async iterator and returns (or is a coroutine of) the one reply;
- both ways (``Server.handle_bidi_stream``): ``handler(requests)`` returns the items.

Each open stream runs as one task on its connection. The items are pulled from the handler
only while the client's credit lasts, so the server never sends beyond it, and a slow client
holds the producer still rather than filling memory. A client's items are granted 64 at a time
(the first grant with the open), again each time the handler has taken 32. A ``Cancel``, the
stream's deadline (the open's ``DEADLINE``), the connection's end and a shutdown stop the task:
the handler's generator is closed (its ``finally`` runs) and no item follows. A ``RemoteError``
from the handler ends the stream with that code after the items before it; any other exception
with ``Panicked``, as for a single call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from . import proto
from .codec import Method
from .errors import BadRequestError, Code, CodecError, RemoteError

if TYPE_CHECKING:
    from .server_connection import ServerConnection

log = logging.getLogger("volley.server")

# Items a client may send ahead of the handler, and after how many taken more are granted.
IN_WINDOW = 64
IN_GRANT = 32

SHAPE_NAMES = {
    proto.SHAPE_SERVER: "a server stream",
    proto.SHAPE_CLIENT: "a client stream",
    proto.SHAPE_BOTH: "a both-way stream",
}


def shape_name(shape: int) -> str:
    return SHAPE_NAMES.get(shape, "an unknown shape")


class StreamRoute:
    """How one stream method is served: its codecs, shape and handler."""

    def __init__(self, method: Method, handler: Callable[[Any], Any], shape: int, expose_errors: bool = False):
        self.method = method
        self.handler = handler
        self.shape = shape
        self.expose_errors = expose_errors


class Requests:
    """The client's items of a client or both-way stream, as the handler reads them (an async
    iterator of decoded requests). Taking items grants the client room for more."""

    def __init__(self, stream: "ServerStream"):
        self._stream = stream

    def __aiter__(self) -> "Requests":
        return self

    async def __anext__(self) -> Any:
        s = self._stream
        while not s.inbox:
            if s.in_ended or s.ended:
                raise StopAsyncIteration
            s.in_waiter = w = s.conn.loop.create_future()
            await w
        payload = s.inbox.popleft()
        s.in_taken += 1
        if s.in_taken >= IN_GRANT and not s.ended and not s.in_ended:
            s.conn.outbox.send(proto.stream_credit_message(s.rid, s.in_taken))
            s.in_allowance += s.in_taken
            s.in_taken = 0
        try:
            return s.route.method.request.decode(payload)
        except CodecError as e:
            raise BadRequestError(f"a stream item does not decode: {e}") from None


class ServerStream:
    """One stream a client opened on a connection."""

    def __init__(self, conn: "ServerConnection", rid: int, route: StreamRoute, credit: int):
        self.conn = conn
        self.rid = rid
        self.route = route
        self.credit = credit  # items this side may still send
        self.credit_waiter: asyncio.Future | None = None
        self.ended = False
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        # The client's items (shapes 2 and 3): waiting for the handler, what the client may
        # still send, taken since the last grant, and whether the client sent its end.
        self.inbox: deque[bytes] = deque()
        self.in_waiter: asyncio.Future | None = None
        self.in_allowance = 0
        self.in_taken = 0
        self.in_ended = route.shape == proto.SHAPE_SERVER

    # -- messages from the client ------------------------------------------------------------

    def on_credit(self, credit: int) -> None:
        if self.route.shape == proto.SHAPE_CLIENT:
            return  # a client stream sends no items: its credit is ignored (§9.9)
        self.credit += credit
        w = self.credit_waiter
        if w is not None and credit:
            self.credit_waiter = None
            if not w.done():
                w.set_result(None)

    def on_item(self, payload: bytes) -> None:
        if self.in_ended:
            return  # no items on a server stream, nor after the client's end (§9.9)
        self.in_allowance -= 1
        if self.in_allowance < 0:
            self.fail(Code.BAD_REQUEST, "the client sent more stream items than the credit granted")
            return
        self.inbox.append(payload)
        self._wake_reader()

    def on_end(self) -> None:
        if not self.in_ended:
            self.in_ended = True
            self._wake_reader()

    def _wake_reader(self) -> None:
        w = self.in_waiter
        if w is not None:
            self.in_waiter = None
            if not w.done():
                w.set_result(None)

    # -- ending ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ends the stream here without a word (a ``Cancel``, the connection's end): the
        producer is stopped, nothing more is sent on it."""
        if self.ended:
            return
        self.ended = True
        self.conn.streams.pop(self.rid, None)
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    def fail(self, code: int, message: str) -> None:
        """Ends the stream with an ``Error`` (the server's cancel)."""
        if not self.ended:
            self.stop()
            self.conn.outbox.send(proto.error_message(self.rid, code, message))

    def _finish(self, message: bytes) -> None:
        if not self.ended:
            self.stop()
            self.conn.outbox.send(message)

    def expire(self) -> None:
        self.timer = None
        self.fail(Code.DEADLINE_EXCEEDED, "the stream's deadline passed")

    # -- the task ----------------------------------------------------------------------------

    async def run(self, payload: bytes) -> None:
        route = self.route
        try:
            if route.shape == proto.SHAPE_SERVER:
                try:
                    arg = route.method.request.decode(payload)
                except CodecError as e:
                    raise BadRequestError(f"request does not decode: {e}") from None
            else:
                arg = Requests(self)
            out = route.handler(arg)
            if inspect.isawaitable(out):
                out = await out
            if route.shape == proto.SHAPE_CLIENT:
                try:
                    reply = route.method.reply.encode(out)
                except CodecError as e:
                    raise RemoteError(f"the reply could not be encoded: {e}", Code.INTERNAL) from None
                message = proto.reply_message(self.rid, reply)
                if len(message) > proto.MAX_FRAME_LEN:
                    raise RemoteError(f"a reply of {len(message)} bytes does not fit in a frame", Code.TOO_LARGE)
                self._finish(message)
            else:
                await self._produce(out)
        except asyncio.CancelledError:
            raise
        except RemoteError as e:
            self.fail(e.code, e.message)
        except Exception as e:  # the handler's failure ends its stream, never the server
            self._panicked(e)

    async def _produce(self, out: Any) -> None:
        """Sends the handler's items while the client's credit lasts, then ``StreamEnd``."""
        items = out.__aiter__() if hasattr(out, "__aiter__") else _from_iterable(iter(out))
        encode = self.route.method.reply.encode
        send = self.conn.outbox.send
        item = proto.stream_item_message
        rid = self.rid
        try:
            while True:
                while self.credit <= 0:
                    self.credit_waiter = w = self.conn.loop.create_future()
                    await w
                try:
                    value = await items.__anext__()
                except StopAsyncIteration:
                    self._finish(proto.stream_end_message(rid))
                    return
                if self.ended:
                    return
                try:
                    message = item(rid, encode(value))
                except CodecError as e:
                    raise RemoteError(f"a stream item could not be encoded: {e}", Code.INTERNAL) from None
                if len(message) > proto.MAX_FRAME_LEN:
                    raise RemoteError(f"a stream item of {len(message)} bytes does not fit in a frame", Code.TOO_LARGE)
                send(message)
                self.credit -= 1
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()

    def _panicked(self, e: Exception) -> None:
        m = self.route.method
        log.error("stream handler of %s/%s raised %s", m.service, m.name, type(e).__name__, exc_info=e)
        if self.route.expose_errors:
            self.fail(Code.PANICKED, f"the handler raised {type(e).__name__}: {e}")
        else:
            from .server import HANDLER_FAILED

            self.fail(Code.PANICKED, HANDLER_FAILED)


async def _from_iterable(it):
    for value in it:
        yield value
