"""The wire format of PROTOCOL.md, as plain functions over bytes (no sockets, no clock).

Messages are built as ``bytes`` by the ``*_message`` functions and put into frames by
``frames``; the ``Decoder`` takes the bytes of a stream in any pieces and returns the messages
of every complete frame, as tuples whose first element is the kind:

    (REQUEST, flags, id, service, method, extensions, payload)
    (BATCH_REQUEST, flags, id, service, method, extensions, [payload, ...])
    (REPLY, id, payload)                (ERROR, id, code, message)
    (BATCH_REPLY, id, [item, ...], failed)   item: payload (bytes) or (code, message);
                                        failed: how many items are errors
    (CANCEL, id)   (PING, token)   (PONG, token)   (GOAWAY, code, message)   (AUTH, token)
    (STREAM_OPEN, flags, id, service, method, extensions, shape, credit, payload)
    (STREAM_ITEM, id, payload)   (STREAM_END, id)   (STREAM_CREDIT, id, credit)

``extensions`` is an ``Extensions`` (or ``NO_EXTENSIONS``). Every limit of §5.2 is checked and
every violation of §10 raises ``WireError`` with the reason a GoAway carries.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain, islice
from typing import Iterator

MAGIC = b"VLLY"
VERSION = 1
PREAMBLE_LEN = 8
FEATURE_EXTENSIONS = 0x01
FEATURE_STREAMS = 0x02

REQUEST, REPLY, ERROR, CANCEL, PING, PONG, GOAWAY, BATCH_REQUEST, BATCH_REPLY, AUTH = range(1, 11)
# Streams (§6.12-§6.15): a block of their own, used only toward a server announcing STREAMS.
STREAM_OPEN, STREAM_ITEM, STREAM_END, STREAM_CREDIT = range(0x10, 0x14)
# The shape byte of a StreamOpen: one request and items back, items and one reply, both ways.
SHAPE_SERVER, SHAPE_CLIENT, SHAPE_BOTH = 1, 2, 3

FLAG_IDEMPOTENT = 0x01
FLAG_EXTENSIONS = 0x02
EXT_DEADLINE = 0x01
EXT_TRACEPARENT = 0x02

MAX_FRAME_LEN = 16 * 1024 * 1024
MAX_MESSAGES_PER_FRAME = 4096
MAX_BATCH_ITEMS = 65536
MAX_TOKEN_LEN = 4096
MAX_DEADLINE_MICROS = 0xFFFFFFFF
# Longest error or go-away message this side sends (§6.4): longer ones are cut.
MAX_TEXT_LEN = 65536
# A frame is closed once its body reaches this, so the peer can start on a large bundle early.
SOFT_FRAME_LEN = 256 * 1024


def preamble(features: int = 0) -> bytes:
    """The 8 bytes each side sends first (§4.1)."""
    return MAGIC + bytes([VERSION, features, 0, 0])


class WireError(Exception):
    """The peer broke the protocol (§10): the connection cannot be trusted any more.

    ``before`` holds the messages of the whole frames decoded before the violation."""

    def __init__(self, reason: str, before: list | None = None):
        super().__init__(reason)
        self.before = before or []


def check_preamble(b: bytes) -> int:
    """The features byte of a peer's preamble, or ``WireError`` for a bad magic or version."""
    if b[:4] != MAGIC:
        raise WireError(f"bad preamble magic {list(b[:4])} (not a Volley peer?)")
    if b[4] != VERSION:
        raise WireError(f"unsupported protocol version {b[4]} (this side speaks {VERSION})")
    return b[5]


@dataclass(frozen=True)
class Extensions:
    """The request extensions this package knows (§6.2.2)."""

    deadline_micros: int | None = None
    trace_parent: bytes | None = None

    def __bool__(self) -> bool:
        return self.deadline_micros is not None or self.trace_parent is not None

    def encode(self) -> bytes:
        """The block: u16 length, then the entries."""
        body = b""
        if self.deadline_micros is not None:
            if not 0 <= self.deadline_micros <= MAX_DEADLINE_MICROS:
                # §6.2.2: a budget the field cannot hold is left out, never cut to fit.
                raise ValueError(f"a deadline of {self.deadline_micros} µs does not fit the field (a u32)")
            body += struct.pack("<BBI", EXT_DEADLINE, 4, self.deadline_micros)
        if self.trace_parent is not None:
            body += bytes([EXT_TRACEPARENT, len(self.trace_parent)]) + self.trace_parent
        return struct.pack("<H", len(body)) + body


