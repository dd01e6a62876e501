#!/usr/bin/env python3
"""Instructions per call, counted by valgrind (callgrind), for builds side by side.

    cargo build --release -p volley --example callcost
    python3 scripts/callcost.py [--bin target/release/examples/callcost] [--compare OTHER] \
        [--scenario tcp-256 ...] [--profile DIR] [--no-metrics] [--runs K]

Timing a benchmark on a shared 2-core machine moves by 10% from one minute to the next; the
instructions a call executes do not. Each scenario runs the `callcost` example twice, with N
and 2N calls per caller, and reports (I(2N) - I(N)) / (callers x N): the cost of one more call,
without the start-up (runtime, connection) that both runs share. (The one part of the start-up
whose count varies from run to run, the metrics clock's calibration, is subtracted from each.) Instructions are not time
(a cache miss costs more than an add), so this complements the timed benchmarks and does not
replace them: it tells what a change adds to the work of a call, exactly. Only user-space
instructions are counted: a socket's copies and wake-ups happen in the kernel and are not, so
compare a transport with itself (shm-256 counts the copies into and out of its rings, which
unix-256 leaves to the kernel).

With --profile DIR the 2N run's callgrind file is kept there, for `callgrind_annotate`.
With --no-metrics the library's metrics are off (both sides); --compare-metrics runs one build
with them on and off, side by side: what they cost per call. With --runs K each variant is
measured K times, interleaved, and the medians (and the median of the runs' ratios) reported:
the count moves by about 1% from run to run with the scheduling of the callers.
"""
import argparse, os, re, statistics, subprocess, sys

# (name, callers, calls per caller for the short run, transport, mode)
SCENARIOS = {
    "tcp-256": (256, 600, "tcp", "single"),
    "tcp-1": (1, 20000, "tcp", "single"),
    "unix-256": (256, 200, "unix", "single"),
    "shm-256": (256, 200, "shm", "single"),
    "inproc-256": (256, 1000, "inproc", "single"),
    "tcp-batch": (8, 50, "tcp", "batch"),
    "inproc-batch": (8, 100, "inproc", "batch"),
}


def instructions(binary, callers, per, transport, mode, metrics, out):
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
           str(callers), str(per), transport, mode, metrics]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
    m = re.search(r"Collected : (\d+)", run.stderr)
    if not m:
        sys.exit(f"no instruction count in valgrind's output:\n{run.stderr[-2000:]}")
    return int(m.group(1)) - clock_calibration(out), int(run.stdout.split()[0])


def clock_calibration(out):
    """The instructions of the metrics clock's one-time calibration (quanta's first
    `Instant::now`, inclusive), which loops for as long as the clock takes to settle: a count
    that varies by millions from run to run and, unlike the rest of the start-up, does not cancel
    out between the two runs. 0 when metrics are off (the clock is never read)."""
    run = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", out],
                         capture_output=True, text=True)
    for line in run.stdout.splitlines():
        m = re.match(r"\s*([\d,]+) \(.*once_lock\.rs:quanta::instant::Instant::now$", line)
        if m:
            return int(m.group(1).replace(",", ""))
    return 0


def per_call(binary, scenario, profile, metrics, scale):
    callers, per, transport, mode = SCENARIOS[scenario]
    per *= scale
    short_out = f"/tmp/callcost.{os.getpid()}.short"
    long_out = os.path.join(profile, f"{scenario}.{os.path.basename(binary)}.callgrind") if profile \
        else f"/tmp/callcost.{os.getpid()}.long"
    i1, n1 = instructions(binary, callers, per, transport, mode, metrics, short_out)
    i2, n2 = instructions(binary, callers, 2 * per, transport, mode, metrics, long_out)
    os.unlink(short_out)
    if not profile:
        os.unlink(long_out)
    return (i2 - i1) / (n2 - n1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/examples/callcost")
    ap.add_argument("--compare", metavar="OTHER_BIN", help="a second build of the example")
    ap.add_argument("--scenario", action="append", choices=SCENARIOS)
    ap.add_argument("--profile", metavar="DIR")
    ap.add_argument("--no-metrics", action="store_true")
    ap.add_argument("--compare-metrics", action="store_true", help="metrics on against off")
    ap.add_argument("--scale", type=int, default=1,
                    help="K times the calls per run, for a count steadier still")
    ap.add_argument("--runs", type=int, default=1,
                    help="measure each variant this many times, interleaved, and report medians")
    a = ap.parse_args()
    if a.compare and a.compare_metrics:
        sys.exit("--compare and --compare-metrics: one at a time")
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
    metrics = "nometrics" if a.no_metrics else "metrics"
    # A variant: a build and whether its metrics are on.
    variants = [(a.bin, metrics)]
    if a.compare:
        variants.append((a.compare, metrics))
    if a.compare_metrics:
        variants = [(a.bin, "metrics"), (a.bin, "nometrics")]
    head = "| scenario | " + " | ".join(f"instructions per item, {b} ({m})" for b, m in variants)
    two = len(variants) == 2
    print(head + (" | ratio" if two else "") + (" | runs" if a.runs > 1 else "") + " |")
    print("|---|" + "---:|" * (len(variants) + two) + ("---|" if a.runs > 1 else ""))
    for s in a.scenario or ["tcp-256", "tcp-1", "inproc-256", "tcp-batch"]:
        runs = [[per_call(b, s, a.profile, m, a.scale) for b, m in variants] for _ in range(a.runs)]
        costs = [statistics.median(r[i] for r in runs) for i in range(len(variants))]
        row = f"| {s} | " + " | ".join(f"{c:,.0f}" for c in costs)
        if two:
            # The median of the runs' ratios: each run's two variants were measured back to back.
            row += f" | {statistics.median(r[0] / r[1] for r in runs):.3f}"
        if a.runs > 1:
            row += " | " + "; ".join(" / ".join(f"{c:,.0f}" for c in r) for r in runs)
        print(row + " |", flush=True)


if __name__ == "__main__":
    main()
