"""Throughput of the Python client against the Rust echo server, next to a bare-socket baseline.

    python clients/python/bench/bench.py [--volley target/release/volley] [--rounds 5]

Three measurements, interleaved round by round, medians reported:

- ``pipelined``: calls of 64-byte payloads, 1,000 outstanding at a time (``Client.call``);
- ``batch``: ``Client.call_batch`` of 100,000 64-byte items (chunks of 128), five in a row;
- ``socket``: the floor — the same bytes as the batch's frames written to a plain asyncio TCP
  echo server (a Python process of its own, a blocking loop) and read back, five times, with no protocol work
  at all: what a bare Python socket loop moves.

The figures are items per second; ``batch / socket`` is the cost of the protocol on the batch
path (the goal: within 2x, so at least 0.5). ``batch CPU`` is this process's CPU time per batch
item, the figure other processes' load disturbs least.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import volley
from volley import proto

ECHO = volley.Method("echo", "echo")
ITEM = b"x" * 64
BATCH = 100_000
# Batches (and floor passes) per measurement: one batch takes some tens of milliseconds, less
# than a time slice lost to another process on a loaded machine.
REPEAT = 5
CALLS = 20_000
WINDOW = 1_000


def start_echo(binary: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([binary, "serve-echo", "--listen", "tcp://127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r"serving \S+ on (\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"volley serve-echo printed {line!r}")
    return proc, m.group(1)


async def pipelined(client: volley.Client) -> float:
    start = time.perf_counter()
    for _ in range(CALLS // WINDOW):
        await asyncio.gather(*(client.call(ECHO, ITEM) for _ in range(WINDOW)))
    return CALLS / (time.perf_counter() - start)


async def batch(client: volley.Client, repeat: int = REPEAT) -> tuple[float, float]:
    """Items per second, and this process's CPU time per item in microseconds (which other
    processes' load disturbs far less than the rate)."""
    items = [ITEM] * BATCH
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        results = await client.call_batch(ECHO, items)
        assert len(results) == BATCH and results[-1] == ITEM
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


async def socket_floor(port: int) -> float:
    """The batch's bytes (its BatchRequest frames) through a plain socket and back."""
    names = ECHO.names
    chunks = [proto.batch_request_message(i, 0, names, [ITEM] * 128) for i in range(BATCH // 128)]
    data = b"".join(proto.frames(chunks))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    for _ in range(REPEAT):
        writer.write(data)
        await reader.readexactly(len(data))
    elapsed = time.perf_counter() - start
    writer.close()
    return REPEAT * (BATCH // 128 * 128) / elapsed


async def main(binary: str, rounds: int) -> None:
    proc, address = start_echo(binary)
    plain, port = plain_echo_server()
    figures: dict[str, list[float]] = {"pipelined": [], "batch": [], "socket": []}
    cpu: list[float] = []
    try:
        async with await volley.Client.connect(address) as client:
            await batch(client, repeat=1)  # warm-up
            for _ in range(rounds):
                figures["pipelined"].append(await pipelined(client))
                rate, per_item = await batch(client)
                figures["batch"].append(rate)
                cpu.append(per_item)
                figures["socket"].append(await socket_floor(port))
    finally:
        for p in (proc, plain):
            p.terminate()
            p.wait()
    med = {k: statistics.median(v) for k, v in figures.items()}
    for k, v in med.items():
        print(f"{k:10} {v:12,.0f} items/s   (rounds: {', '.join(f'{x:,.0f}' for x in figures[k])})")
    rounds_cpu = ", ".join(f"{x:.3f}" for x in cpu)
    print(f"batch CPU  {statistics.median(cpu):12.3f} µs/item (this process; rounds: {rounds_cpu})")
    print(f"batch / socket = {med['batch'] / med['socket']:.2f}", end="; ")
    print(f"pipelined / socket = {med['pipelined'] / med['socket']:.3f}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--plain-echo"]:
        serve_plain_echo()
    repo = Path(__file__).resolve().parents[3]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--volley", default=str(repo / "target" / "debug" / "volley"))
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    asyncio.run(main(args.volley, args.rounds))
