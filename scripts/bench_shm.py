#!/usr/bin/env python3
"""Shared memory against unix and tcp sockets, across two processes (docs/BENCHMARKS.md):

    cargo build --release -p volley-cli && python3 scripts/bench_shm.py [--rounds 5] [--duration 3]

Starts one `volley serve-echo` process per transport (shm://, unix://, tcp://), then drives each
from a `volley bench --connect` process: 1 caller (latency), 256 callers (calls/s) and 8
callers x call_batch(128) (items/s), 64-byte payloads. Every round runs every scenario on every
transport back to back (the transports take turns going first), so a noisy moment hits them
alike; the table gives the medians and the ratios of shm to unix and to tcp, per round, then
the median.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

SCENARIOS = [
    # (label, extra args, the figure compared, higher is better)
    ("1 caller, 64 B", ["--concurrency", "1"], "p50_us", False),
    ("256 callers, 64 B", ["--concurrency", "256"], "calls_per_s", True),
    ("8 callers x call_batch(128), 64 B", ["--concurrency", "8", "--mode", "batch"], "items_per_s", True),
]


def serve(binary, addr):
    p = subprocess.Popen([binary, "serve-echo", "--listen", addr], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    return p


def bench(binary, addr, extra, duration):
    cmd = [binary, "bench", "--json", "--connect", addr, "--duration", str(duration), "--warmup", "1"] + extra
    for attempt in range(50):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode == 0:
            return json.loads(out.stdout.splitlines()[0])
        time.sleep(0.2)  # the server may still be starting
    sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--bin", default="target/release/volley")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="volley-bench-shm-")
    addrs = {
        "shm": f"shm://{tmp}/shm.sock",
        "unix": f"unix://{tmp}/unix.sock",
        "tcp": "tcp://127.0.0.1:7419",
    }
    servers = [serve(a.bin, addr) for addr in addrs.values()]
    runs = {(t, label): [] for t in addrs for label, *_ in SCENARIOS}
    try:
        for r in range(a.rounds):
            order = list(addrs)[r % 3:] + list(addrs)[:r % 3]
            for label, extra, key, _ in SCENARIOS:
                for t in order:
                    d = bench(a.bin, addrs[t], extra, a.duration)
                    runs[(t, label)].append(d)
                    if a.json:
                        print(json.dumps({"scenario": label, "transport": t, "round": r, **d}))
                    print(f"round {r + 1}/{a.rounds}: {label} [{t}]: {d[key]:,.1f} {key}", file=sys.stderr)
    finally:
        for s in servers:
            s.terminate()
            s.wait()
    med = lambda t, label, k: statistics.median(d[k] for d in runs[(t, label)])
    print("| scenario | transport | calls/s | items/s | p50 µs | p99 µs | CPU µs/call |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, *_ in SCENARIOS:
        for t in addrs:
            print(f"| {label} | {t} | {med(t, label, 'calls_per_s'):,.0f} | {med(t, label, 'items_per_s'):,.0f} | "
                  f"{med(t, label, 'p50_us'):.1f} | {med(t, label, 'p99_us'):.1f} | "
                  f"{med(t, label, 'cpu_us_per_call'):.1f} |")
    print()
    print("| scenario | figure | shm / unix | shm / tcp |")
    print("|---|---|---:|---:|")
    for label, _, key, _ in SCENARIOS:
        ratio = lambda other: statistics.median(
            s[key] / o[key] for s, o in zip(runs[("shm", label)], runs[(other, label)]))
        print(f"| {label} | {key} | {ratio('unix'):.2f} | {ratio('tcp'):.2f} |")


if __name__ == "__main__":
    main()
