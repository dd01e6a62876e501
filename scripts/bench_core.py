#!/usr/bin/env python3
"""The echo figures of docs/BENCHMARKS.md, reproducible with one command:

    cargo build --release -p volley-cli && python3 scripts/bench_core.py [--suite core|batch] [--rounds 3]

Runs every scenario once per round, rounds interleaved (so a noisy moment hits all scenarios
alike), and prints the median of each as a markdown table, plus the raw JSON lines with --json.
"""
import argparse, json, statistics, subprocess, sys

CORE = [
    # (label, extra args)
    ("tcp, 256 callers, split runtimes", ["--transport", "tcp", "--runtime", "split"]),
    ("tcp, 256 callers, one shared runtime", ["--transport", "tcp", "--runtime", "shared"]),
    ("tcp, 256 callers, multi-thread runtime", ["--transport", "tcp", "--runtime", "multi"]),
    ("unix, 256 callers, split runtimes", ["--transport", "unix", "--runtime", "split"]),
    ("inproc, 256 callers, split runtimes", ["--transport", "inproc", "--runtime", "split"]),
    ("tcp, 1 caller, split: bare tokio ping-pong", ["--raw", "--runtime", "split", "--concurrency", "1"]),
    ("tcp, 1 caller, split: volley", ["--transport", "tcp", "--runtime", "split", "--concurrency", "1"]),
    ("tcp, 1 caller, shared: bare tokio ping-pong", ["--raw", "--runtime", "shared", "--concurrency", "1"]),
    ("tcp, 1 caller, shared: volley", ["--transport", "tcp", "--runtime", "shared", "--concurrency", "1"]),
    ("tcp, 1024 callers, split runtimes", ["--transport", "tcp", "--runtime", "split", "--concurrency", "1024"]),
    ("tcp, 1024 callers, one shared runtime", ["--transport", "tcp", "--runtime", "shared", "--concurrency", "1024"]),
]

BATCH = [
    ("tcp, split: 128 callers x single calls", ["--transport", "tcp", "--mode", "single", "--concurrency", "128"]),
    ("tcp, split: 8 callers x call_batch(128)", ["--transport", "tcp", "--mode", "batch", "--concurrency", "8"]),
    ("tcp, shared: 8 callers x call_batch(128)", ["--transport", "tcp", "--mode", "batch", "--concurrency", "8", "--runtime", "shared"]),
    ("tcp, split: 1 caller x single calls", ["--transport", "tcp", "--mode", "single", "--concurrency", "1"]),
    ("tcp, split: 1 caller x call_batch(128)", ["--transport", "tcp", "--mode", "batch", "--concurrency", "1"]),
    ("inproc, split: 128 callers x single calls", ["--transport", "inproc", "--mode", "single", "--concurrency", "128"]),
    ("inproc, split: 8 callers x call_batch(128)", ["--transport", "inproc", "--mode", "batch", "--concurrency", "8"]),
    ("inproc, shared: 8 callers x call_batch(128)", ["--transport", "inproc", "--mode", "batch", "--concurrency", "8", "--runtime", "shared"]),
]

# Issue 6: the same binary with Volley's memory pools on and off (`--pools off` is the
# allocation behaviour from before them), interleaved; the table adds the on/off ratio.
POOLS = [
    ("tcp, 256 callers, split: pools on", ["--transport", "tcp", "--runtime", "split", "--pools", "on"]),
    ("tcp, 256 callers, split: pools off", ["--transport", "tcp", "--runtime", "split", "--pools", "off"]),
    ("tcp, 1 caller, split: pools on", ["--transport", "tcp", "--runtime", "split", "--concurrency", "1", "--pools", "on"]),
    ("tcp, 1 caller, split: pools off", ["--transport", "tcp", "--runtime", "split", "--concurrency", "1", "--pools", "off"]),
    ("tcp, 256 callers, shared: pools on", ["--transport", "tcp", "--runtime", "shared", "--pools", "on"]),
    ("tcp, 256 callers, shared: pools off", ["--transport", "tcp", "--runtime", "shared", "--pools", "off"]),
    ("unix, 256 callers, split: pools on", ["--transport", "unix", "--runtime", "split", "--pools", "on"]),
    ("unix, 256 callers, split: pools off", ["--transport", "unix", "--runtime", "split", "--pools", "off"]),
    ("inproc, 256 callers, split: pools on", ["--transport", "inproc", "--runtime", "split", "--pools", "on"]),
    ("inproc, 256 callers, split: pools off", ["--transport", "inproc", "--runtime", "split", "--pools", "off"]),
]

SUITES = {"core": CORE, "batch": BATCH, "pools": POOLS}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--bin", default="target/release/volley")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--suite", choices=SUITES, default="core")
    a = ap.parse_args()
    SCENARIOS = SUITES[a.suite]
    runs = {label: [] for label, _ in SCENARIOS}
    for r in range(a.rounds):
        for label, extra in SCENARIOS:
            cmd = [a.bin, "bench", "--json", "--duration", str(a.duration), "--warmup", "1"] + extra
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")
            d = json.loads(out.stdout)
            runs[label].append(d)
            if a.json:
                print(json.dumps({"scenario": label, "round": r, **d}))
            print(f"round {r + 1}/{a.rounds}: {label}: {d['calls_per_s']:.0f} calls/s", file=sys.stderr)
    med = lambda label, k: statistics.median(d[k] for d in runs[label])
    print("| scenario | requests/s | calls/s | p50 µs | p99 µs | p99.9 µs | messages/frame |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, _ in SCENARIOS:
        print(f"| {label} | {med(label, 'items_per_s'):,.0f} | {med(label, 'calls_per_s'):,.0f} | {med(label, 'p50_us'):.1f} | "
              f"{med(label, 'p99_us'):.1f} | {med(label, 'p999_us'):.1f} | {med(label, 'messages_per_frame'):.1f} |")
    print(f"\nmedians of {a.rounds} rounds of {a.duration:g} s each")
    # Pairs "X: pools on" / "X: pools off": the ratio of calls/s, per round (same moment), then
    # the median of those ratios.
    pairs = [(l[: -len(": pools on")], l) for l, _ in SCENARIOS if l.endswith(": pools on")]
    if pairs:
        # CPU per call (user + sys of the process, client and server) is the steadier measure on
        # a shared machine: waiting for a core costs no CPU time.
        print("\n| scenario | calls/s on / off | per round | CPU µs/call on | off | off / on (CPU) | per round |")
        print("|---|---:|---|---:|---:|---:|---|")
        for base, on in pairs:
            off = base + ": pools off"
            ratios = [x["calls_per_s"] / y["calls_per_s"] for x, y in zip(runs[on], runs[off])]
            cpu = [y["cpu_us_per_call"] / x["cpu_us_per_call"] for x, y in zip(runs[on], runs[off])]
            print(f"| {base} | {statistics.median(ratios):.3f} | {', '.join(f'{r:.2f}' for r in ratios)} | "
                  f"{med(on, 'cpu_us_per_call'):.2f} | {med(off, 'cpu_us_per_call'):.2f} | {statistics.median(cpu):.3f} | "
                  f"{', '.join(f'{r:.2f}' for r in cpu)} |")

if __name__ == "__main__":
    main()
