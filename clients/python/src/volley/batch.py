"""The batch path of ``Client.call_batch``: the requests' payloads, cut into BatchRequest
chunks (PROTOCOL.md §6.9), and one waiter for every chunk of the batch.

A batch is the client's path for many small items, so the work per item is kept in C: types
and lengths are checked with ``map``, each chunk's items are joined at once
(``proto.batch_request_frames``, written a frame at a time as the socket takes them), and
a BatchReply whose items all succeeded is taken whole (the decoder counts the failed ones).
Each chunk is a request with its own id (§7), but the connection's table holds the batch
itself under every one of them, and the batch has one future and one deadline timer: the
caller wakes once, when the last chunk has ended, rather than once per chunk. Nor does the
batch keep any object per chunk alive while it runs, which would set off the cyclic garbage
collector (see ``_edges``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from .codec import Method
from .errors import CallTimeoutError, CodecError, ProtocolViolationError, TooLargeError, error_for
from .proto import MAX_FRAME_LEN

# The outcome of a chunk whose items all succeeded: they are in ``BatchCall.items``.
WHOLE = object()


class Prepared:
    """A batch's requests, encoded and cut into chunks (before any connection is involved).

    ``payloads``: the payloads that can be sent; ``failed``: one slot per request, ``None``
    where its payload is among them, the exception it failed with otherwise (a value that does
    not encode, an item too large for a frame), or ``failed`` is ``None`` itself when every
    request went. ``size``: the one length of every payload, or ``None``. ``edges``: where
    each chunk starts in ``payloads``, then the end: chunk ``k`` is
    ``payloads[edges[k]:edges[k + 1]]``, and there are ``chunks`` of them."""

    def __init__(self, method: Method, requests: list[Any], per_chunk: int):
        room = chunk_room(method)
        self.failed: list[Any] | None = None
        try:
            self.payloads = method.request.encode_many(requests)
            self.size, longest = _sizes(self.payloads)
            fits = 4 + longest <= room
        except CodecError:
            fits = False
        if not fits:
            self.failed, self.payloads = _encoded_one_by_one(method, requests, room)
            self.size, longest = _sizes(self.payloads)
        self.edges = _edges(self.payloads, per_chunk, room, longest)
        self.chunks = len(self.edges) - 1


def chunk_room(method: Method) -> int:
    """Bytes of items one BatchRequest of ``method`` can carry in a frame (§5.2)."""
    return MAX_FRAME_LEN - (16 + len(method.names) + 2 + 255)


def _encoded_one_by_one(method: Method, requests: list[Any], room: int) -> tuple[list[Any], list[bytes]]:
    """Each request encoded alone, for a batch where some fail: the slots (``None`` or the
    exception) and the payloads that can go."""
    encode = method.request.encode
    failed: list[Any] = []
    payloads = []
    for r in requests:
        try:
            p = encode(r)
        except CodecError as e:
            failed.append(e)
            continue
        if 4 + len(p) > room:
            failed.append(TooLargeError(f"a batch item of {len(p)} bytes does not fit in a frame"))
            continue
        payloads.append(p)
        failed.append(None)
    return failed, payloads


def _sizes(payloads: list[bytes]) -> tuple[int | None, int]:
    """The one length every payload has (``None`` if they differ), and the longest. Counting
    the first length among all of them is a quicker pass in C than a set of them."""
    if not payloads:
        return None, 0
    lengths = list(map(len, payloads))
    first = lengths[0]
    if lengths.count(first) == len(lengths):
        return first, first
    return None, max(lengths)


def _edges(payloads: list[bytes], per_chunk: int, room: int, longest: int) -> list[int]:
    """Where each BatchRequest starts, then the end: at most ``per_chunk`` items and ``room``
    bytes each. Plain numbers rather than a pair per chunk: a batch keeps no container per
    chunk alive, as some hundreds of them would set off the cyclic garbage collector in the
    middle of the batch, and its pass over the batch's large lists (every item visited, far
    apart in memory) cost about a fifth of the batch's CPU."""
    n = len(payloads)
    if per_chunk * (4 + longest) <= room:  # no chunk can be too large
        edges = list(range(0, n, per_chunk))
        edges.append(n)
        return edges
    edges = [0]
    start, size = 0, 0
    for i, p in enumerate(payloads):
        need = 4 + len(p)
        if i > start and (i - start == per_chunk or size + need > room):
            edges.append(i)
            start, size = i, 0
        size += need
    if n:
        edges.append(n)
    return edges


