"""Key routing: the stable key hash (PROTOCOL.md §15.2) and the hash ring (§16.6).

``stable_hash(key)`` is xxh3-64 (seed 0) over the key's canonical bytes, so a key goes to the
same instance from Python as from Rust. The hash is this package's own pure-Python XXH3
(``volley.xxh3``); when the optional ``xxhash`` package (xxHash's C library) is installed it
is used instead (a short key costs microseconds in pure Python, a 1 KiB key about 0.3 ms; the C
library well under one): both give the same numbers. Canonical bytes are defined for:

- ``bytes`` (and ``bytearray``, ``memoryview``): the bytes themselves; ``str``: its UTF-8;
- ``bool``: one byte; ``None`` (Rust's ``()``): no bytes;
- a ``tuple`` of 1 to 6 keys: each element's canonical bytes after their length as a u32 LE.

A Python ``int`` has no width, so it is refused: hash its payload instead, for example
``stable_hash(U64.encode(7))`` for Rust's ``7u64`` (for numbers and plain data, the canonical
bytes are exactly the payload bytes).
"""

from __future__ import annotations

import bisect
import struct
from typing import Any, Sequence

from .xxh3 import xxh3_64

try:
    from xxhash import xxh3_64_intdigest as _fast_xxh3_64
except ImportError:  # the standard library is enough: the pure form below serves
    _fast_xxh3_64 = None


def xxh3(data: bytes, seed: int = 0) -> int:
    """XXH3-64 of ``data`` with ``seed``: the C library if installed, else the pure form."""
    if _fast_xxh3_64 is not None:
        return _fast_xxh3_64(data, seed)
    return xxh3_64(data, seed)

VNODES_PER_WEIGHT = 128
MAX_RING_WEIGHT = 64


def canonical_bytes(key: Any) -> bytes:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bool):
        return b"\x01" if key else b"\x00"
    if key is None:
        return b""
    if isinstance(key, tuple):
        if not 1 <= len(key) <= 6:
            raise TypeError(f"a tuple key has 1 to 6 elements, not {len(key)}")
        parts = []
        for k in key:
            b = canonical_bytes(k)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    if isinstance(key, int):
        raise TypeError("an int key has no width: hash its encoding, e.g. stable_hash(U64.encode(n))")
    raise TypeError(f"no stable hash for {type(key).__name__} (bytes, str, bool, None or a tuple of them)")


def stable_hash(key: Any) -> int:
    """The routing hash of ``key`` (§15.2): the same number in every language and process."""
    return xxh3(canonical_bytes(key))


class HashRing:
    """The consistent-hash ring of §16.6 over ``(address, weight)`` nodes, in list order."""

    def __init__(self, nodes: Sequence[tuple[str, int]]):
        points = []
        for i, (address, weight) in enumerate(nodes):
            name = address.encode()
            for v in range(VNODES_PER_WEIGHT * min(max(weight, 1), MAX_RING_WEIGHT)):
                points.append((xxh3(name, v), i))
        points.sort()
        self._points = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self.nodes = len(nodes)

    def node(self, h: int, skip=None) -> int | None:
        """The index of the node owning hash ``h``: the first point at or after it, wrapping
        around; nodes for which ``skip(index)`` is true are passed over (clockwise)."""
        n = len(self._points)
        if n == 0:
            return None
        start = bisect.bisect_left(self._points, h)
        for k in range(n):
            owner = self._owners[(start + k) % n]
            if skip is None or not skip(owner):
                return owner
        return None
