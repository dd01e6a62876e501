"""XXH3-64 (xxHash 0.8, whose output is frozen) in pure Python, seeded and unseeded.

The stable key hash (PROTOCOL.md §15.2) and the hash ring (§16.6) are defined on it, and the
package keeps to the standard library, so it carries its own copy. It follows the reference C
code path by path, since XXH3 treats inputs of 0, 1–3, 4–8, 9–16, 17–128, 129–240 and longer
lengths differently; the tests check every path against the Rust implementation. Python's
integers have no width, so every step that wraps in C masks to 64 bits here.
"""

from __future__ import annotations

import struct

_M64 = 0xFFFFFFFFFFFFFFFF
_M32 = 0xFFFFFFFF

PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
PRIME_MX1 = 0x165667919E3779F9
PRIME_MX2 = 0x9FB21C651E98DF25

SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_SECRET_SIZE_MIN = 136
_STRIPE = 64
_STRIPES_PER_BLOCK = (len(SECRET) - _STRIPE) // 8
_BLOCK = _STRIPE * _STRIPES_PER_BLOCK

_u32 = struct.Struct("<I").unpack_from
_u64 = struct.Struct("<Q").unpack_from
_u64x8 = struct.Struct("<8Q").unpack_from
_u64x24 = struct.Struct("<24Q")


def _avalanche_xxh64(h: int) -> int:
    h = ((h ^ (h >> 33)) * PRIME64_2) & _M64
    h = ((h ^ (h >> 29)) * PRIME64_3) & _M64
    return h ^ (h >> 32)


def _avalanche(h: int) -> int:
    h = ((h ^ (h >> 37)) * PRIME_MX1) & _M64
    return h ^ (h >> 32)


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _mul128_fold64(a: int, b: int) -> int:
    p = a * b
    return (p ^ (p >> 64)) & _M64


def _mix16(data, i: int, s: int, seed: int, secret: bytes = SECRET) -> int:
    lo = _u64(data, i)[0] ^ ((_u64(secret, s)[0] + seed) & _M64)
    hi = _u64(data, i + 8)[0] ^ ((_u64(secret, s + 8)[0] - seed) & _M64)
    return _mul128_fold64(lo, hi)


def _len_1_to_3(data, n: int, seed: int) -> int:
    combined = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
    bitflip = ((_u32(SECRET, 0)[0] ^ _u32(SECRET, 4)[0]) + seed) & _M64
    return _avalanche_xxh64(combined ^ bitflip)


def _len_4_to_8(data, n: int, seed: int) -> int:
    low = seed & _M32
    swapped = int.from_bytes(low.to_bytes(4, "little"), "big")
    seed ^= swapped << 32
    in1, in2 = _u32(data, 0)[0], _u32(data, n - 4)[0]
    bitflip = ((_u64(SECRET, 8)[0] ^ _u64(SECRET, 16)[0]) - seed) & _M64
    h = (in2 + (in1 << 32)) ^ bitflip
    # rrmxmx: a stronger avalanche for these inputs, which fill the word only partly.
    h ^= _rotl64(h, 49) ^ _rotl64(h, 24)
    h = (h * PRIME_MX2) & _M64
    h ^= (h >> 35) + n
    h = (h * PRIME_MX2) & _M64
    return h ^ (h >> 28)


def _len_9_to_16(data, n: int, seed: int) -> int:
    flip1 = ((_u64(SECRET, 24)[0] ^ _u64(SECRET, 32)[0]) + seed) & _M64
    flip2 = ((_u64(SECRET, 40)[0] ^ _u64(SECRET, 48)[0]) - seed) & _M64
    lo = _u64(data, 0)[0] ^ flip1
    hi = _u64(data, n - 8)[0] ^ flip2
    swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
    return _avalanche((n + swapped + hi + _mul128_fold64(lo, hi)) & _M64)