class BatchCall:
    """The chunks of one batch on one connection: request ids ``rids``, and where each starts
    in the batch's payloads (``edges``, as ``Prepared`` has them). Writes them, keeps every
    chunk's outcome (``WHOLE`` when its items are in ``items``, else the BatchReply's items,
    or the exception the whole chunk ended with) and one future that completes when the last
    chunk has ended: an answer, the connection's end, the deadline, or the caller's
    cancellation, whichever comes first for each chunk, once.

    The connection's table of calls waiting (``Connection.pending``) holds the BatchCall under
    each of its chunks' ids: ``answer`` takes a chunk's BatchReply and ``fail`` a chunk's
    error; ``done`` and ``set_exception`` answer as the future of a single call does (an
    exception ends every chunk still waiting)."""

    def __init__(self, conn: Any, rids: list[int], edges: list[int]):
        self.future: asyncio.Future = conn.loop.create_future()
        self.conn = conn
        self.rids = rids
        self.edges = edges
        self.index = dict(zip(rids, range(len(rids))))
        self.outcomes: list[Any] = [None] * len(rids)
        self.left = len(rids)
        # Every item, in order, as chunks answer with all their items and none an error: the
        # result as it is when every chunk does (the common case, with no check per item).
        self.items: list[Any] = [None] * edges[-1]
        self.whole = 0  # chunks answered that way
        if not rids:
            self.future.set_result(None)
        conn.expect_batch(self)

    def done(self) -> bool:
        return self.future.done()

    def answer(self, rid: int, items: list[Any], failed: int) -> None:
        """The BatchReply to chunk ``rid``: its items, ``failed`` of them errors."""
        k = self.index[rid]
        start, end = self.edges[k], self.edges[k + 1]
        if failed == 0 and len(items) == end - start and self.outcomes[k] is None:
            self.items[start:end] = items
            self.whole += 1
            items = WHOLE  # the chunk's list is not kept: see _edges
        self._end(k, items)

    def fail(self, rid: int, error: BaseException) -> None:
        """Chunk ``rid`` ended with ``error`` (an error reply for the whole chunk, say)."""
        self._end(self.index[rid], error)

    def set_exception(self, error: BaseException) -> None:
        """Every chunk still waiting ends with ``error`` (the connection's end, the deadline)."""
        for k, outcome in enumerate(self.outcomes):
            if outcome is None:
                self._end(k, error)

    def _end(self, k: int, outcome: Any) -> None:
        if self.outcomes[k] is not None:
            return
        self.outcomes[k] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)

    async def run(self, frames: Iterable[bytes], deadline: float) -> None:
        """Writes ``frames`` (as the socket takes them) and returns once every chunk has
        ended; past ``deadline`` the chunks still waiting end with
        ``CallTimeoutError``. A caller that is cancelled forgets them all (each id is dropped
        and a ``Cancel`` sent, as for a single call)."""
        timer = self.conn.loop.call_at(deadline, self._expire)
        try:
            for frame in frames:
                if self.future.done():  # the connection ended, or the deadline passed
                    break
                await self.conn.writable()
                self.conn.write_frame(frame)
            await self.future
        except asyncio.CancelledError:
            self._forget_waiting()
            raise
        finally:
            timer.cancel()

    def _expire(self) -> None:
        self._forget_waiting()
        self.set_exception(CallTimeoutError("the call's deadline passed before an answer"))

    def _forget_waiting(self) -> None:
        for rid, outcome in zip(self.rids, self.outcomes):
            if outcome is None:
                self.conn.forget(rid, cancel=True)


def results(method: Method, prepared: Prepared, call: BatchCall) -> list[Any]:
    """One result per request, in order: the decoded reply, or the exception it ended with."""
    decoded = _decoded_all(method, call)
    failed = prepared.failed
    if failed is None:  # every request was sent
        return decoded
    for k, value in zip((i for i, r in enumerate(failed) if r is None), decoded):
        failed[k] = value
    return failed


def _decoded_all(method: Method, call: BatchCall) -> list[Any]:
    if call.whole == len(call.outcomes):  # every chunk answered with all its items, none failed
        try:
            return method.reply.decode_many(call.items)
        except CodecError:
            pass
    out: list[Any] = []
    for k in range(len(call.outcomes)):
        out += _decoded(method, _items(call, k))
    return out


def _items(call: BatchCall, k: int) -> list[Any]:
    """Chunk ``k``'s outcome as one result per item: its BatchReply's items, or the chunk's
    exception for each (missing items of a short reply fail, §6.10)."""
    start, end = call.edges[k], call.edges[k + 1]
    outcome, n = call.outcomes[k], end - start
    if outcome is WHOLE:
        return call.items[start:end]
    if isinstance(outcome, BaseException):
        return [outcome] * n
    items = list(outcome[:n])
    if len(items) < n:
        missing = ProtocolViolationError(f"the batch reply has {len(outcome)} items for {n} requests")
        items.extend([missing] * (n - len(items)))
    return items


def _decoded(method: Method, items: list[Any]) -> list[Any]:
    """Each item's result: the decoded reply, or the exception it ended with."""
    decode = method.reply.decode
    try:
        if set(map(type, items)) <= {bytes}:
            return method.reply.decode_many(items)
        return [decode(i) if type(i) is bytes else _failed(i) for i in items]
    except CodecError:
        return [_decoded_one(decode, i) for i in items]


def _failed(item: Any) -> BaseException:
    """An item's exception: the chunk's, or the item's own error ``(code, message)``."""
    return item if isinstance(item, BaseException) else error_for(*item)


def _decoded_one(decode, item: Any) -> Any:
    if type(item) is not bytes:
        return _failed(item)
    try:
        return decode(item)
    except CodecError as e:
        return e
