"""The incremental decoder: stream bytes in, whole frames' messages out (PROTOCOL.md §5, §6).

``feed`` takes bytes as they arrive, split anywhere; ``messages`` returns the messages of every
complete frame in the buffer (a frame is decoded and checked whole before any of its messages
is returned) and keeps the rest. A length prefix over the limit fails as soon as its 4 bytes are
in, without waiting for the body. Every violation raises ``WireError``.
"""

from __future__ import annotations

import struct

from .proto import (
    AUTH,
    BATCH_REPLY,
    BATCH_REQUEST,
    CANCEL,
    ERROR,
    FLAG_EXTENSIONS,
    GOAWAY,
    MAX_BATCH_ITEMS,
    MAX_FRAME_LEN,
    MAX_MESSAGES_PER_FRAME,
    MAX_TOKEN_LEN,
    NO_EXTENSIONS,
    PING,
    PONG,
    REPLY,
    REQUEST,
    STREAM_CREDIT,
    STREAM_END,
    STREAM_ITEM,
    STREAM_OPEN,
    WireError,
    parse_extensions,
)

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_ID_LEN = struct.Struct("<QI").unpack_from
_CODE_LEN = struct.Struct("<HI").unpack_from
_SHAPE_CREDIT_LEN = struct.Struct("<BII").unpack_from

TRUNCATED = "malformed message: message runs past the end of its frame"
BATCH_ITEM_PAST_END = "malformed message: batch item runs past the end of its message"


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        raise WireError(f"malformed message: {what} is not UTF-8") from None