NO_EXTENSIONS = Extensions()


def parse_extensions(block: bytes) -> Extensions:
    """The entries of a block (without its length): unknown types are skipped, a known type
    with a bad value is ignored, an entry past the block's end is a ``WireError``."""
    deadline = trace = None
    i, n = 0, len(block)
    while i < n:
        if i + 2 > n or i + 2 + block[i + 1] > n:
            raise WireError("malformed message: extension entry runs past the end of its block")
        kind, size = block[i], block[i + 1]
        value = block[i + 2 : i + 2 + size]
        if kind == EXT_DEADLINE and size == 4:
            deadline = struct.unpack("<I", value)[0]
        elif kind == EXT_TRACEPARENT and size == 26 and value[0] == 0:
            if any(value[1:17]) and any(value[17:25]):
                trace = bytes(value)
        i += 2 + size
    return Extensions(deadline, trace) if deadline is not None or trace is not None else NO_EXTENSIONS


def name_bytes(name: str, what: str) -> bytes:
    b = name.encode()
    if len(b) > 255:
        raise ValueError(f"{what} name of {len(b)} bytes (at most 255)")
    return bytes([len(b)]) + b


def addressed(kind: int, flags: int, rid: int, names: bytes, ext: Extensions | None) -> bytes:
    """kind, flags, id, service and method (``names``: as ``name_bytes`` of each), extensions."""
    head = struct.pack("<BBQ", kind, flags | (FLAG_EXTENSIONS if ext else 0), rid) + names
    return head + ext.encode() if ext else head


_U32 = struct.Struct("<I")
_ID = struct.Struct("<BQ")


def request_message(rid: int, flags: int, names: bytes, payload: bytes, ext: Extensions | None = None) -> bytes:
    return b"".join((addressed(REQUEST, flags, rid, names, ext), _U32.pack(len(payload)), payload))


def batch_request_message(
    rid: int, flags: int, names: bytes, payloads: list[bytes], ext: Extensions | None = None
) -> bytes:
    pack = _U32.pack
    head = addressed(BATCH_REQUEST, flags, rid, names, ext) + pack(len(payloads))
    sizes = set(map(len, payloads))
    if len(sizes) == 1:
        # Items of one size (numbers, ids, hashes ...) share their length prefix: one join.
        prefix = pack(sizes.pop())
        return head + prefix + prefix.join(payloads)
    # Each item's length, then the item: interleaved at C speed (this is the per-item cost).
    return head + b"".join(chain.from_iterable(zip(map(pack, map(len, payloads)), payloads)))


_HEAD = struct.Struct("<BBQ")


def batch_request_frames(
    rids: list[int],
    flags: int,
    names: bytes,
    payloads: list[bytes],
    edges: list[int],
    size: int | None,
    ext: Extensions | None = None,
) -> Iterator[bytes]:
    """One BatchRequest per chunk ``payloads[edges[k]:edges[k + 1]]``, with its id ``rids[k]``,
    cut into frames as ``frames`` cuts them; yields each frame as it is made, so a large batch
    is written while the rest is encoded, and no buffer holds all of it. ``size``: the length
    of every payload, when they share one."""
    pack = _U32.pack
    prefix = b"" if size is None else pack(size)
    head = _HEAD.pack
    kind, flags = BATCH_REQUEST, flags | (FLAG_EXTENSIONS if ext else 0)
    tail = names + ext.encode() if ext else names
    fixed = _HEAD.size + len(tail) + 4
    parts: list[bytes] = [b""]  # the frame's length goes first, once it is known
    body = count = 0
    for rid, start, end in zip(rids, edges, islice(edges, 1, None)):
        chunk = payloads[start:end]
        if size is not None:
            # Items of one size (numbers, ids, hashes ...) share their length prefix: one join.
            items = prefix.join(chunk)
        else:
            # Each item's length, then the item: interleaved at C speed.
            items = b"".join(chain.from_iterable(zip(map(pack, map(len, chunk)), chunk)))
        length = fixed + len(prefix) + len(items)
        if count and (count == MAX_MESSAGES_PER_FRAME or body + length > MAX_FRAME_LEN or body >= SOFT_FRAME_LEN):
            parts[0] = pack(body)
            yield b"".join(parts)
            parts, body, count = [b""], 0, 0
        parts += (head(kind, flags, rid), tail, pack(end - start), prefix, items)
        body += length
        count += 1
    if count:
        parts[0] = pack(body)
        yield b"".join(parts)