def _len_17_to_128(data, n: int, seed: int) -> int:
    acc = n * PRIME64_1
    if n > 32:
        if n > 64:
            if n > 96:
                acc += _mix16(data, 48, 96, seed) + _mix16(data, n - 64, 112, seed)
            acc += _mix16(data, 32, 64, seed) + _mix16(data, n - 48, 80, seed)
        acc += _mix16(data, 16, 32, seed) + _mix16(data, n - 32, 48, seed)
    acc += _mix16(data, 0, 0, seed) + _mix16(data, n - 16, 16, seed)
    return _avalanche(acc & _M64)


def _len_129_to_240(data, n: int, seed: int) -> int:
    acc = n * PRIME64_1
    for i in range(8):
        acc += _mix16(data, 16 * i, 16 * i, seed)
    acc = _avalanche(acc & _M64)
    for i in range(8, n // 16):
        acc += _mix16(data, 16 * i, 16 * (i - 8) + 3, seed)
    acc += _mix16(data, n - 16, _SECRET_SIZE_MIN - 17, seed)
    return _avalanche(acc & _M64)


def _accumulate_512(acc: list[int], data, i: int, keys: tuple) -> None:
    """One stripe of 64 bytes at ``data[i:]``, keyed by the eight secret words ``keys``."""
    values = _u64x8(data, i)
    for lane in range(8):
        v = values[lane]
        k = v ^ keys[lane]
        acc[lane ^ 1] += v
        acc[lane] += (k & _M32) * (k >> 32)
    for lane in range(8):
        acc[lane] &= _M64


def _long(data, n: int, secret: bytes) -> int:
    acc = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1]
    stripe_keys = [_u64x8(secret, 8 * s) for s in range(_STRIPES_PER_BLOCK)]
    scramble_keys = _u64x8(secret, len(secret) - _STRIPE)
    blocks = (n - 1) // _BLOCK
    for b in range(blocks):
        base = b * _BLOCK
        for s in range(_STRIPES_PER_BLOCK):
            _accumulate_512(acc, data, base + s * _STRIPE, stripe_keys[s])
        for lane in range(8):
            a = acc[lane]
            acc[lane] = ((a ^ (a >> 47) ^ scramble_keys[lane]) * PRIME32_1) & _M64
    base = blocks * _BLOCK
    for s in range(((n - 1) - base) // _STRIPE):
        _accumulate_512(acc, data, base + s * _STRIPE, stripe_keys[s])
    _accumulate_512(acc, data, n - _STRIPE, _u64x8(secret, len(secret) - _STRIPE - 7))
    result = (n * PRIME64_1) & _M64
    for i in range(4):
        result += _mul128_fold64(acc[2 * i] ^ _u64(secret, 11 + 16 * i)[0], acc[2 * i + 1] ^ _u64(secret, 19 + 16 * i)[0])
    return _avalanche(result & _M64)


def _seeded_secret(seed: int) -> bytes:
    words = list(_u64x24.unpack(SECRET))
    for i in range(0, 24, 2):
        words[i] = (words[i] + seed) & _M64
        words[i + 1] = (words[i + 1] - seed) & _M64
    return _u64x24.pack(*words)


def xxh3_64(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """``XXH3_64bits_withSeed(data, seed)`` (seed 0 is plain ``XXH3_64bits``), as an int."""
    if not 0 <= seed <= _M64:
        raise ValueError(f"an xxh3 seed is a u64, not {seed}")
    n = len(data)
    if n == 0:
        return _avalanche_xxh64(seed ^ _u64(SECRET, 56)[0] ^ _u64(SECRET, 64)[0])
    if n <= 3:
        return _len_1_to_3(data, n, seed)
    if n <= 8:
        return _len_4_to_8(data, n, seed)
    if n <= 16:
        return _len_9_to_16(data, n, seed)
    if n <= 128:
        return _len_17_to_128(data, n, seed)
    if n <= 240:
        return _len_129_to_240(data, n, seed)
    return _long(data, n, SECRET if seed == 0 else _seeded_secret(seed))
