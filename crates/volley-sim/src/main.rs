//! Runs seeds of the simulation:
//! `volley-sim [--scenario NAME|all] [--seed N | --seeds N [--from N]] [--jobs N] [--trace]`.
//! With `all` (the default) seed `s` runs scenario `s mod 6` (every scenario with `--seed`).
//! Seeds run on `--jobs` threads (default: every core), each run on one thread as always. A
//! failing seed prints what broke, the command that replays it and its trace.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use volley_sim::{Report, Scenario, run};

fn main() -> ExitCode {
    match parse(std::env::args().skip(1).collect()) {
        Ok(opts) => sweep(opts),
        Err(e) => {
            eprintln!("{e}");
            eprintln!(
                "usage: volley-sim [--scenario NAME|all] [--seed N | --seeds N [--from N]] [--jobs N] [--trace]"
            );
            ExitCode::from(2)
        }
    }
}

struct Opts {
    /// (scenario, seed) pairs to run, in order.
    runs: Vec<(Scenario, u64)>,
    jobs: usize,
    trace: bool,
}

fn parse(args: Vec<String>) -> Result<Opts, String> {
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let number = |flag: &str| -> Result<Option<u64>, String> {
        value(flag).map(|v| v.parse::<u64>().map_err(|_| format!("{flag}: not a number: {v}"))).transpose()
    };
    let scenarios: Vec<Scenario> = match value("--scenario").as_deref() {
        None | Some("all") => Scenario::ALL.to_vec(),
        Some(name) => vec![Scenario::parse(name).ok_or_else(|| {
            let names: Vec<_> = Scenario::ALL.iter().map(|s| s.name()).collect();
            format!("unknown scenario {name:?}; one of: all, {}", names.join(", "))
        })?],
    };
    let runs = match number("--seed")? {
        Some(seed) => scenarios.iter().map(|&s| (s, seed)).collect(),
        None => {
            let (n, from) = (number("--seeds")?.unwrap_or(100), number("--from")?.unwrap_or(0));
            (from..from + n).map(|seed| (scenarios[(seed % scenarios.len() as u64) as usize], seed)).collect()
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = number("--jobs")?.map_or(cores, |j| j.max(1) as usize);
    Ok(Opts { runs, jobs, trace: args.iter().any(|a| a == "--trace") })
}

fn sweep(opts: Opts) -> ExitCode {
    let t0 = Instant::now();
    let next = AtomicU64::new(0);
    let reports: Mutex<Vec<(usize, Report)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.min(opts.runs.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&(scenario, seed)) = opts.runs.get(i) else { break };
                    let mut report = run(scenario, seed);
                    if !opts.trace && report.passed() {
                        report.log = Default::default();
                    }
                    reports.lock().unwrap().push((i, report));
                }
            });
        }
    });
    let took = t0.elapsed();
    let mut reports = reports.into_inner().unwrap();
    reports.sort_by_key(|(i, _)| *i);
    let mut failed = 0;
    for (_, report) in &reports {
        if opts.trace {
            for line in &report.log.trace {
                println!("{line}");
            }
            println!("{} seed {}: trace hash {:016x}", report.scenario, report.seed, report.log.trace_hash());
        }
        if !report.passed() {
            failed += 1;
            eprintln!("{}", report.failure());
        }
    }
    let n = reports.len();
    println!(
        "{n} run(s), {failed} failed, in {:.1} s on {} thread(s) ({:.1} ms a run)",
        took.as_secs_f64(),
        opts.jobs.min(n),
        took.as_secs_f64() * 1e3 / n.max(1) as f64
    );
    if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