def reply_message(rid: int, payload: bytes) -> bytes:
    return b"".join((struct.pack("<BQI", REPLY, rid, len(payload)), payload))


def _text(message: str) -> bytes:
    b = message.encode()
    if len(b) > MAX_TEXT_LEN:
        b = b[:MAX_TEXT_LEN].decode(errors="ignore").encode()
    return b


def error_message(rid: int, code: int, message: str) -> bytes:
    t = _text(message)
    return struct.pack("<BQHI", ERROR, rid, code, len(t)) + t


def batch_reply_message(rid: int, items: list[tuple]) -> bytes:
    """``items``: ``(True, payload)`` or ``(False, code, message)`` each, in request order."""
    parts = [struct.pack("<BQI", BATCH_REPLY, rid, len(items))]
    ok = struct.Struct("<BI").pack
    for item in items:
        if item[0]:
            parts.append(ok(0, len(item[1])))
            parts.append(item[1])
        else:
            t = _text(item[2])
            parts.append(struct.pack("<BHI", 1, item[1], len(t)))
            parts.append(t)
    return b"".join(parts)


def stream_open_message(
    rid: int, flags: int, names: bytes, shape: int, credit: int, payload: bytes, ext: Extensions | None = None
) -> bytes:
    """Opens stream ``rid`` (§6.12): ``credit`` items the server may send before more credit;
    ``payload`` is a server stream's request (empty for the other shapes)."""
    head = addressed(STREAM_OPEN, flags, rid, names, ext)
    return b"".join((head, _SHAPE_CREDIT_LEN.pack(shape, credit, len(payload)), payload))


_SHAPE_CREDIT_LEN = struct.Struct("<BII")
_ITEM = struct.Struct("<BQI")
_CREDIT = struct.Struct("<BQI")


def stream_item_message(rid: int, payload: bytes) -> bytes:
    return _ITEM.pack(STREAM_ITEM, rid, len(payload)) + payload


def stream_end_message(rid: int) -> bytes:
    return _ID.pack(STREAM_END, rid)


def stream_credit_message(rid: int, credit: int) -> bytes:
    return _CREDIT.pack(STREAM_CREDIT, rid, credit)


def cancel_message(rid: int) -> bytes:
    return _ID.pack(CANCEL, rid)


def ping_message(token: int) -> bytes:
    return _ID.pack(PING, token)


def pong_message(token: int) -> bytes:
    return _ID.pack(PONG, token)


def goaway_message(code: int, message: str) -> bytes:
    t = _text(message)
    return struct.pack("<BHI", GOAWAY, code, len(t)) + t


def auth_message(token: bytes) -> bytes:
    if len(token) > MAX_TOKEN_LEN:
        raise ValueError(f"token of {len(token)} bytes (at most {MAX_TOKEN_LEN})")
    return struct.pack("<BH", AUTH, len(token)) + token


def frames(messages: list[bytes]) -> list[bytes]:
    """The messages cut into frames (§5): at most 4096 messages and 16 MiB of body each, a
    frame closed once its body passes 256 KiB. Each returned element is one whole frame."""
    out: list[bytes] = []
    body: list[bytes] = []
    size = 0
    for m in messages:
        if body and (len(body) == MAX_MESSAGES_PER_FRAME or size + len(m) > MAX_FRAME_LEN or size >= SOFT_FRAME_LEN):
            out.append(_U32.pack(size) + b"".join(body))
            body, size = [], 0
        body.append(m)
        size += len(m)
    if body:
        out.append(_U32.pack(size) + b"".join(body))
    return out
