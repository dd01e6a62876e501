"""The package's pure-Python XXH3-64 against the Rust implementation (`volley conformance
hash`, the volley crate's stable hash and the hash ring's seeded form) on random inputs of
every length class XXH3 treats apart, and against PROTOCOL.md §15.3's vectors. The pure form
is called directly, so it is what is tested even where the optional C ``xxhash`` is installed."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from volley import hashing
from volley.xxh3 import xxh3_64

from conftest import CONFORMANCE, volley_bin

# (low, high) lengths of each code path: 0, 1-3, 4-8, 9-16, 17-128, 129-240, one partial
# block (241-1024), then several 1024-byte blocks with and without a partial last stripe.
CLASSES = [(0, 0), (1, 3), (4, 8), (9, 16), (17, 128), (129, 240), (241, 1024), (1025, 5000)]
# Edges where XXH3 switches paths or block counts; each is hashed too.
EDGES = [1, 3, 4, 8, 9, 16, 17, 32, 33, 64, 65, 96, 97, 128, 129, 240, 241, 1024, 1025, 2048, 2049, 3072]


def rust_hashes(inputs: list[bytes], seed: int) -> list[int]:
    out = subprocess.run(
        [volley_bin(), "conformance", "hash", "--seed", str(seed)],
        input="".join(b.hex() + "\n" for b in inputs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [int(line, 16) for line in out.stdout.split()]


def inputs(rng: random.Random) -> list[bytes]:
    lengths = EDGES + [rng.randint(lo, hi) for lo, hi in CLASSES for _ in range(12)]
    return [rng.randbytes(n) for n in lengths]


@pytest.mark.parametrize("seed", [0, 1, 127, 8191, "random"])
def test_the_pure_hash_agrees_with_rust_on_random_inputs_of_every_length(seed):
    rng = random.Random()
    if seed == "random":
        seed = rng.getrandbits(64)
    data = inputs(rng)
    want = rust_hashes(data, seed)
    assert len(want) == len(data)
    for d, w in zip(data, want):
        assert xxh3_64(d, seed) == w, f"length {len(d)}, seed {seed}: {d.hex()}"


def test_the_pure_hash_gives_the_vectors_of_the_protocol():
    for case in json.loads((CONFORMANCE / "routing.json").read_text())["stable_hash"]:
        assert f"{xxh3_64(bytes.fromhex(case['canonical'])):016x}" == case["hash"]


def test_the_package_hash_is_the_pure_one_or_agrees_with_it():
    rng = random.Random(7)
    for n in EDGES:
        d = rng.randbytes(n)
        assert hashing.xxh3(d, n) == xxh3_64(d, n)


def test_a_seed_outside_u64_is_refused():
    with pytest.raises(ValueError, match="u64"):
        xxh3_64(b"x", -1)
