"""The send side of a connection: messages queued during one turn of the event loop leave
together, cut into frames (PROTOCOL.md §5), in one write. Calls (or answers) made together
thus share writes without any timer (§9.3)."""

from __future__ import annotations

import asyncio

from . import proto

_U32 = proto._U32.pack


class Counters:
    """Traffic of a server's connections: messages and bytes (frame headers included, the
    preamble not), each way."""

    __slots__ = ("messages_sent", "messages_received", "bytes_sent", "bytes_received")

    def __init__(self) -> None:
        self.messages_sent = self.messages_received = self.bytes_sent = self.bytes_received = 0


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop, counters: Counters | None = None):
        self.loop = loop
        self.counters = counters
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._scheduled = False

    def send(self, message: bytes) -> None:
        self._out.append(message)
        self._schedule()

    def send_many(self, messages: list[bytes]) -> None:
        self._out.extend(messages)
        self._schedule()

    def queued(self) -> bool:
        """Whether messages wait for the end of this turn."""
        return bool(self._out)

    def write_now(self, message: bytes) -> None:
        """Writes one message in a frame of its own at once (nothing may be queued: it would
        be overtaken)."""
        t = self.transport
        if t is not None and not t.is_closing():
            data = _U32(len(message)) + message
            t.write(data)
            if self.counters is not None:
                self.counters.messages_sent += 1
                self.counters.bytes_sent += len(data)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Writes everything queued now (a no-op once the transport is closing)."""
        self._scheduled = False
        out, self._out = self._out, []
        t = self.transport
        if out and t is not None and not t.is_closing():
            data = b"".join(proto.frames(out))
            t.write(data)
            if self.counters is not None:
                self.counters.messages_sent += len(out)
                self.counters.bytes_sent += len(data)
