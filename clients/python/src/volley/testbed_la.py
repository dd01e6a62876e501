"""The LA role of ``volley testbed`` (its linguistic analysis service) in Python, so that a
testbed run proves a mixed Rust and Python system end to end: ``volley testbed --processes
--codec general --python-role la`` starts this module in place of the Rust role process.

It takes the role process's arguments (``--registry``, ``--listen``, ``--codec`` ...; the rest
it does not need), serves ``la``/``analyze`` and ``la``/``stats`` in the general (JSON) tier,
registers with the testbed's controller, prints ``ready ADDRESS`` and serves until its stdin
closes. The analysis is the Rust one (crates/volley-testbed's analyzer) rule for rule: the
testbed fails if any answer differs from its other configurations'.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import re
import sys

from .codec import JSON, Method
from .server import Server

STOP_WORDS = sorted(
    "a about after all also an and any are as at be been but by can could do for from had has have he her "
    "his if in into is it its no not of on one or our she so some than that the their them then there these "
    "they this to up was we were what when which who will with would you".split()
)

ANALYZE = Method("la", "analyze", JSON, JSON)
STATS = Method("la", "stats", JSON, JSON)
# A word is a maximal run of alphanumeric characters (Rust's char::is_alphanumeric).
_SEPARATORS = re.compile(r"[\W_]+")


def is_stop_word(word: str) -> bool:
    i = bisect.bisect_left(STOP_WORDS, word)
    return i < len(STOP_WORDS) and STOP_WORDS[i] == word


def stem(word: str) -> str:
    """Strips one inflectional suffix, keeping at least three letters (as the Rust stemmer)."""
    n = len(word.encode())  # the Rust rules count bytes

    def long_enough(suffix: str) -> bool:
        return n >= len(suffix) + 3

    if word.endswith("ies") and long_enough("ies"):
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    for suffix in ("ing", "ed", "ly"):
        if word.endswith(suffix) and long_enough(suffix):
            return word[: -len(suffix)]
    for sibilant in ("ches", "shes", "xes", "zes"):
        if word.endswith(sibilant) and long_enough("es"):
            return word[:-2]
    if word.endswith("s") and not word.endswith("ss") and not word.endswith("us") and long_enough("s"):
        return word[:-1]
    return word


def term_frequencies(text: str) -> tuple[list[list], int]:
    """The distinct terms of ``text`` with their counts, sorted, and its length in terms."""
    terms = [stem(w) for w in (w.lower() for w in _SEPARATORS.split(text) if w) if not is_stop_word(w)]
    counts: dict[str, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return [[t, counts[t]] for t in sorted(counts)], len(terms)


def analyze(req: dict) -> dict:
    docs = []
    for d in req["docs"]:
        terms, length = term_frequencies(d["text"])
        docs.append({"id": d["id"], "len": length, "terms": terms})
    return {"docs": docs}


async def serve(args: argparse.Namespace) -> None:
    server = Server()
    server.handle(ANALYZE, analyze)
    server.handle(STATS, lambda _: {
        "messages": server.counters.messages_sent + server.counters.messages_received,
        "bytes": server.counters.bytes_sent + server.counters.bytes_received,
    })
    address = await server.listen(args.listen)
    await server.register(args.registry)
    print(f"ready {address}", flush=True)
    # Until the testbed closes our stdin (or dies).
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.shutdown()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m volley.testbed_la", description=__doc__.split("\n\n")[0])
    p.add_argument("--role", default="la")
    p.add_argument("--registry", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--codec", default="general")
    args, _ = p.parse_known_args(argv)
    if args.role != "la":
        p.error(f"this module serves the la role only, not {args.role}")
    if args.codec != "general":
        p.error("the Python LA speaks the general (JSON) tier only: run the testbed with --codec general")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
