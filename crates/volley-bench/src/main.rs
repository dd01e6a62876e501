//! `volley-compare`: the same echo service in Volley, tonic (gRPC) and tarpc, every scenario on
//! every framework in one run, frameworks alternating between rounds, one table of medians with
//! ratios to Volley. See this crate's README.md for the method.

mod load;
mod raw_echo;
mod report;
mod runner;
mod scenario;
mod tarpc_echo;
mod tonic_echo;
mod volley_echo;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use report::Results;
use runner::{Flavor, Method, Target};
use scenario::{Kind, Scenario, Settings};

#[derive(Parser, Debug)]
#[command(
    name = "volley-compare",
    about = "Volley against tonic (gRPC) and tarpc on one echo service, side by side"
)]
struct Args {
    /// A smoke run of about a minute: 1 round, 0.3 s measurements, 100,000 batch requests
    /// (any of these given explicitly still wins).
    #[arg(long)]
    quick: bool,
    /// Rounds; each runs every scenario on every framework (default 3; --quick 1).
    #[arg(long)]
    rounds: Option<usize>,
    /// Measured seconds per measurement (default 1; --quick 0.3).
    #[arg(long)]
    duration: Option<f64>,
    /// Warm-up seconds before each measurement (default 0.5; --quick 0.2).
    #[arg(long)]
    warmup: Option<f64>,
    /// Requests in the batch scenario, and items in the server-stream scenario (default
    /// 1,000,000; --quick 100,000).
    #[arg(long)]
    requests: Option<u64>,
    /// Fixed-rate mode: calls per second in total for the latency and throughput scenarios,
    /// latency measured from each call's scheduled send time. Without it, callers run in a
    /// closed loop (each calls again as soon as its reply arrives).
    #[arg(long)]
    rate: Option<f64>,
    /// Print one JSON object per (framework, transport, scenario, method) instead of the table.
    #[arg(long)]
    json: bool,
    /// Frameworks to run; `raw` is the ceiling with no framework (see the README).
    #[arg(long, value_delimiter = ',', default_value = "volley,tonic,tarpc,raw")]
    frameworks: Vec<String>,
    /// Transports to run (unix: Volley and raw; inproc: Volley and tarpc's in-process channel).
    #[arg(long, value_delimiter = ',', default_value = "tcp,unix,inproc")]
    transports: Vec<String>,
    /// Scenarios to run.
    #[arg(long, value_delimiter = ',', default_value = "latency,throughput,batch,server-stream")]
    scenarios: Vec<ScenarioArg>,
    /// Server streams open at once in the server-stream scenario (its `--requests` items are
    /// shared among them).
    #[arg(long, value_delimiter = ',', default_value = "1,256")]
    streams: Vec<usize>,
    /// Volley's server streams: each stream's credit window, items the server may send
    /// ahead. The library's default is 256; 16,384 (about 1.3 MB of 64-byte items in flight)
    /// is Volley's best configuration for this job, as tonic's HTTP/2 stream window is raised
    /// to 8 MiB: with 1,024 one stream ran at half tonic's rate on a loaded machine, each
    /// side waiting for the other's turn to move the window on (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 16384)]
    stream_window: u32,
    /// Concurrent callers of the throughput scenarios (all sharing one connection).
    #[arg(long, value_delimiter = ',', default_value = "16,256,1024")]
    concurrency: Vec<usize>,
    /// Payload sizes of the throughput scenarios, bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,4096")]
    payloads: Vec<usize>,
    /// Runtime flavors to measure every framework on; each is compared at its best.
    #[arg(long, value_delimiter = ',', default_value = "current,multi1")]
    runtimes: Vec<Flavor>,
    /// Unary calls kept in flight by tonic and tarpc in the batch scenario.
    #[arg(long, default_value_t = 256)]
    batch_in_flight: usize,
    /// Seconds after which a run of unary calls in the batch scenario stops taking new
    /// requests (tonic needs about a minute for 1,000,000); its rate is what it completed by
    /// then (default 4; --quick 1).
    #[arg(long)]
    batch_max_seconds: Option<f64>,
    /// Volley's batch: requests per chunk (one message on the wire).
    #[arg(long, default_value_t = 128)]
    chunk_size: usize,
    /// Volley's batch: chunks in flight. The library's default is 64 (8,192 requests of the
    /// default chunk size); over loopback that leaves client and server each about half idle,
    /// waiting for the other's bundle, and 256 (32,768 requests in flight) measured 1.3–1.5x
    /// faster on a quiet machine: Volley's best configuration for this job, as raised
    /// HTTP/2 windows are tonic's.
    #[arg(long, default_value_t = 256)]
    chunk_window: usize,
    /// Cores for the server and the client, e.g. `0,1` (default: the first two the OS
    /// reports).
    #[arg(long, value_delimiter = ',')]
    cores: Option<Vec<usize>>,
    /// Do not pin threads to cores.
    #[arg(long)]
    no_pin: bool,
    /// Also write every single measurement (each round, each runtime) to this file, one JSON
    /// object per line, so the spread behind the medians can be inspected.
    #[arg(long)]
    samples_out: Option<std::path::PathBuf>,
    /// Measure nothing: read a `--samples-out` file and print its table (or JSON), computed
    /// exactly as for a live run. Pass the same scenario options as the run that wrote it.
    #[arg(long)]
    replay: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ScenarioArg {
    Latency,
    Throughput,
    Batch,
    ServerStream,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("volley-compare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cores(a: &Args) -> Result<Option<(core_affinity::CoreId, core_affinity::CoreId)>, String> {
    if a.no_pin {
        return Ok(None);
    }
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let pick = |want: usize| ids.iter().copied().find(|c| c.id == want);
    match &a.cores {
        Some(c) if c.len() == 2 => match (pick(c[0]), pick(c[1])) {
            (Some(s), Some(k)) => Ok(Some((s, k))),
            _ => Err(format!("--cores {c:?}: not among this process's cores {ids:?}")),
        },
        Some(c) => Err(format!("--cores takes two cores (server,client), got {c:?}")),
        None if ids.len() >= 2 => Ok(Some((ids[0], ids[1]))),
        None => {
            eprintln!("fewer than two cores available: threads are not pinned");
            Ok(None)
        }
    }
}

fn scenarios(a: &Args, requests: u64) -> Vec<Scenario> {
    let mut out = Vec::new();
    if a.scenarios.contains(&ScenarioArg::Latency) {
        out.push(Scenario { kind: Kind::Latency, concurrency: 1, payload: 64, requests: 0 });
    }
    if a.scenarios.contains(&ScenarioArg::Throughput) {
        for &payload in &a.payloads {
            for &concurrency in &a.concurrency {
                out.push(Scenario { kind: Kind::Throughput, concurrency, payload, requests: 0 });
            }
        }
    }
    if a.scenarios.contains(&ScenarioArg::Batch) {
        out.push(Scenario { kind: Kind::Batch, concurrency: a.batch_in_flight, payload: 64, requests });
    }
    if a.scenarios.contains(&ScenarioArg::ServerStream) {
        for &streams in &a.streams {
            out.push(Scenario {
                kind: Kind::ServerStream,
                concurrency: streams.max(1),
                payload: 64,
                requests,
            });
        }
    }
    out
}

/// The (runtime, method) measurements of target `t` in scenario `sc`, in the round's order
/// of runtimes.
fn plan(t: Target, sc: Scenario, flavors: &[Flavor], rate: Option<f64>) -> Vec<(Flavor, Method)> {
    let mut out = Vec::new();
    for &f in flavors {
        for &m in t.methods(sc.kind) {
            match m {
                // Plain threads, so once per round whatever the runtimes; a closed loop by
                // nature, so left out at a fixed rate.
                Method::Bundled if rate.is_none() && !out.contains(&(Flavor::Threads, m)) => {
                    out.push((Flavor::Threads, m))
                }
                Method::Bundled => {}
                _ => out.push((f, m)),
            }
        }
    }
    out
}

/// Reads a `--samples-out` file back: the results and the number of rounds in it.
fn replay(
    path: &std::path::Path,
    targets: &[Target],
    scenarios: &[Scenario],
) -> Result<(Results, usize), String> {
    fn get<T: serde::de::DeserializeOwned>(v: &serde_json::Value, k: &str) -> Result<T, String> {
        serde_json::from_value(v[k].clone()).map_err(|e| format!("{k}: {e}"))
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut results = Results::default();
    let mut rounds = 0;
    for (i, line) in text.lines().enumerate() {
        let parsed = || -> Result<_, String> {
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
            let (framework, transport): (String, String) = (get(&v, "framework")?, get(&v, "transport")?);
            let (kind, concurrency, payload): (Kind, usize, usize) =
                (get(&v, "scenario")?, get(&v, "concurrency")?, get(&v, "payload")?);
            let target = targets.iter().find(|t| t.framework() == framework && t.transport() == transport);
            let sc = scenarios
                .iter()
                .find(|s| s.kind == kind && s.concurrency == concurrency && s.payload == payload);
            let sample = load::Sample {
                calls: get(&v, "calls")?,
                calls_per_s: get(&v, "calls_per_s")?,
                p50_us: get(&v, "p50_us")?,
                p99_us: get(&v, "p99_us")?,
                p999_us: get(&v, "p999_us")?,
                max_us: get(&v, "max_us")?,
                errors: get(&v, "errors")?,
                missed: get(&v, "missed")?,
                cpu_us_per_call: get(&v, "cpu_us_per_call")?,
                first_error: None,
            };
            let key =
                (target.copied(), sc.copied(), get::<Method>(&v, "method")?, get::<Flavor>(&v, "runtime")?);
            Ok((key, sample, get::<usize>(&v, "round")?))
        };
        let ((target, sc, method, flavor), sample, round) =
            parsed().map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        // Rows outside the chosen frameworks, transports or scenarios are left out.
        if let (Some(target), Some(sc)) = (target, sc) {
            rounds = rounds.max(round);
            results.add((target, sc, method, flavor), sample);
        }
    }
    Ok((results, rounds))
}

/// Runs everything; `Ok(false)` when some call or measurement failed.
fn run(a: Args) -> Result<bool, String> {
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let requests = a.requests.unwrap_or(if a.quick { 100_000 } else { 1_000_000 });
    let settings = Settings {
        warmup: Duration::from_secs_f64(a.warmup.unwrap_or(if a.quick { 0.2 } else { 0.5 })),
        duration: Duration::from_secs_f64(a.duration.unwrap_or(if a.quick { 0.3 } else { 1.0 })),
        rate: a.rate.filter(|r| *r > 0.0),
        chunk_size: a.chunk_size.max(1),
        chunk_window: a.chunk_window.max(1),
        stream_window: a.stream_window.max(1),
        batch_max: Duration::from_secs_f64(a.batch_max_seconds.unwrap_or(if a.quick { 1.0 } else { 4.0 })),
        cores: cores(&a)?,
    };
    for f in &a.frameworks {
        if !["volley", "tonic", "tarpc", "raw"].contains(&f.as_str()) {
            return Err(format!("unknown framework {f:?} (volley, tonic, tarpc, raw)"));
        }
    }
    if settings.rate.is_some() && a.frameworks.iter().any(|f| f == "raw") && a.replay.is_none() {
        eprintln!("raw: the bundled echo has no fixed-rate form; its throughput rows are left out");
    }
    let targets: Vec<Target> = Target::ALL
        .into_iter()
        .filter(|t| a.frameworks.iter().any(|f| f == t.framework()))
        .filter(|t| a.transports.iter().any(|x| x == t.transport()))
        .collect();
    let scenarios = scenarios(&a, requests);
    if targets.is_empty() || scenarios.is_empty() || a.runtimes.is_empty() {
        return Err("nothing to run".into());
    }
    if let Some(path) = &a.replay {
        eprintln!("volley-compare: replaying {}", path.display());
    } else {
        eprintln!(
            "volley-compare: {rounds} round(s) of {} scenarios x {} targets x {} runtimes; {:?} warm-up + {:?} each; \
         batch {requests} requests; {}; threads pinned: {}",
            scenarios.len(),
            targets.len(),
            a.runtimes.len(),
            settings.warmup,
            settings.duration,
            match settings.rate {
                Some(r) => format!("fixed rate {r} calls/s"),
                None => "closed loop".into(),
            },
            match settings.cores {
                Some((s, c)) => format!("server core {}, client core {}", s.id, c.id),
                None => "no".into(),
            }
        );
    }
    let mut samples_out = match &a.samples_out {
        Some(path) => Some(std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?),
        None => None,
    };
    let started = Instant::now();
    let mut results = Results::default();
    let mut ok = true;
    let (rounds, rounds_to_run) = match &a.replay {
        Some(path) => {
            let (r, n) = replay(path, &targets, &scenarios)?;
            results = r;
            (n, 0)
        }
        None => (rounds, rounds),
    };
    for round in 0..rounds_to_run {
        for &sc in &scenarios {
            // Rotate the order of frameworks and runtimes every round, so no framework always
            // runs first (or right after a particular other one).
            let mut order = targets.clone();
            let n = order.len();
            order.rotate_left(round % n);
            let mut flavors = a.runtimes.clone();
            let n = flavors.len();
            flavors.rotate_left(round % n);
            for &t in &order {
                for (f, m) in plan(t, sc, &flavors, settings.rate) {
                    let what = format!(
                        "[{}/{rounds}] {:?} {}x{} B {} {}{}",
                        round + 1,
                        sc.kind,
                        sc.concurrency,
                        sc.payload,
                        t.label(),
                        f.short(),
                        match m {
                            Method::BidiStream => " (bidi stream)",
                            Method::ServerStream => " (server streams)",
                            Method::BatchHandler => " (batch handler)",
                            Method::Bundled => " (bundled)",
                            Method::PingPong => " (ping-pong)",
                            _ => "",
                        }
                    );
                    match runner::measure(t, f, sc, m, &settings) {
                        Ok(s) => {
                            let lat = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or("-".into());
                            eprintln!(
                                "{what}: {:.0}/s p50 {} p99 {} us{}",
                                s.calls_per_s,
                                lat(s.p50_us),
                                lat(s.p99_us),
                                if s.missed > 0 { format!(" ({} missed)", s.missed) } else { String::new() }
                            );
                            if s.errors > 0 {
                                ok = false;
                                eprintln!(
                                    "{what}: {} errors, first: {}",
                                    s.errors,
                                    s.first_error.as_deref().unwrap_or("?")
                                );
                            }
                            if let Some(file) = samples_out.as_mut() {
                                use std::io::Write;
                                let line = serde_json::json!({
                                    "round": round + 1,
                                    "framework": t.framework(),
                                    "transport": t.transport(),
                                    "scenario": sc.kind,
                                    "payload": sc.payload,
                                    "concurrency": sc.concurrency,
                                    "method": m,
                                    "runtime": f,
                                    "calls": s.calls,
                                    "calls_per_s": s.calls_per_s,
                                    "p50_us": s.p50_us,
                                    "p99_us": s.p99_us,
                                    "p999_us": s.p999_us,
                                    "max_us": s.max_us,
                                    "cpu_us_per_call": s.cpu_us_per_call,
                                    "errors": s.errors,
                                    "missed": s.missed,
                                });
                                writeln!(file, "{line}").map_err(|e| e.to_string())?;
                            }
                            results.add((t, sc, m, f), s);
                        }
                        Err(e) => {
                            ok = false;
                            eprintln!("{what}: failed: {e}");
                        }
                    }
                }
            }
        }
    }
    if a.replay.is_none() {
        eprintln!("all measurements took {:.0} s", started.elapsed().as_secs_f64());
    }
    if a.json {
        for line in report::json_lines(&results, settings.rate) {
            println!("{line}");
        }
    } else {
        println!(
            "Medians of {rounds} round(s); each framework at its best runtime (ct = current-thread, \
             mt = one-worker multi-thread, th = plain threads){}; ratios are Volley's advantage \
             (above 1: Volley ahead); \"% of raw\" is Volley as a share of the raw ceiling (calls/s: \
             Volley ÷ raw; latency and CPU: raw ÷ Volley).\n",
            match settings.rate {
                Some(r) => format!("; fixed rate {r} calls/s, latency from scheduled send"),
                None => String::new(),
            }
        );
        print!("{}", report::table(&results, &scenarios));
        if settings.rate.is_none() {
            println!(
                "\nCPU time per call, server and client threads together (µs; each framework at its \
                 most frugal runtime; ratios peer ÷ Volley):\n"
            );
            print!("{}", report::cpu_table(&results, &scenarios));
        }
        // The goals are about capacity (closed loop); at a fixed rate every framework that
        // keeps up shows the same calls/s, so only the latency rows above say anything.
        if settings.rate.is_none() {
            println!("\nGoals, against this run:");
            print!("{}", report::goals(&results, &scenarios));
        }
    }
    Ok(ok)
}
