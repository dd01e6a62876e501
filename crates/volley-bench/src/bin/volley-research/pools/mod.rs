//! `volley-research pools`: the experiments of a published study of memory pools in a
//! high-concurrency search service, side by side in one process — Volley's pools against the
//! system allocator, mimalloc and jemalloc, each allocator called directly through its
//! `GlobalAlloc` impl (whatever the binary's global allocator is).
//!
//! Cases (the study's tables 1-5):
//!
//! - `fixed`: 100,000 fixed-size (64-byte) objects allocated, then all freed (table 1);
//!   Volley's object pool against each allocator.
//! - `hash-churn`: a hash table whose values are heap nodes (64 bytes): 50,000 inserts, then
//!   50,000 removes, with one thread and with several, each thread its own table (table 2).
//! - `map`: a map whose memory comes from the allocator under test (table 3). Rust's std maps
//!   take no allocator on stable (`allocator_api` is unstable); hashbrown does, through
//!   allocator-api2, so the map is a `hashbrown::HashMap` with the allocator as a type
//!   parameter and the arena (`&bumpalo::Bump`) as the pool. hashbrown keeps entries in one
//!   table, not one node per entry, so this case allocates only when the table grows — which
//!   is why the allocator matters so little here; the node-per-entry shape is `hash-churn`.
//! - `variable`: sizes 1-10,000 bytes, 4 threads, 5,000 buffers each, allocated then freed, 20
//!   times (table 4); Volley's size-class buffer pool against each allocator.
//! - `arena`: 4-byte allocations, 50,000 in a row, then released (table 5); Volley's per-batch
//!   arena (bumpalo) against each allocator (which frees them one by one).
//!
//! Every case runs once per round for every allocator, rounds interleaved; the median time is
//! reported, and the speed-up against the system allocator of the same case.

mod cases;
mod work;

use clap::Args;
use serde::Serialize;

use crate::output::outln;
use cases::Case;

#[derive(Args, Debug, Clone)]
pub struct PoolsArgs {
    /// Rounds (interleaved); the median of each case is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Threads of the multi-threaded cases.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Only the cases whose name contains this.
    #[arg(long)]
    case: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Debug, Clone)]
struct Row {
    case: &'static str,
    allocator: &'static str,
    threads: usize,
    /// Median seconds of one run of the case.
    seconds: f64,
    /// Allocations (and frees) in one run.
    ops: u64,
    ns_per_op: f64,
    /// The system allocator's time over this one's, same case (>1: faster than system).
    speedup_vs_system: f64,
    rounds: usize,
}

pub fn run(args: PoolsArgs) -> Result<(), String> {
    let mut cases = cases::cases(args.threads, args.case.as_deref());
    if cases.is_empty() {
        return Err("no case matches --case".into());
    }
    let rounds = args.rounds.max(1);
    let times = measure(&mut cases, rounds, !args.json);
    let rows = rows(&cases, times, rounds);
    if args.json {
        for r in &rows {
            outln!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        }
    } else {
        print_table(&rows, rounds);
    }
    Ok(())
}

/// Every case's times, one per round: an untimed pass first warms every pool and allocator up,
/// then the rounds run every case once each, interleaved.
fn measure(cases: &mut [Case], rounds: usize, progress: bool) -> Vec<Vec<f64>> {
    for c in cases.iter_mut() {
        (c.run)();
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for r in 0..rounds {
        for (i, c) in cases.iter_mut().enumerate() {
            times[i].push((c.run)());
        }
        if progress {
            eprintln!("round {}/{rounds} done", r + 1);
        }
    }
    times
}

/// The median of each case, and its speed-up against the system allocator on the same case.
fn rows(cases: &[Case], mut times: Vec<Vec<f64>>, rounds: usize) -> Vec<Row> {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut rows: Vec<Row> = cases
        .iter()
        .zip(times.iter_mut())
        .map(|(c, t)| {
            let seconds = median(t);
            Row {
                case: c.name,
                allocator: c.allocator,
                threads: c.threads,
                seconds,
                ops: c.ops,
                ns_per_op: seconds * 1e9 / c.ops as f64,
                speedup_vs_system: 0.0,
                rounds,
            }
        })
        .collect();
    let system: Vec<(&str, usize, f64)> =
        rows.iter().filter(|r| r.allocator == "system").map(|r| (r.case, r.threads, r.seconds)).collect();
    for r in &mut rows {
        if let Some((_, _, s)) = system.iter().find(|(c, t, _)| *c == r.case && *t == r.threads) {
            r.speedup_vs_system = s / r.seconds;
        }
    }
    rows
}

fn print_table(rows: &[Row], rounds: usize) {
    outln!("| case | threads | allocator | median ms | ns/op | vs system |");
    outln!("|---|---:|---|---:|---:|---:|");
    for r in rows {
        outln!(
            "| {} | {} | {} | {:.3} | {:.1} | {:.2}x |",
            r.case,
            r.threads,
            r.allocator,
            r.seconds * 1e3,
            r.ns_per_op,
            r.speedup_vs_system
        );
    }
    outln!("\nmedians of {rounds} interleaved rounds; every allocator called through its GlobalAlloc impl");
}
