//! `volley bench registry pollution|restart`: the registry under an operator's mistakes and an
//! attacker's, each against an undisturbed run in the same invocation.
//!
//! - **pollution**: 2 live echo servers and 2,000 registrations of dead addresses (tcp ports
//!   nothing listens on). A direct-mode client calls `echo` with 256 callers; the same client
//!   setup against a registry listing only the live servers is the clean run. Reported: the
//!   calls per second of each, in 250 ms steps, and when the polluted run first reaches half
//!   the clean run's steady rate.
//! - **restart**: 32 callers in relayed mode (every call through the controller). The
//!   controller runs on a thread and runtime of its own; in the disturbed run it is killed
//!   (its runtime dropped: every socket closes at once, as when a process dies) one second in,
//!   and a new one starts on the same address after the outage (1 s). Reported: calls lost
//!   against the uninterrupted run, in seconds of that run's rate, and the connection attempts
//!   the client and the server made while the controller was down.
//! - **names**: one peer registers `--names` services (default 320,000), each under a 50 ms
//!   lease it never renews, against a controller process (`volley controller --forget-after
//!   1`: it forgets a service 1 s after its last instance went). Reported: the controller
//!   process's resident memory idle, at the peak, once the names are forgotten and 2 s later,
//!   and the size of a `list` reply at the peak and after.
//! - **watches**: `--watches` watch long polls (default 60,000) over 4 connections against a
//!   controller process, each sent again as soon as it is answered (the controller holds up
//!   to its bounds and answers the rest at once). Beside it, on a thread of its own, a canary
//!   resolves a live service every 5 ms while that service's server renews a 3 s lease.
//!   Reported: the canary's resolve latency (p50, p99, max) without and with the flood, its
//!   `Overloaded` answers, and whether the live instance ever went missing.
//!
//! Client and servers run on two single-threaded runtimes (one core each), like `volley bench`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;
use volley::bytes::Bytes;
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::discovery::wire::{REGISTER, RegisterRequest};
use volley::registry::{LeaseConfig, Registry};
use volley::service_client::{Mode, ServiceConfig};
use volley::{Client, Server, ServiceClient};

use crate::echo::{ECHO, server_named};
use crate::output::outln;

#[derive(Args, Debug, Clone)]
pub struct RegistryBenchArgs {
    /// `pollution`: dead instances beside live ones (direct mode), against a clean registry;
    /// `restart`: the controller killed and restarted under relayed load, against an
    /// uninterrupted run.
    #[arg(value_enum)]
    scenario: Scenario,
    /// Dead instances registered (pollution).
    #[arg(long, default_value_t = 2000)]
    dead: usize,
    /// Service names registered under short leases (names).
    #[arg(long, default_value_t = 320_000)]
    names: usize,
    /// Watches kept outstanding over 4 connections (watches).
    #[arg(long, default_value_t = 60_000)]
    watches: usize,
    /// Live echo servers.
    #[arg(long, default_value_t = 2)]
    live: usize,
    /// Concurrent callers (default: 256 for pollution, 32 for restart).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 4.0)]
    duration: f64,
    /// Seconds the controller stays down (restart).
    #[arg(long, default_value_t = 1.0)]
    outage: f64,
    /// Rounds of (undisturbed, disturbed) runs, interleaved.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// One JSON object per round instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Scenario {
    Pollution,
    Restart,
    Names,
    Watches,
}

/// Width of one step of the time series.
const STEP: Duration = Duration::from_millis(250);

/// Calls completed and failed per step of one run.
#[derive(Debug, Clone, Serialize)]
struct Run {
    calls: u64,
    errors: u64,
    seconds: f64,
    calls_per_s: f64,
    /// Calls per second in each 250 ms step.
    steps: Vec<f64>,
    /// The first error, if any, with when it happened.
    first_error: Option<String>,
}

impl Run {
    /// The median step: the run's steady rate, whatever happened at its start.
    fn steady(&self) -> f64 {
        let mut s = self.steps.clone();
        s.sort_by(f64::total_cmp);
        s.get(s.len() / 2).copied().unwrap_or(0.0)
    }

