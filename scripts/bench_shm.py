#!/usr/bin/env python3
"""Shared memory against unix and tcp sockets, across two processes (docs/BENCHMARKS.md):

    cargo build --release -p volley-cli && python3 scripts/bench_shm.py [--rounds 5] [--duration 3]

Starts one `volley serve-echo` process per transport (shm://, unix://, tcp://), then drives each
from a `volley bench --connect` process: 1 caller (latency), 256 callers (calls/s) and 8
callers x call_batch(128) (items/s), 64-byte payloads. Every round runs every scenario on every
transport back to back (the transports take turns going first), so a noisy moment hits them
alike; the table gives the medians and the ratios of shm to unix and to tcp, per round, then
the median. With --spins 0,10 more servers and clients run shm with the reader's spin set to
each of those microseconds (VOLLEY_SHM_SPIN_US), to show what the spin buys.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

SCENARIOS_ALL = [
    # (label, extra args, the figure compared, higher is better)
    ("1 caller, 64 B", ["--concurrency", "1"], "p50_us", False),
    ("256 callers, 64 B", ["--concurrency", "256"], "calls_per_s", True),
    ("8 callers x call_batch(128), 64 B", ["--concurrency", "8", "--mode", "batch"], "items_per_s", True),
]


def env_of(transport):
    """`shm, spin N µs` runs with VOLLEY_SHM_SPIN_US=N."""
    if not transport.startswith("shm, spin "):
        return None
    return {**os.environ, "VOLLEY_SHM_SPIN_US": transport.split()[2]}


def serve(binary, transport, addr):
    return subprocess.Popen([binary, "serve-echo", "--listen", addr], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env_of(transport))


def bench(binary, transport, addr, extra, duration):
    cmd = [binary, "bench", "--json", "--connect", addr, "--duration", str(duration), "--warmup", "1"] + extra
    for attempt in range(50):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env_of(transport))
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
    ap.add_argument("--spins", default="", help="comma-separated spins (µs) to run shm with too")
    ap.add_argument("--only", help="run only the scenarios whose label contains this")
    a = ap.parse_args()
    global SCENARIOS
    SCENARIOS = [sc for sc in SCENARIOS_ALL if not a.only or a.only in sc[0]]
    tmp = tempfile.mkdtemp(prefix="volley-bench-shm-")
    addrs = {
        "shm": f"shm://{tmp}/shm.sock",
        "unix": f"unix://{tmp}/unix.sock",
        "tcp": "tcp://127.0.0.1:7419",
    }
    for us in filter(None, a.spins.split(",")):
        addrs[f"shm, spin {int(us)} µs"] = f"shm://{tmp}/shm-spin-{int(us)}.sock"
    servers = [serve(a.bin, t, addr) for t, addr in addrs.items()]
    runs = {(t, label): [] for t in addrs for label, *_ in SCENARIOS}
    try:
        for r in range(a.rounds):
            n = len(addrs)
            order = list(addrs)[r % n:] + list(addrs)[:r % n]
            for label, extra, key, _ in SCENARIOS:
                for t in order:
                    d = bench(a.bin, t, addrs[t], extra, a.duration)
                    runs[(t, label)].append(d)
                    if a.json:
                        print(json.dumps({"scenario": label, "transport": t, "round": r, **d}))
                    print(f"round {r + 1}/{a.rounds}: {label} [{t}]: {d[key]:,.1f} {key}", file=sys.stderr)
    finally:
        for s in servers:
            s.terminate()
            s.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    med = lambda t, label, k: statistics.median(d[k] for d in runs[(t, label)])
    print("| scenario | transport | calls/s | items/s | p50 µs | p99 µs | CPU µs/call |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, *_ in SCENARIOS:
        for t in addrs:
            print(f"| {label} | {t} | {med(t, label, 'calls_per_s'):,.0f} | {med(t, label, 'items_per_s'):,.0f} | "
                  f"{med(t, label, 'p50_us'):.1f} | {med(t, label, 'p99_us'):.1f} | "
                  f"{med(t, label, 'cpu_us_per_call'):.1f} |")
    print()
    others = [t for t in addrs if t != "shm"]
    print("| scenario | figure | " + " | ".join(f"shm / {t}" for t in others) + " |")
    print("|---|---|" + "---:|" * len(others))
    for label, _, key, _ in SCENARIOS:
        ratio = lambda other: statistics.median(
            s[key] / o[key] for s, o in zip(runs[("shm", label)], runs[(other, label)]))
        print(f"| {label} | {key} | " + " | ".join(f"{ratio(t):.2f}" for t in others) + " |")


if __name__ == "__main__":
    main()