class Decoder:
    """Frames and messages from a byte stream; limits as in §5.2 unless given."""

    def __init__(
        self,
        max_frame_len: int = MAX_FRAME_LEN,
        max_messages: int = MAX_MESSAGES_PER_FRAME,
        max_batch_items: int = MAX_BATCH_ITEMS,
    ):
        # The bytes not yet decoded, as they arrived: joined only once they hold a whole frame
        # (so a large frame arriving in many reads is copied once, not once per read).
        self.pieces: list[bytes] = []
        self.size = 0
        self.need = 4  # bytes before the next frame can be decoded (its prefix, then all of it)
        self.max_frame_len = max_frame_len
        self.max_messages = max_messages
        self.max_batch_items = max_batch_items

    def feed(self, data: bytes) -> None:
        if data:
            self.pieces.append(data if type(data) is bytes else bytes(data))
            self.size += len(data)

    def in_frame(self) -> bool:
        """Whether part of a frame is buffered (the stream may not end here)."""
        return self.size > 0

    def messages(self) -> list[tuple]:
        """The messages of every complete frame buffered, in order. A ``WireError`` carries
        the messages of the whole frames before the bad one in ``before`` (a server still
        answers those, §10)."""
        out: list[tuple] = []
        if self.size < self.need:
            return out
        b = self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
        pos, end = 0, len(b)
        self.need = 4
        try:
            while end - pos >= 4:
                n = _U32(b, pos)[0]
                if n == 0:
                    raise WireError("empty frame (a frame carries at least one message)", out)
                if n > self.max_frame_len:
                    raise WireError(f"frame of {n} bytes exceeds the limit of {self.max_frame_len} bytes", out)
                if end - pos < 4 + n:
                    self.need = 4 + n
                    break
                try:
                    out.extend(self.frame_in(b, pos + 4, pos + 4 + n))
                except WireError as e:
                    raise WireError(str(e), out) from None
                pos += 4 + n
        finally:
            rest = b[pos:] if pos else b
            self.pieces = [rest] if rest else []
            self.size = len(rest)
        return out

    def frame_in(self, b: bytes, start: int, end: int) -> list[tuple]:
        """The messages of the frame whose body is ``b[start:end]``."""
        kind = b[start]
        replies = (
            self._replies(b, start, end) if kind == REPLY
            else self._uniform_replies(b, start, end) if kind == BATCH_REPLY
            else self._items(b, start, end) if kind == STREAM_ITEM
            else None
        )
        return replies if replies is not None else self.frame(b[start:end])

    def _replies(self, b: bytes, pos: int, end: int) -> list[tuple] | None:
        """The messages of a frame made only of Replies (answers to single calls), read where
        they lie in ``b``: one unpack and one slice each; or ``None`` for any other frame (or
        a bad one), which ``frame`` then reads from a copy, with every check."""
        out = []
        append = out.append
        limit = self.max_messages
        while pos < end:
            if b[pos] != REPLY or len(out) == limit or pos + 13 > end:
                return None
            rid, n = _ID_LEN(b, pos + 1)
            stop = pos + 13 + n
            if stop > end:
                return None
            append((REPLY, rid, b[pos + 13 : stop]))
            pos = stop
        return out

    def _items(self, b: bytes, pos: int, end: int) -> list[tuple] | None:
        """``_replies`` for a frame of StreamItems (the layout of a Reply), Replies among
        them: a stream's items come in such frames. Kept apart so that a frame of replies
        pays nothing for streams."""
        out = []
        append = out.append
        limit = self.max_messages
        while pos < end:
            kind = b[pos]
            if (kind != STREAM_ITEM and kind != REPLY) or len(out) == limit or pos + 13 > end:
                return None
            rid, n = _ID_LEN(b, pos + 1)
            stop = pos + 13 + n
            if stop > end:
                return None
            append((kind, rid, b[pos + 13 : stop]))
            pos = stop
        return out

    def _uniform_replies(self, b: bytes, pos: int, end: int) -> list[tuple] | None:
        """The messages of a frame made only of BatchReplies whose items all succeeded with
        one size (a batch's answers), read where they lie in ``b``; or ``None`` for any other
        frame, which ``frame`` then reads from a copy, with every check."""
        out = []
        while pos < end:
            if len(out) == self.max_messages or b[pos] != BATCH_REPLY or pos + 13 > end:
                return None
            rid, count = _ID_LEN(b, pos + 1)
            uniform = _uniform_ok_items(b, pos + 13, count, end) if count <= self.max_batch_items else None
            if uniform is None:
                return None
            out.append((BATCH_REPLY, rid, uniform[0], 0))
            pos = uniform[1]
        return out

    def frame(self, body: bytes) -> list[tuple]:
        """The messages of one frame body."""
        out = []
        pos, end = 0, len(body)
        while pos < end:
            if len(out) == self.max_messages:
                raise WireError(f"frame carries more than {self.max_messages} messages")
            try:
                msg, pos = self.message(body, pos)
            except (struct.error, IndexError):
                raise WireError(TRUNCATED) from None
            if pos > end:
                raise WireError(TRUNCATED)
            out.append(msg)
        return out

    def message(self, b: bytes, pos: int) -> tuple[tuple, int]:
        kind = b[pos]
        pos += 1
        if kind == REPLY:
            rid, n = _ID_LEN(b, pos)
            pos += 12
            return (REPLY, rid, b[pos : pos + n]), _past(b, pos + n)
        if kind == REQUEST or kind == BATCH_REQUEST or kind == STREAM_OPEN:
            return self.addressed(kind, b, pos)
        if kind == STREAM_ITEM:
            rid, n = _ID_LEN(b, pos)
            pos += 12
            return (STREAM_ITEM, rid, b[pos : pos + n]), _past(b, pos + n)
        if kind == STREAM_END:
            return (STREAM_END, _U64(b, pos)[0]), pos + 8
        if kind == STREAM_CREDIT:
            rid, n = _ID_LEN(b, pos)
            return (STREAM_CREDIT, rid, n), pos + 12
        if kind == ERROR:
            rid = _U64(b, pos)[0]
            code, n = _CODE_LEN(b, pos + 8)
            pos += 14
            return (ERROR, rid, code, _utf8(b[pos : _past(b, pos + n)], "error message")), pos + n
        if kind == BATCH_REPLY:
            return self.batch_reply(b, pos)
        if kind in (CANCEL, PING, PONG):
            return (kind, _U64(b, pos)[0]), pos + 8
        if kind == GOAWAY:
            code, n = _CODE_LEN(b, pos)
            pos += 6
            return (GOAWAY, code, _utf8(b[pos : _past(b, pos + n)], "go-away message")), pos + n
        if kind == AUTH:
            n = _U16(b, pos)[0]
            if n > MAX_TOKEN_LEN:
                raise WireError(f"malformed message: auth token of {n} bytes (at most {MAX_TOKEN_LEN})")
            pos += 2
            return (AUTH, b[pos : _past(b, pos + n)]), pos + n
        raise WireError(f"unknown message kind 0x{kind:02x}")

    def addressed(self, kind: int, b: bytes, pos: int) -> tuple[tuple, int]:
        """Request, BatchRequest and StreamOpen: flags, id, names, extensions, then the
        payload(s) (a StreamOpen's shape and credit first)."""
        flags = b[pos]
        rid = _U64(b, pos + 1)[0]
        pos += 9
        s = b[pos]
        service = _utf8(b[pos + 1 : _past(b, pos + 1 + s)], "service name")
        pos += 1 + s
        m = b[pos]
        method = _utf8(b[pos + 1 : _past(b, pos + 1 + m)], "method name")
        pos += 1 + m
        ext = NO_EXTENSIONS
        if flags & FLAG_EXTENSIONS:
            x = _U16(b, pos)[0]
            ext = parse_extensions(b[pos + 2 : _past(b, pos + 2 + x)])
            pos += 2 + x
        if kind == REQUEST:
            n = _U32(b, pos)[0]
            pos += 4
            return (REQUEST, flags, rid, service, method, ext, b[pos : _past(b, pos + n)]), pos + n
        if kind == STREAM_OPEN:
            shape, credit, n = _SHAPE_CREDIT_LEN(b, pos)
            pos += 9
            payload = b[pos : _past(b, pos + n)]
            return (STREAM_OPEN, flags, rid, service, method, ext, shape, credit, payload), pos + n
        count = _U32(b, pos)[0]
        if count > self.max_batch_items:
            raise WireError(f"batch message carries more than {self.max_batch_items} items")
        pos += 4
        items = []
        end = len(b)
        for _ in range(count):
            if pos + 4 > end:
                raise WireError(BATCH_ITEM_PAST_END)
            n = _U32(b, pos)[0]
            pos += 4
            if pos + n > end:
                raise WireError(BATCH_ITEM_PAST_END)
            items.append(b[pos : pos + n])
            pos += n
        return (BATCH_REQUEST, flags, rid, service, method, ext, items), pos

    def batch_reply(self, b: bytes, pos: int) -> tuple[tuple, int]:
        """Items as ``bytes`` (ok) or ``(code, message)`` (error), and how many are errors (so
        that a reply without any is taken whole, with no check per item). The loop is the batch
        path's cost per item, so it leans on ``struct`` raising at the frame's end rather
        than checking first (``frame`` turns that into the truncation error)."""
        rid, count = _ID_LEN(b, pos)
        if count > self.max_batch_items:
            raise WireError(f"batch message carries more than {self.max_batch_items} items")
        pos += 12
        end = len(b)
        uniform = _uniform_ok_items(b, pos, count, end)
        if uniform is not None:
            return (BATCH_REPLY, rid, uniform[0], 0), uniform[1]
        items: list = []
        failed = 0
        append = items.append
        u32, code_len = _U32, _CODE_LEN
        for _ in range(count):
            status = b[pos]
            if status == 0:
                stop = pos + 5 + u32(b, pos + 1)[0]
                if stop > end:
                    raise WireError(BATCH_ITEM_PAST_END)
                append(b[pos + 5 : stop])
            elif status == 1:
                code, n = code_len(b, pos + 1)
                stop = pos + 7 + n
                if stop > end:
                    raise WireError(BATCH_ITEM_PAST_END)
                append((code, _utf8(b[pos + 7 : stop], "error message")))
                failed += 1
            else:
                raise WireError(f"malformed message: unknown batch item status 0x{status:02x}")
            pos = stop
        return (BATCH_REPLY, rid, items, failed), pos