    /// When the run first reached `rate` (the start of that step), in seconds.
    fn reached(&self, rate: f64) -> Option<f64> {
        self.steps.iter().position(|&r| r >= rate).map(|i| i as f64 * STEP.as_secs_f64())
    }

    /// Calls per second from `from` seconds on.
    fn rate_after(&self, from: f64) -> f64 {
        let skip = (from / STEP.as_secs_f64()).round() as usize;
        let rest = &self.steps[skip.min(self.steps.len())..];
        if rest.is_empty() { 0.0 } else { rest.iter().sum::<f64>() / rest.len() as f64 }
    }
}

#[derive(Serialize)]
struct PollutionReport {
    scenario: Scenario,
    round: usize,
    live: usize,
    dead: usize,
    concurrency: usize,
    clean: Run,
    polluted: Run,
    /// The clean run's steady rate (median 250 ms step).
    clean_steady_calls_per_s: f64,
    /// When the polluted run first reached half of it (seconds from its start).
    half_of_clean_after_s: Option<f64>,
    /// The polluted run's rate after its first 2 s, as a fraction of the clean steady rate.
    polluted_after_2s_ratio: f64,
    /// The polluted run's calls against the clean run's, each counted from its first call
    /// (the junk being ejected included).
    polluted_whole_run_ratio: f64,
    /// Instances the polluted run's client took out of rotation.
    instances_ejected: u64,
}

#[derive(Serialize)]
struct RestartReport {
    scenario: Scenario,
    round: usize,
    concurrency: usize,
    outage_s: f64,
    uninterrupted: Run,
    restarted: Run,
    /// Calls the restarted run lost against the uninterrupted one, in seconds of its rate.
    lost_s: f64,
    /// The same against the restarted run's own steady rate (its median step): less noisy
    /// when the two runs' rates differ (a shared machine).
    lost_against_own_rate_s: f64,
    /// Connection attempts to the controller while it was down, per second, by the client and
    /// by the echo server's registration.
    client_reconnects_per_s: f64,
    server_reconnects_per_s: f64,
    /// From the restart to the first step at half the uninterrupted run's steady rate.
    recovered_after_s: Option<f64>,
}

pub fn run(args: RegistryBenchArgs) -> Result<(), String> {
    match args.scenario {
        Scenario::Pollution => pollution(&args),
        Scenario::Restart => restart(&args),
        Scenario::Names => names(&args),
        Scenario::Watches => watches(&args),
    }
}

fn current_thread() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

/// Runs `start` on a thread and single-threaded runtime of its own until the returned stop
/// sender fires (or is dropped); returns what `start` produced.
fn on_own_thread<T: Send + 'static, K: Send + 'static>(
    start: impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = Result<(T, K), String>>>> + Send + 'static,
) -> Result<(T, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = match current_thread() {
            Ok(rt) => rt,
            Err(e) => return drop(tx.send(Err(e))),
        };
        rt.block_on(async move {
            match start().await {
                Ok((out, keep)) => {
                    let _ = tx.send(Ok(out));
                    let _ = stop_rx.await;
                    drop(keep);
                }
                Err(e) => drop(tx.send(Err(e))),
            }
        });
        // Dropping the runtime drops every task and socket at once.
        drop(rt);
    });
    let out = rx.recv().map_err(|e| e.to_string())??;
    Ok((out, stop_tx, thread))
}

