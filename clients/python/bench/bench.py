"""Throughput of the Python client against the Rust echo server, next to a bare-socket baseline.

    python clients/python/bench/bench.py [--volley target/release/volley] [--rounds 5]
        [--payload 16] [--baseline OTHER/clients/python/src]

All on one connection, measurements interleaved round by round, medians reported:

- ``concurrent``: ``Client.call`` with ``--window`` (100) calls in flight at a time
  (``asyncio.gather`` of that many, again and again);
- ``sequential``: one ``await Client.call`` after the other;
- ``batch``: ``Client.call_batch`` of 100,000 items (chunks of 128), five in a row;
- ``stream``: the echo server's ``echo``/``repeat`` server stream of 100,000 items, five in a
  row, read with ``async for`` through the default window (not measured for a baseline without
  streams);
- ``socket``: the floor — the same bytes as the batch's frames written to a plain asyncio TCP
  echo server (a Python process of its own, a blocking loop) and read back, five times, with no
  protocol work at all: what a bare Python socket loop moves.

Payloads are ``--payload`` bytes (16). The figures are calls (items) per second;
``batch / socket`` is the cost of the protocol on the batch path. ``batch CPU`` is this
process's CPU time per batch item, and the ``CPU µs`` rows the same per call: the figures other
processes' load disturbs least (on a loaded machine the rates mostly measure how soon the
echo server and this process get a core back).

``--baseline SRC`` measures a second copy of the package (its ``src`` directory, say one
``git archive`` of an older commit unpacked) in the same run: each round runs both, one after
the other against the same echo server, each in a process of its own, and the table puts them
side by side (``after / before``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCH = 100_000
# Batches (and floor passes) per measurement: one batch takes some tens of milliseconds, less
# than a time slice lost to another process on a loaded machine.
REPEAT = 5
CALLS = 20_000
SEQUENTIAL = 5_000


def start_echo(binary: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([binary, "serve-echo", "--listen", "tcp://127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r"serving \S+ on (\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"volley serve-echo printed {line!r}")
    return proc, m.group(1)


async def concurrent(volley, client, item: bytes, window: int) -> tuple[float, float]:
    """Calls per second, and this process's CPU time per call in microseconds."""
    echo = volley.Method("echo", "echo")
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(CALLS // window):
        replies = await asyncio.gather(*[client.call(echo, item) for _ in range(window)])
    assert replies[-1] == item
    n = CALLS // window * window
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n * 1e6


async def sequential(volley, client, item: bytes) -> tuple[float, float]:
    """Calls per second, and this process's CPU time per call in microseconds."""
    echo = volley.Method("echo", "echo")
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(SEQUENTIAL):
        reply = await client.call(echo, item)
    assert reply == item
    return SEQUENTIAL / (time.perf_counter() - start), (time.process_time() - cpu) / SEQUENTIAL * 1e6


async def batch(volley, client, item: bytes, repeat: int = REPEAT) -> tuple[float, float]:
    """Items per second, and this process's CPU time per item in microseconds (which other
    processes' load disturbs far less than the rate)."""
    echo = volley.Method("echo", "echo")
    items = [item] * BATCH
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        results = await client.call_batch(echo, items)
        assert len(results) == BATCH and results[-1] == item
    cpu = time.process_time() - cpu
    return repeat * BATCH / (time.perf_counter() - start), cpu / (repeat * BATCH) * 1e6


async def stream(volley, client, item: bytes, repeat: int = REPEAT) -> tuple[float, float]:
    """Items per second through a server stream (the echo server's ``echo``/``repeat``:
    100,000 copies of the item, the default window), and this process's CPU time per item."""
    repeat_method = volley.Method("echo", "repeat")
    request = BATCH.to_bytes(4, "little") + item
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        n = 0
        async for got in client.stream(repeat_method, request):
            n += 1
        assert n == BATCH and got == item
    cpu = time.process_time() - cpu
    return repeat * BATCH / (time.perf_counter() - start), cpu / (repeat * BATCH) * 1e6


def plain_echo_server() -> tuple[subprocess.Popen, int]:
    """A bare TCP echo server in a process of its own (as the Rust server runs apart; on a
    thread of this process it would compete for the GIL with the loop it is measured against).
    It is a blocking recv/sendall loop, nearly all of its time in the kernel, so the floor is
    what this process's event loop moves, not what the echo's does."""
    proc = subprocess.Popen([sys.executable, __file__, "--plain-echo"], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def serve_plain_echo() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        print(listener.getsockname()[1], flush=True)
        while True:
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(1 << 20):
                    conn.sendall(data)


async def socket_floor(proto, port: int, item: bytes) -> float:
    """The batch's bytes (its BatchRequest frames) through a plain socket and back."""
    names = proto.name_bytes("echo", "service") + proto.name_bytes("echo", "method")
    chunks = [proto.batch_request_message(i, 0, names, [item] * 128) for i in range(BATCH // 128)]
    data = b"".join(proto.frames(chunks))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    for _ in range(REPEAT):
        writer.write(data)
        await reader.readexactly(len(data))
    elapsed = time.perf_counter() - start
    writer.close()
    return REPEAT * (BATCH // 128 * 128) / elapsed


async def one_round(address: str, port: int, payload: int, window: int) -> dict[str, float]:
    """One round of every measurement, with the ``volley`` package first on ``sys.path``."""
    import volley
    from volley import proto

    item = b"x" * payload
    out: dict[str, float] = {}
    async with await volley.Client.connect(address) as client:
        await batch(volley, client, item, repeat=1)  # warm-up
        await sequential(volley, client, item)
        out["concurrent"], out["concurrent CPU µs"] = await concurrent(volley, client, item, window)
        out["sequential"], out["sequential CPU µs"] = await sequential(volley, client, item)
        out["batch"], out["batch CPU µs"] = await batch(volley, client, item)
        if hasattr(client, "stream"):  # a baseline from before streams has none
            out["stream"], out["stream CPU µs"] = await stream(volley, client, item)
    out["socket"] = await socket_floor(proto, port, item)
    return out


def child_round(src: str, args: argparse.Namespace, address: str, port: int) -> dict[str, float]:
    """One round in a process of its own, importing the package from ``src``."""
    cmd = [sys.executable, __file__, "--child", src, address, str(port), str(args.payload), str(args.window)]
    return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)


def main(args: argparse.Namespace) -> None:
    proc, address = start_echo(args.volley)
    plain, port = plain_echo_server()
    here = str(Path(__file__).resolve().parents[1] / "src")
    sources = {"after": here} if args.baseline is None else {"before": args.baseline, "after": here}
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in sources}
    try:
        for _ in range(args.rounds):
            for name, src in sources.items():
                for k, v in child_round(src, args, address, port).items():
                    figures[name].setdefault(k, []).append(v)
    finally:
        for p in (proc, plain):
            p.terminate()
            p.wait()
    print(f"{args.payload}-byte payloads, one connection, {args.window} calls in flight for concurrent; "
          f"medians of {args.rounds} rounds (calls or items per second)")
    names = list(sources)
    # The gain: after / before for rates, before / after for CPU per call (less is better).
    print(f"{'':20}" + "".join(f"{n:>14}" for n in names) + ("      gain" if len(names) == 2 else ""))
    for k in figures["after"]:
        med = [statistics.median(figures[n][k]) if k in figures[n] else None for n in names]
        fmt = "{:14,.3f}" if "CPU" in k else "{:14,.0f}"
        line = f"{k:20}" + "".join(f"{'-':>14}" if m is None else fmt.format(m) for m in med)
        if len(med) == 2 and None not in med:
            line += f"      {(med[0] / med[1] if 'CPU' in k else med[1] / med[0]):.2f}x"
        print(line)
    for n in names:
        print(f"rounds ({n}): " + "; ".join(f"{k} " + ", ".join(f"{x:,.0f}" for x in v)
                                           for k, v in figures[n].items() if "CPU" not in k))


if __name__ == "__main__":
    if sys.argv[1:] == ["--plain-echo"]:
        serve_plain_echo()
    if sys.argv[1:2] == ["--child"]:
        src, address, port, payload, window = sys.argv[2:]
        sys.path.insert(0, src)
        print(json.dumps(asyncio.run(one_round(address, int(port), int(payload), int(window)))))
        sys.exit(0)
    repo = Path(__file__).resolve().parents[3]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--volley", default=str(repo / "target" / "release" / "volley"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--payload", type=int, default=16, help="bytes per call (16)")
    p.add_argument("--window", type=int, default=100, help="calls in flight for the concurrent figure (100)")
    p.add_argument("--baseline", help="another copy of the package's src directory, measured alongside")
    main(p.parse_args())
