//! `volley bench overload`: goodput under overload, side by side: as Volley was before
//! deadlines crossed the wire (no budget sent), with deadlines sent, and with deadlines sent to
//! a server with an adaptive concurrency limit.
//!
//! One server (its own thread and runtime) whose handler burns `--work-us` of CPU per request;
//! callers on another thread. Each round, for each setting:
//! 1. **capacity**: closed-loop callers for 2 s give the calls/s the server can do;
//! 2. **overload**: `--factor` × capacity is offered, open loop, for `--seconds`, each call
//!    with a `--deadline-ms` timeout. Goodput is the replies that came back before their
//!    deadline, per second; *wasted* is the handler runs whose reply nobody waited for;
//! 3. **recovery**: after the overload stops, how long until a probe call is again as fast as
//!    before the overload (within 2× the median of quiet probes, or 1 ms more).
//!
//! With deadlines off, the client sends no budget: the server runs every request it reads,
//! however late (Volley before deadlines crossed the wire). With the limit, the server answers
//! `Overloaded` at once beyond a concurrency limit that follows its latency
//! ([`ConcurrencyLimit`]'s defaults).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use clap::Args;
use volley::{CallOptions, Client, ClientConfig, ConcurrencyLimit, Method, Server};

const WORK: Method<u64, u64> = Method::new("overload", "work");

#[derive(Args, Debug, Clone)]
pub struct OverloadArgs {
    /// CPU time the handler burns per request, in microseconds.
    #[arg(long, default_value_t = 200)]
    work_us: u64,
    /// Offered load during the overload, as a multiple of the measured capacity.
    #[arg(long, default_value_t = 10.0)]
    factor: f64,
    /// Each call's deadline (its timeout) during the overload, in milliseconds.
    #[arg(long, default_value_t = 50)]
    deadline_ms: u64,
    /// How long the overload lasts, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Rounds; each runs both settings, one after the other. Medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The client's bound on calls in flight (its default: 65,536). Calls beyond it wait in
    /// the client, where their own timeout ends them, instead of queueing before the server.
    #[arg(long)]
    max_in_flight: Option<usize>,
}

/// What the server and client of one run do about overload.
#[derive(Debug, Clone, Copy)]
struct Setting {
    name: &'static str,
    deadlines: bool,
    limit: bool,
}

const SETTINGS: [Setting; 3] = [
    Setting { name: "deadlines and the adaptive limit", deadlines: true, limit: true },
    Setting { name: "deadlines only", deadlines: true, limit: false },
    Setting { name: "neither (before deadlines crossed the wire)", deadlines: false, limit: false },
];

/// What one overload run measured.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    capacity: f64,
    offered: f64,
    goodput: f64,
    wasted_runs: u64,
    expired_at_server: u64,
    /// The server's concurrency limit when the overload ended, if it has one.
    limit_at_end: Option<usize>,
    recovery: Duration,
}

pub fn run(args: OverloadArgs) -> Result<(), String> {
    if args.work_us == 0 || args.factor <= 0.0 || args.seconds <= 0.0 || args.rounds == 0 {
        return Err("--work-us, --factor, --seconds and --rounds must be above zero".into());
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); SETTINGS.len()];
    for round in 1..=args.rounds {
        for (setting, runs) in SETTINGS.iter().zip(&mut runs) {
            let r = one_run(&args, *setting)?;
            eprintln!("round {round}, {}: {r:?}", setting.name);
            runs.push(r);
        }
    }
    println!(
        "overload: handler {} µs, {}× capacity for {} s, deadline {} ms, client in flight at most {}; \
         medians of {} rounds\n",
        args.work_us,
        args.factor,
        args.seconds,
        args.deadline_ms,
        args.max_in_flight.map_or("65,536 (default)".to_string(), |n| n.to_string()),
        args.rounds
    );
    println!(
        "| server and client | capacity (calls/s) | offered | goodput | goodput / capacity | wasted handler runs | expired at the server | recovery | limit at the end |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (Setting { name, .. }, runs) in SETTINGS.iter().zip(&runs) {
        let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let limit = match runs.iter().filter_map(|r| r.limit_at_end.map(|l| l as f64)).collect::<Vec<_>>() {
            limits if limits.is_empty() => "none".to_string(),
            limits => format!("{:.0}", median(limits)),
        };
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0}% | {:.0} | {:.0} | {:.0} ms | {limit} |",
            m(|r| r.capacity),
            m(|r| r.offered),
            m(|r| r.goodput),
            100.0 * m(|r| r.goodput / r.capacity),
            m(|r| r.wasted_runs as f64),
            m(|r| r.expired_at_server as f64),
            m(|r| r.recovery.as_secs_f64() * 1e3),
        );
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Burns `us` microseconds of CPU.
fn burn(us: u64) -> u64 {
    let t0 = Instant::now();
    let mut x = 0u64;
    while t0.elapsed() < Duration::from_micros(us) {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    x
}

fn one_run(args: &OverloadArgs, setting: Setting) -> Result<Run, String> {
    let runs = Arc::new(AtomicU64::new(0));
    let path = std::env::temp_dir().join(format!("volley-overload-{}.sock", std::process::id()));
    let addr = format!("unix://{}", path.display());
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let work_us = args.work_us;
    let counted = runs.clone();
    let server_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async move {
            let mut builder = Server::builder().handle_fn(&WORK, move |x: u64| {
                counted.fetch_add(1, Relaxed);
                Ok(x ^ burn(work_us))
            });
            if setting.limit {
                builder = builder.concurrency_limit(ConcurrencyLimit::default());
            }
            let server = builder.build();
            let bound = server.listen(&addr).await.map(|a| a.to_string());
            let _ = tx.send((bound, server.clone()));
            let _ = stop_rx.await;
            server.shutdown().await;
        })
    });
    let (bound, server) = rx.recv().map_err(|_| "the server thread ended")?;
    let bound = bound.map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let result = rt.block_on(measure(args, &bound, setting.deadlines, &runs, &server));
    let _ = stop_tx.send(());
    let _ = server_thread.join();
    result
}

