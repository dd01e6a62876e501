#!/usr/bin/env python3
"""Shared memory found through the registry, against tcp (docs/BENCHMARKS.md):

    cargo build --release -p volley-cli && python3 scripts/bench_prefer_local.py [--rounds 5] [--duration 2]

Starts a `volley controller` and one `volley serve-echo` that listens on tcp and on shm and
registers both (`--listen-local`), then drives it from `volley bench --registry` processes (the
Rust ServiceClient, direct mode) with `--prefer-local` (its calls go over shm) and without (over
tcp): 1 caller (latency), 256 callers (calls/s), 8 callers x call_batch(128) (items/s), 64-byte
payloads. Each round runs every scenario both ways back to back, taking turns going first; the
table gives the medians, and the ratio of shm to tcp per round and its median.
"""
import argparse, json, os, statistics, subprocess, sys, time

SCENARIOS = [
    # (label, extra args, the figure compared)
    ("1 caller, 64 B", ["--concurrency", "1"], "p50_us"),
    ("256 callers, 64 B", ["--concurrency", "256"], "calls_per_s"),
    ("8 callers x call_batch(128), 64 B", ["--concurrency", "8", "--mode", "batch"], "items_per_s"),
]


def bench(binary, registry, extra, prefer, duration):
    cmd = [binary, "bench", "--json", "--registry", registry, "--duration", str(duration), "--warmup", "0.5"]
    cmd += extra + (["--prefer-local"] if prefer else [])
    for _ in range(50):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode == 0:
            v = json.loads(out.stdout.splitlines()[0])
            if v["errors"] == 0:
                return v
        time.sleep(0.2)  # the server may still be registering
    sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--bin", default="target/release/volley")
    a = ap.parse_args()
    controller = subprocess.Popen([a.bin, "controller", "--listen", "tcp://127.0.0.1:0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    registry = controller.stdout.readline().strip()
    local = f"shm://bench-prefer-local-{os.getpid()}"
    server = subprocess.Popen([a.bin, "serve-echo", "--listen", "tcp://127.0.0.1:0", "--listen-local", local,
                               "--registry", registry], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = {}  # (scenario, transport) -> [report per round]
    try:
        for r in range(a.rounds):
            for label, extra, figure in SCENARIOS:
                for prefer in ([True, False] if r % 2 == 0 else [False, True]):
                    v = bench(a.bin, registry, extra, prefer, a.duration)
                    runs.setdefault((label, v["transport"]), []).append(v)
                    print(f"round {r + 1}/{a.rounds}: {label} [{v['transport']}]: {v[figure]:,.1f} {figure}",
                          file=sys.stderr)
    finally:
        server.terminate()
        controller.terminate()
    med = lambda vs, k: statistics.median(v[k] for v in vs)
    print("| scenario | transport | calls/s | items/s | p50 µs | p99 µs | CPU µs/call |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, _, _ in SCENARIOS:
        for t in ("shm", "tcp"):
            vs = runs[(label, t)]
            print(f"| {label} | {t} | {med(vs, 'calls_per_s'):,.0f} | {med(vs, 'items_per_s'):,.0f} | "
                  f"{med(vs, 'p50_us'):.1f} | {med(vs, 'p99_us'):.1f} | {med(vs, 'cpu_us_per_call'):.1f} |")
    print("\n| scenario | figure | shm / tcp (median of rounds) | per round |")
    print("|---|---|---:|---|")
    for label, _, figure in SCENARIOS:
        ratios = [s[figure] / t[figure] for s, t in zip(runs[(label, "shm")], runs[(label, "tcp")])]
        print(f"| {label} | {figure} | {statistics.median(ratios):.2f} | {', '.join(f'{x:.2f}' for x in ratios)} |")


if __name__ == "__main__":
    main()