def _uniform_ok_items(b: bytes, pos: int, count: int, end: int) -> tuple[list[bytes], int] | None:
    """The items of a BatchReply whose items all succeeded with payloads of one size (the
    usual reply to a batch of numbers, ids or hashes), cut in C by ``struct``; or ``None``
    when the items are not all alike (then the general loop reads them). Returns the items
    and where the message ends. This runs once per chunk of a batch: it is kept to a few
    operations, each over all the items at once."""
    if count == 0:
        return [], pos
    if pos + 5 > end or b[pos] != 0:
        return None
    n = _U32(b, pos + 1)[0]
    stride = 5 + n
    stop = pos + count * stride
    if stop > end:
        return None
    status, len0, len1, len2, len3, cut, pieces = _SHAPES.get(n << 17 | count) or _shape(n, count)
    # Every item's status byte and length equal the first's: each of the five header bytes,
    # taken at the stride, is one repeated byte.
    if (
        b[pos:stop:stride] != status
        or b[pos + 1 : stop : stride] != len0
        or b[pos + 2 : stop : stride] != len1
        or b[pos + 3 : stop : stride] != len2
        or b[pos + 4 : stop : stride] != len3
    ):
        return None
    if cut is not None:
        return list(cut.unpack_from(b, pos)), stop
    items: list[bytes] = []
    for cut, at in pieces:
        items += cut.unpack_from(b, pos + at)
    return items, stop


# The shapes of uniform replies seen lately (a few: a client's batches mostly share one).
_SHAPES: dict[int, tuple] = {}
# Items per struct: each compiled format stays small.
_PIECE = 1024


def _shape(n: int, count: int) -> tuple:
    """For a reply of ``count`` successful items of ``n`` bytes: what each of the five bytes
    before an item (status 0, length ``n``), taken at the stride, must read; then the structs
    that cut the items (5 bytes skipped, ``n`` taken, repeated): the one struct when a single
    one cuts them all, else ``None`` and the structs, each with its offset. The struct slices
    in C, some five times faster than a slice per item in Python."""
    if len(_SHAPES) >= 16:
        _SHAPES.clear()
    checks = [bytes([h]) * count for h in b"\x00" + struct.pack("<I", n)]
    pieces = []
    for at in range(0, count, _PIECE):
        k = min(_PIECE, count - at)
        pieces.append((struct.Struct(f"<{k * f'5x{n}s'}"), at * (5 + n)))
    whole = pieces[0][0] if len(pieces) == 1 else None
    shape = _SHAPES[n << 17 | count] = (*checks, whole, pieces)
    return shape


def _past(b: bytes, end: int) -> int:
    """``end``, if it lies within ``b``; otherwise the message is truncated."""
    if end > len(b):
        raise WireError(TRUNCATED)
    return end
