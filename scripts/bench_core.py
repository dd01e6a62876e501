#!/usr/bin/env python3
"""The echo figures of docs/BENCHMARKS.md, reproducible with one command:

    cargo build --release -p volley-cli && python3 scripts/bench_core.py [--suite core|batch] [--rounds 3]

Runs every scenario once per round, rounds interleaved (so a noisy moment hits all scenarios
alike), and prints the median of each as a markdown table, plus the raw JSON lines with --json.

    python3 scripts/bench_core.py --compare OTHER/volley [--suite core] [--rounds 5]

runs every scenario with both binaries, one after the other in each round, and adds the ratio
of calls/s and of CPU per call (this binary's over the other's, per round, then the median):
how a change is measured against the build before it.

    python3 scripts/bench_core.py --compare-flag=--no-metrics [--suite batch] [--rounds 3]

does the same with one binary, each scenario run without and with the flag (the library's
metrics on, then off): what a switch costs, measured side by side.
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

# What the library's metrics cost: run with --compare-flag=--no-metrics.
METRICS = [
    ("tcp, 256 callers, split runtimes", ["--transport", "tcp", "--runtime", "split"]),
    ("tcp, 256 callers, one shared runtime", ["--transport", "tcp", "--runtime", "shared"]),
    ("tcp, split: 8 callers x call_batch(128)", ["--transport", "tcp", "--mode", "batch", "--concurrency", "8"]),
    ("tcp, shared: 8 callers x call_batch(128)", ["--transport", "tcp", "--mode", "batch", "--concurrency", "8", "--runtime", "shared"]),
]

SUITES = {"core": CORE, "batch": BATCH, "metrics": METRICS}

def run(binary, extra, duration):
    cmd = [binary, "bench", "--json", "--duration", str(duration), "--warmup", "1"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")
    return json.loads(out.stdout.splitlines()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--bin", default="target/release/volley")
    ap.add_argument("--compare", metavar="OTHER_BIN", help="a second volley binary, run side by side")
    ap.add_argument("--compare-flag", metavar="FLAG", help="run each scenario without and with FLAG, side by side")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--suite", choices=SUITES, default="core")
    a = ap.parse_args()
    scenarios = SUITES[a.suite]
    if a.compare and a.compare_flag:
        sys.exit("--compare and --compare-flag: one at a time")
    # A variant is a binary and the flags it adds; its name is what the tables show.
    variants = {a.bin: (a.bin, [])}
    if a.compare:
        variants[a.compare] = (a.compare, [])
    if a.compare_flag:
        variants[a.compare_flag] = (a.bin, [a.compare_flag])
    bins = list(variants)
    other = a.compare or a.compare_flag
    runs = {(b, label): [] for b in bins for label, _ in scenarios}
    for r in range(a.rounds):
        for label, extra in scenarios:
            # The variants take turns going first.
            for b in (bins if r % 2 == 0 else bins[::-1]):
                binary, flags = variants[b]
                d = run(binary, extra + flags, a.duration)
                runs[(b, label)].append(d)
                if a.json:
                    print(json.dumps({"scenario": label, "bin": b, "round": r, **d}))
                print(f"round {r + 1}/{a.rounds}: {label} [{b}]: {d['calls_per_s']:.0f} calls/s", file=sys.stderr)
    med = lambda b, label, k: statistics.median(d[k] for d in runs[(b, label)])
    print("| scenario | requests/s | calls/s | p50 µs | p99 µs | p99.9 µs | messages/frame | CPU µs/call |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, _ in scenarios:
        for b in bins:
            name = label if not other else f"{label} [{b}]"
            print(f"| {name} | {med(b, label, 'items_per_s'):,.0f} | {med(b, label, 'calls_per_s'):,.0f} | "
                  f"{med(b, label, 'p50_us'):.1f} | {med(b, label, 'p99_us'):.1f} | {med(b, label, 'p999_us'):.1f} | "
                  f"{med(b, label, 'messages_per_frame'):.1f} | {med(b, label, 'cpu_us_per_call'):.3f} |")
    print(f"\nmedians of {a.rounds} rounds of {a.duration:g} s each")
    if other:
        # Ratios per round (both binaries measured at nearly the same moment), then the median.
        # CPU per call is the steadier measure on a shared machine: waiting for a core costs no
        # CPU time.
        print(f"\n| scenario | calls/s {a.bin} / {other} | per round | CPU per call, same ratio | per round |")
        print("|---|---:|---|---:|---|")
        for label, _ in scenarios:
            new, old = runs[(a.bin, label)], runs[(other, label)]
            calls = [x["calls_per_s"] / y["calls_per_s"] for x, y in zip(new, old)]
            cpu = [x["cpu_us_per_call"] / y["cpu_us_per_call"] for x, y in zip(new, old)]
            print(f"| {label} | {statistics.median(calls):.3f} | {', '.join(f'{r:.2f}' for r in calls)} | "
                  f"{statistics.median(cpu):.3f} | {', '.join(f'{r:.2f}' for r in cpu)} |")


if __name__ == "__main__":
    main()
