#!/usr/bin/env python3
"""What one wake-up costs through each kind of fd the shm transport could wake a peer with.

Two processes wake each other in turn: each blocks reading its fd, then writes to wake the
other. Reports the median round trip (two wake-ups) over interleaved rounds, for eventfds (set-up
version 1), unix stream socket pairs (version 2, docs/PROTOCOL.md §2.1.5) and pipes.

    python3 scripts/bench_wake.py [--round-trips 20000] [--rounds 7]
"""
import argparse
import os
import socket
import statistics
import time


def pingpong(make, n):
    (a_w, a_r), (b_w, b_r) = make(), make()
    pid = os.fork()
    if pid == 0:
        for _ in range(n):
            os.read(a_r, 256 if a_r != a_w else 8)
            os.write(b_w, (1).to_bytes(8, "little"))
        os._exit(0)
    start = time.perf_counter()
    for _ in range(n):
        os.write(a_w, (1).to_bytes(8, "little"))
        os.read(b_r, 256 if b_r != b_w else 8)
    took = time.perf_counter() - start
    os.waitpid(pid, 0)
    for fd in {a_w, a_r, b_w, b_r}:
        os.close(fd)
    return took / n * 1e6


def eventfd():
    e = os.eventfd(0)
    return (e, e)


def socket_pair():
    x, y = socket.socketpair()
    return (x.detach(), y.detach())


def pipe():
    r, w = os.pipe()
    return (w, r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round-trips", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    kinds = {"eventfd": eventfd, "unix socket pair": socket_pair, "pipe": pipe}
    times = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for name, make in kinds.items():
            times[name].append(pingpong(make, args.round_trips))
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.1f} µs per round trip "
              f"(min {min(t):.1f}, max {max(t):.1f})")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