async fn measure(
    args: &OverloadArgs,
    addr: &str,
    deadlines: bool,
    runs: &AtomicU64,
    server: &Server,
) -> Result<Run, String> {
    let mut config = ClientConfig::default().send_deadlines(deadlines);
    if let Some(n) = args.max_in_flight {
        config = config.max_in_flight(n);
    }
    let client = Client::connect_with(addr, config).await.map_err(|e| e.to_string())?;
    let quiet = probe_median(&client, 50).await?;
    let capacity = capacity(&client, Duration::from_secs(2)).await?;

    // Open loop: every millisecond, the calls due by then start, each on its own task.
    let offered = capacity * args.factor;
    let good = Arc::new(AtomicUsize::new(0));
    let (runs_before, expired_before) = (runs.load(Relaxed), server.expired_requests());
    let deadline = Duration::from_millis(args.deadline_ms);
    let t0 = tokio::time::Instant::now();
    let length = Duration::from_secs_f64(args.seconds);
    let mut started = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut calls = tokio::task::JoinSet::new();
    while t0.elapsed() < length {
        tick.tick().await;
        let due = (t0.elapsed().as_secs_f64() * offered) as u64;
        for _ in started..due {
            let (client, good) = (client.clone(), good.clone());
            calls.spawn(async move {
                if client.call_with(&WORK, 1, CallOptions::default().timeout(deadline)).await.is_ok() {
                    good.fetch_add(1, Relaxed);
                }
            });
        }
        started = due.max(started);
        while calls.try_join_next().is_some() {}
    }
    let elapsed = t0.elapsed();
    let stopped = Instant::now();
    let limit_at_end = server.concurrency().map(|(limit, _)| limit);
    let goodput = good.load(Relaxed) as f64 / elapsed.as_secs_f64();
    let recovery = recovery(&client, quiet, stopped).await?;
    while calls.join_next().await.is_some() {}
    let wasted_runs = (runs.load(Relaxed) - runs_before).saturating_sub(good.load(Relaxed) as u64);
    let expired_at_server = server.expired_requests() - expired_before;
    Ok(Run { capacity, offered, goodput, wasted_runs, expired_at_server, limit_at_end, recovery })
}

/// Calls/s of 64 closed-loop callers over `length`.
async fn capacity(client: &Client, length: Duration) -> Result<f64, String> {
    let done = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (client, done) = (client.clone(), done.clone());
            tokio::spawn(async move {
                while t0.elapsed() < length {
                    if client.call(&WORK, 1).await.is_ok() {
                        done.fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    Ok(done.load(Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

/// The median latency of `n` calls made one after another.
async fn probe_median(client: &Client, n: usize) -> Result<Duration, String> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.call(&WORK, 1).await.map_err(|e| e.to_string())?;
        v.push(t.elapsed());
    }
    v.sort();
    Ok(v[n / 2])
}

/// From `since`, how long until a probe call is as fast as a quiet one again (at most 30 s).
async fn recovery(client: &Client, quiet: Duration, since: Instant) -> Result<Duration, String> {
    let good_enough = (quiet * 2).max(quiet + Duration::from_millis(1));
    while since.elapsed() < Duration::from_secs(30) {
        let t = Instant::now();
        let ok =
            client.call_with(&WORK, 1, CallOptions::default().timeout(Duration::from_secs(30))).await.is_ok();
        if ok && t.elapsed() <= good_enough {
            return Ok(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(since.elapsed())
}