/// `concurrency` callers calling `echo` through `client` for `duration`, counted per step.
/// `during` runs beside them (the restart scenario kills the controller from it).
async fn drive(
    client: &ServiceClient,
    concurrency: usize,
    duration: Duration,
    during: impl Future<Output = ()>,
) -> Run {
    let steps = (duration.as_secs_f64() / STEP.as_secs_f64()).ceil() as usize;
    let ok: Arc<Vec<AtomicU64>> = Arc::new((0..steps).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::OnceLock::new());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let payload = Bytes::from_static(&[0xA5; 64]);
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, ok, errors, stop, p) =
            (client.clone(), ok.clone(), errors.clone(), stop.clone(), payload.clone());
        let first_error = first_error.clone();
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let r = client.call(&ECHO, p.clone()).await;
                let step = (start.elapsed().as_secs_f64() / STEP.as_secs_f64()) as usize;
                match r {
                    Ok(_) if step < ok.len() => drop(ok[step].fetch_add(1, Relaxed)),
                    Ok(_) => {}
                    Err(e) => {
                        errors.fetch_add(1, Relaxed);
                        let _ = first_error.set(format!("{:.2} s: {e}", start.elapsed().as_secs_f64()));
                        // A failing call returns at once: let the other tasks (the controller's
                        // restart, the counters) run.
                        tokio::task::yield_now().await;
                    }
                }
            }
        }));
    }
    tokio::join!(during, tokio::time::sleep(duration));
    stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let seconds = duration.as_secs_f64();
    let per_step: Vec<u64> = ok.iter().map(|c| c.load(Relaxed)).collect();
    let calls: u64 = per_step.iter().sum();
    Run {
        calls,
        errors: errors.load(Relaxed),
        seconds,
        calls_per_s: calls as f64 / seconds,
        steps: per_step.iter().map(|&c| c as f64 / STEP.as_secs_f64()).collect(),
        first_error: first_error.get().cloned(),
    }
}

/// A registry controller with `live` echo servers registered, on a thread of its own.
struct Fleet {
    registry: String,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Fleet {
    fn start(live: usize) -> Result<Fleet, String> {
        let (registry, stop, thread) = on_own_thread(move || {
            Box::pin(async move {
                let controller = Controller::new(ControllerConfig::default());
                let addr =
                    controller.listen("tcp://127.0.0.1:0").await.map_err(|e| e.to_string())?.to_string();
                let registry = Registry::connect(&addr).await.map_err(|e| e.to_string())?;
                let mut servers: Vec<Server> = Vec::new();
                for _ in 0..live {
                    let s = server_named(ECHO.service());
                    let bound = s.listen("tcp://127.0.0.1:0").await.map_err(|e| e.to_string())?;
                    let spec = InstanceSpec::new(ECHO.service(), bound.to_string());
                    registry
                        .register(&s, vec![spec], LeaseConfig::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    servers.push(s);
                }
                Ok((addr, (controller, registry, servers)))
            })
        })?;
        Ok(Fleet { registry, stop, thread })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Registers `n` tcp addresses nothing listens on, one registration each (as anyone may when
/// the controller has no registration credential), under leases that outlast the run.
async fn pollute(registry: &str, n: usize) -> Result<(), String> {
    let raw = Client::connect(registry).await.map_err(|e| e.to_string())?;
    let mut dead = std::collections::BTreeSet::new();
    while dead.len() < n {
        // A port the kernel just handed out and took back: connecting to it is refused.
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        dead.insert(format!("tcp://{}", l.local_addr().map_err(|e| e.to_string())?));
    }
    let mut registrations = tokio::task::JoinSet::new();
    for address in dead {
        let req = RegisterRequest {
            lease: 0,
            ttl_ms: 300_000,
            instances: vec![InstanceSpec::new(ECHO.service(), address)],
            credential: String::new(),
        };
        let raw = raw.clone();
        registrations.spawn(async move { raw.call(&REGISTER, req).await });
    }
    while let Some(r) = registrations.join_next().await {
        r.map_err(|e| e.to_string())?.map_err(|e| format!("registering a dead instance: {e}"))?;
    }
    Ok(())
}

fn pollution(args: &RegistryBenchArgs) -> Result<(), String> {
    let concurrency = args.concurrency.unwrap_or(256);
    let duration = Duration::from_secs_f64(args.duration);
    let rt = current_thread()?;
    let (mut half, mut ratio, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=args.rounds.max(1) {
        let clean_fleet = Fleet::start(args.live)?;
        let polluted_fleet = Fleet::start(args.live)?;
        let report = rt.block_on(async {
            pollute(&polluted_fleet.registry, args.dead).await?;
            let config = ServiceConfig::default().mode(Mode::Direct);
            let clean_client = ServiceClient::connect_with(&clean_fleet.registry, config.clone())
                .await
                .map_err(|e| e.to_string())?;
            let clean = drive(&clean_client, concurrency, duration, async {}).await;
            let client = ServiceClient::connect_with(&polluted_fleet.registry, config)
                .await
                .map_err(|e| e.to_string())?;
            let polluted = drive(&client, concurrency, duration, async {}).await;
            let steady = clean.steady();
            Ok::<_, String>(PollutionReport {
                scenario: Scenario::Pollution,
                round,
                live: args.live,
                dead: args.dead,
                concurrency,
                half_of_clean_after_s: polluted.reached(steady * 0.5),
                polluted_after_2s_ratio: polluted.rate_after(2.0) / steady.max(f64::MIN_POSITIVE),
                polluted_whole_run_ratio: polluted.calls_per_s / clean.calls_per_s.max(f64::MIN_POSITIVE),
                instances_ejected: client.stats().instances_dropped,
                clean_steady_calls_per_s: steady,
                clean,
                polluted,
            })
        })?;
        clean_fleet.stop();
        polluted_fleet.stop();
        half.push(report.half_of_clean_after_s.unwrap_or(f64::INFINITY));
        ratio.push(report.polluted_after_2s_ratio);
        whole.push(report.polluted_whole_run_ratio);
        if args.json {
            outln!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
        } else {
            print_pollution(&report);
        }
    }
    if args.rounds > 1 && !args.json {
        outln!(
            "median of {} rounds: half of the clean rate after {:.2} s; {:.2} of it after 2 s; {:.2} of the clean run's calls from the start",
            args.rounds,
            median(&mut half),
            median(&mut ratio),
            median(&mut whole)
        );
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn print_pollution(r: &PollutionReport) {
    outln!(
        "registry pollution, round {}: {} live + {} dead instances (tcp), direct mode, {} callers, {:.1} s per run",
        r.round,
        r.live,
        r.dead,
        r.concurrency,
        r.clean.seconds
    );
    outln!(
        "  clean:    {:>9.0} calls/s ({:.0} steady), {} errors",
        r.clean.calls_per_s,
        r.clean_steady_calls_per_s,
        r.clean.errors
    );
    outln!(
        "  polluted: {:>9.0} calls/s, {} errors, {} instances ejected",
        r.polluted.calls_per_s,
        r.polluted.errors,
        r.instances_ejected
    );
    if let Some(e) = &r.polluted.first_error {
        outln!("  polluted, first error at {e}");
    }
    let steps: Vec<String> = r.polluted.steps.iter().map(|s| format!("{:.0}", s / 1000.0)).collect();
    outln!("  polluted, k calls/s per 250 ms: {}", steps.join(" "));
    match r.half_of_clean_after_s {
        Some(t) => outln!("  half of the clean rate reached after {t:.2} s"),
        None => outln!("  half of the clean rate never reached"),
    }
    outln!("  after 2 s: {:.2} of the clean rate", r.polluted_after_2s_ratio);
    outln!("  from the start: {:.2} of the clean run's calls", r.polluted_whole_run_ratio);
}

/// A controller on a thread and runtime of its own, listening on `addr`.
fn start_controller(
    addr: &str,
) -> Result<(String, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>), String> {
    let addr = addr.to_string();
    on_own_thread(move || {
        Box::pin(async move {
            let c = Controller::new(ControllerConfig::default());
            let bound = c.listen(&addr).await.map_err(|e| e.to_string())?.to_string();
            Ok((bound, c))
        })
    })
}

fn restart(args: &RegistryBenchArgs) -> Result<(), String> {
    let concurrency = args.concurrency.unwrap_or(32);
    let duration = Duration::from_secs_f64(args.duration);
    let outage = Duration::from_secs_f64(args.outage);
    let kill_at = Duration::from_secs(1);
    if kill_at + outage >= duration {
        return Err(format!("--duration must be longer than 1 s + --outage ({:.1} s)", args.outage));
    }
    let rt = current_thread()?;
    let (mut lost, mut lost_own, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=args.rounds.max(1) {
        let (uninterrupted, _, _) = restart_run(&rt, concurrency, duration, None)?;
        let (restarted, client_attempts, server_attempts) =
            restart_run(&rt, concurrency, duration, Some((kill_at, outage)))?;
        let steady = uninterrupted.steady();
        let back = kill_at + outage;
        let recovered = restarted
            .steps
            .iter()
            .enumerate()
            .skip((back.as_secs_f64() / STEP.as_secs_f64()) as usize)
            .find(|(_, r)| **r >= steady * 0.5)
            .map(|(i, _)| i as f64 * STEP.as_secs_f64() - back.as_secs_f64());
        let report = RestartReport {
            scenario: Scenario::Restart,
            round,
            concurrency,
            outage_s: outage.as_secs_f64(),
            lost_s: (uninterrupted.calls as f64 - restarted.calls as f64)
                / uninterrupted.calls_per_s.max(1.0),
            lost_against_own_rate_s: {
                let own = restarted.steady().max(1.0);
                (own * restarted.seconds - restarted.calls as f64) / own
            },
            client_reconnects_per_s: client_attempts as f64 / outage.as_secs_f64(),
            server_reconnects_per_s: server_attempts as f64 / outage.as_secs_f64(),
            recovered_after_s: recovered,
            uninterrupted,
            restarted,
        };
        lost.push(report.lost_s);
        lost_own.push(report.lost_against_own_rate_s);
        attempts.push(report.client_reconnects_per_s.max(report.server_reconnects_per_s));
        if args.json {
            outln!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
        } else {
            print_restart(&report);
        }
    }
    if args.rounds > 1 && !args.json {
        let most = attempts.iter().copied().fold(0.0, f64::max);
        outln!(
            "median of {} rounds: {:.2} s of calls lost ({:.2} s against the run's own rate); at most \
             {most:.1} connection attempts a second while down",
            args.rounds,
            median(&mut lost),
            median(&mut lost_own)
        );
    }
    Ok(())
}

/// One relayed run; with `kill`, the controller goes down at the first instant for the
/// second. Returns the run and the connection attempts to the controller while it was down
/// (by the client, by the echo server's registration).
fn restart_run(
    rt: &tokio::runtime::Runtime,
    concurrency: usize,
    duration: Duration,
    kill: Option<(Duration, Duration)>,
) -> Result<(Run, u64, u64), String> {
    let (ctl_addr, ctl_stop, ctl_thread) = start_controller("tcp://127.0.0.1:0")?;
    let server_addr = ctl_addr.clone();
    let ((server_registry, _), server_stop, server_thread) = on_own_thread(move || {
        Box::pin(async move {
            let registry = Registry::connect(&server_addr).await.map_err(|e| e.to_string())?;
            let s = server_named(ECHO.service());
            let bound = s.listen("tcp://127.0.0.1:0").await.map_err(|e| e.to_string())?;
            let spec = InstanceSpec::new(ECHO.service(), bound.to_string());
            registry.register(&s, vec![spec], LeaseConfig::default()).await.map_err(|e| e.to_string())?;
            Ok(((registry.clone(), ()), (s, registry)))
        })
    })?;
    let attempts = Arc::new(std::sync::Mutex::new((0u64, 0u64)));
    let result = rt.block_on(async {
        let config = ServiceConfig::default().mode(Mode::Relayed);
        let client = ServiceClient::connect_with(&ctl_addr, config).await.map_err(|e| e.to_string())?;
        let mut controller = Some((ctl_stop, ctl_thread));
        let mut restarted = None;
        let during = async {
            let Some((at, outage)) = kill else { return };
            tokio::time::sleep(at).await;
            let (stop, thread) = controller.take().expect("running");
            let _ = stop.send(());
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            let before = (client.registry().stats().reconnects, server_registry.stats().reconnects);
            tokio::time::sleep(outage).await;
            let after = (client.registry().stats().reconnects, server_registry.stats().reconnects);
            *attempts.lock().expect("not poisoned") = (after.0 - before.0, after.1 - before.1);
            let addr = ctl_addr.clone();
            restarted =
                tokio::task::spawn_blocking(move || start_controller(&addr)).await.ok().and_then(Result::ok);
        };
        let run = drive(&client, concurrency, duration, during).await;
        if let Some((stop, thread)) = controller.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
        if let Some((_, stop, thread)) = restarted {
            let _ = stop.send(());
            let _ = thread.join();
        }
        Ok::<_, String>(run)
    });
    let _ = server_stop.send(());
    let _ = server_thread.join();
    let (client_attempts, server_attempts) = *attempts.lock().expect("not poisoned");
    Ok((result?, client_attempts, server_attempts))
}

fn print_restart(r: &RestartReport) {
    outln!(
        "registry restart, round {}: relayed mode, {} callers, {:.1} s per run, controller down {:.1} s from 1 s in",
        r.round,
        r.concurrency,
        r.uninterrupted.seconds,
        r.outage_s
    );
    outln!(
        "  uninterrupted: {:>9.0} calls/s, {} errors",
        r.uninterrupted.calls_per_s,
        r.uninterrupted.errors
    );
    outln!("  restarted:     {:>9.0} calls/s, {} errors", r.restarted.calls_per_s, r.restarted.errors);
    if let Some(e) = &r.restarted.first_error {
        outln!("  restarted, first error at {e}");
    }
    let steps: Vec<String> = r.restarted.steps.iter().map(|s| format!("{:.0}", s / 1000.0)).collect();
    outln!("  restarted, k calls/s per 250 ms: {}", steps.join(" "));
    outln!(
        "  calls lost: {:.2} s of the uninterrupted rate ({:.2} s of the run's own steady rate)",
        r.lost_s,
        r.lost_against_own_rate_s
    );
    match r.recovered_after_s {
        Some(t) => outln!("  half of the uninterrupted rate again {t:.2} s after the restart"),
        None => outln!("  never back to half of the uninterrupted rate"),
    }
    outln!(
        "  connection attempts while down: client {:.1}/s, server {:.1}/s",
        r.client_reconnects_per_s,
        r.server_reconnects_per_s
    );
}

#[derive(Serialize)]
struct NamesReport {
    scenario: Scenario,
    names: usize,
    registered_per_s: f64,
    /// The controller process's resident memory, started and connected to.
    rss_idle_mib: f64,
    rss_peak_mib: f64,
    /// When `list` first answers with no service left.
    rss_forgotten_mib: f64,
    /// Two seconds later (the controller hands freed memory back after the last sweep of a
    /// wave of forgotten names).
    rss_after_mib: f64,
    list_bytes_peak: usize,
    list_omitted_peak: u64,
    list_bytes_after: usize,
}

/// A process's resident memory, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

/// `volley controller` (this binary) as a child process, killed when dropped.
struct ControllerProcess(std::process::Child);

impl ControllerProcess {
    /// Starts one that forgets a service `forget_after` after its last instance; returns it
    /// and the address it bound (the first line it prints).
    fn start(forget_after: Duration) -> Result<(ControllerProcess, String), String> {
        use std::io::BufRead;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = std::process::Command::new(exe)
            .args(["controller", "--listen", "tcp://127.0.0.1:0", "--forget-after"])
            .arg(forget_after.as_secs_f64().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the controller: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let proc = ControllerProcess(child);
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
        let addr = line.trim().to_string();
        if addr.is_empty() {
            return Err("the controller printed no address".into());
        }
        Ok((proc, addr))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The controller runs as a process of its own (`volley controller --forget-after 1`), so its
/// resident memory is measured alone, without the registering peer's.
fn names(args: &RegistryBenchArgs) -> Result<(), String> {
    use volley::discovery::wire::LIST;
    let rt = current_thread()?;
    let (controller, addr) = ControllerProcess::start(Duration::from_secs(1))?;
    let pid = controller.pid();
    let r = rt.block_on(async {
        let raw = Client::connect(&addr).await.map_err(|e| e.to_string())?;
        let list = async || -> Result<(usize, u64, usize), String> {
            let l = raw.call(&LIST, ()).await.map_err(|e| format!("list: {e}"))?;
            let bytes = serde_json::to_vec(&l).map_err(|e| e.to_string())?.len();
            Ok((bytes, l.omitted, l.services.len()))
        };
        list().await?;
        let rss_idle_mib = rss_mib(pid);
        let t0 = Instant::now();
        let mut in_flight = tokio::task::JoinSet::new();
        let mut rss_peak_mib = rss_idle_mib;
        for k in 0..args.names {
            let req = RegisterRequest {
                lease: 0,
                ttl_ms: 50,
                instances: vec![InstanceSpec::new(format!("lapsed-name-{k:08}"), "tcp://127.0.0.1:9")],
                credential: String::new(),
            };
            let raw = raw.clone();
            in_flight.spawn(async move { raw.call(&REGISTER, req).await });
            if in_flight.len() >= 256 {
                in_flight
                    .join_next()
                    .await
                    .expect("one")
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
            }
            if k % 10_000 == 0 {
                rss_peak_mib = rss_peak_mib.max(rss_mib(pid));
            }
        }
        while let Some(r) = in_flight.join_next().await {
            r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        }
        let registered_per_s = args.names as f64 / t0.elapsed().as_secs_f64();
        let (list_bytes_peak, list_omitted_peak, _) = list().await?;
        rss_peak_mib = rss_peak_mib.max(rss_mib(pid));
        let deadline = Instant::now() + Duration::from_secs(120);
        let list_bytes_after = loop {
            rss_peak_mib = rss_peak_mib.max(rss_mib(pid));
            let (bytes, omitted, services) = list().await?;
            if services == 0 && omitted == 0 {
                break bytes;
            }
            if Instant::now() > deadline {
                return Err(format!("{} names still listed after 120 s", services as u64 + omitted));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let rss_forgotten_mib = rss_mib(pid);
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok::<_, String>(NamesReport {
            scenario: Scenario::Names,
            names: args.names,
            registered_per_s,
            rss_idle_mib,
            rss_peak_mib,
            rss_forgotten_mib,
            rss_after_mib: rss_mib(pid),
            list_bytes_peak,
            list_omitted_peak,
            list_bytes_after,
        })
    })?;
    drop(controller);
    if args.json {
        outln!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    } else {
        outln!(
            "registry names: {} services under 50 ms leases, one peer ({:.0} registrations/s), forgotten 1 s after their last instance",
            r.names,
            r.registered_per_s
        );
        outln!(
            "  controller's resident memory: idle {:.1} MiB, peak {:.1} MiB, all forgotten {:.1} MiB, 2 s later {:.1} MiB ({:.1}× idle)",
            r.rss_idle_mib,
            r.rss_peak_mib,
            r.rss_forgotten_mib,
            r.rss_after_mib,
            r.rss_after_mib / r.rss_idle_mib.max(f64::MIN_POSITIVE)
        );
        outln!(
            "  list reply: {} bytes at the peak ({} services omitted), {} bytes after",
            r.list_bytes_peak,
            r.list_omitted_peak,
            r.list_bytes_after
        );
    }
    Ok(())
}

/// A canary's resolves: latency in microseconds, and what went wrong.
#[derive(Serialize)]
struct Canary {
    resolves: u64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    overloaded: u64,
    /// Other errors.
    errors: u64,
    /// Resolves that found the live instance missing (its lease lapsed).
    missing: u64,
}

#[derive(Serialize)]
struct WatchesReport {
    scenario: Scenario,
    watches: usize,
    seconds: f64,
    quiet: Canary,
    flooded: Canary,
    /// Watches answered per second during the flooded run (held ones at their timeout, the
    /// rest at once).
    watches_answered_per_s: f64,
    /// Watch calls that failed (refused, not answered).
    watches_failed: u64,
}

/// Resolves `service` every 5 ms for `duration` on its own connection.
async fn canary(addr: &str, service: &str, duration: Duration) -> Result<Canary, String> {
    use volley::discovery::wire::RESOLVE;
    let c = Client::connect(addr).await.map_err(|e| e.to_string())?;
    let mut h = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let (mut overloaded, mut errors, mut missing) = (0, 0, 0);
    let end = Instant::now() + duration;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < end {
        tick.tick().await;
        let t = Instant::now();
        let r = c.call(&RESOLVE, service.to_string()).await;
        h.record(t.elapsed().as_micros() as u64).map_err(|e| e.to_string())?;
        match r {
            Ok(r) if r.instances.is_empty() => missing += 1,
            Ok(_) => {}
            Err(e) if e.code() == Some(volley::Code::Overloaded) => overloaded += 1,
            Err(_) => errors += 1,
        }
    }
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(Canary {
        resolves: h.len(),
        p50_ms: ms(h.value_at_quantile(0.5)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        overloaded,
        errors,
        missing,
    })
}

fn watches(args: &RegistryBenchArgs) -> Result<(), String> {
    use volley::discovery::wire::{RESOLVE, WATCH, WatchRequest};
    const CONNECTIONS: usize = 4;
    let duration = Duration::from_secs_f64(args.duration);
    let (controller, addr) = ControllerProcess::start(Duration::from_secs(60))?;
    let rt = current_thread()?;
    // The live service, renewing a 3 s lease (a third of it between renewals).
    let (_live, epoch) = rt.block_on(async {
        let registry = Registry::connect(&addr).await.map_err(|e| e.to_string())?;
        let s = server_named(ECHO.service());
        let bound = s.listen("tcp://127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let spec = InstanceSpec::new(ECHO.service(), bound.to_string());
        let mut lease = LeaseConfig::default();
        lease.ttl = Duration::from_secs(3);
        let registration = registry.register(&s, vec![spec], lease).await.map_err(|e| e.to_string())?;
        let raw = Client::connect(&addr).await.map_err(|e| e.to_string())?;
        let epoch = raw.call(&RESOLVE, ECHO.service().to_string()).await.map_err(|e| e.to_string())?.epoch;
        Ok::<_, String>(((s, registry, registration), epoch))
    })?;
    let quiet = rt.block_on(canary(&addr, ECHO.service(), duration))?;

    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (flood_addr, total) = (addr.clone(), args.watches);
    let (a, f) = (answered.clone(), failed.clone());
    let ((), stop, thread) = on_own_thread(move || {
        Box::pin(async move {
            let mut clients = Vec::new();
            for _ in 0..CONNECTIONS {
                clients.push(Client::connect(&flood_addr).await.map_err(|e| e.to_string())?);
            }
            for k in 0..total {
                let c = clients[k % CONNECTIONS].clone();
                let (a, f) = (a.clone(), f.clone());
                let w = WatchRequest {
                    service: format!("quiet-{}", k % 10),
                    epoch,
                    from_revision: u64::MAX / 2,
                    timeout_ms: 60_000,
                    client_id: 0,
                };
                // Dropped with the runtime when the flood stops.
                tokio::spawn(async move {
                    loop {
                        match c.call(&WATCH, w.clone()).await {
                            Ok(_) => a.fetch_add(1, Relaxed),
                            Err(_) => f.fetch_add(1, Relaxed),
                        };
                        tokio::task::yield_now().await;
                    }
                });
            }
            Ok(((), clients))
        })
    })?;
    // The flood in place: more answered than a round of it. (On the runtime: the live
    // server's lease keeper runs on it.)
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while answered.load(Relaxed) < total as u64 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let a0 = answered.load(Relaxed);
    let t0 = Instant::now();
    let flooded = rt.block_on(canary(&addr, ECHO.service(), duration))?;
    let watches_answered_per_s = (answered.load(Relaxed) - a0) as f64 / t0.elapsed().as_secs_f64();
    let _ = stop.send(());
    let _ = thread.join();
    drop(controller);
    let r = WatchesReport {
        scenario: Scenario::Watches,
        watches: total,
        seconds: duration.as_secs_f64(),
        quiet,
        flooded,
        watches_answered_per_s,
        watches_failed: failed.load(Relaxed),
    };
    if args.json {
        outln!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    } else {
        outln!(
            "registry watches: {} watches kept outstanding over {CONNECTIONS} connections, a canary resolving every 5 ms for {:.1} s",
            r.watches,
            r.seconds
        );
        for (name, c) in [("quiet", &r.quiet), ("flooded", &r.flooded)] {
            outln!(
                "  {name:<8} {} resolves: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} Overloaded, {} other errors, {} without the live instance",
                c.resolves,
                c.p50_ms,
                c.p99_ms,
                c.max_ms,
                c.overloaded,
                c.errors,
                c.missing
            );
        }
        outln!("  flood: {:.0} watches answered/s, {} refused", r.watches_answered_per_s, r.watches_failed);
    }
    Ok(())
}
