//! `volley bench rolling`: a rolling restart under load, with real processes.
//!
//! A registry controller and `--instances` echo servers run as processes of this same binary
//! (`volley controller`, `volley serve-echo --registry … --record-calls FILE`). `--concurrency`
//! callers call `echo` through one [`ServiceClient`] (direct or relayed mode). After a steady
//! while, each instance in turn gets the stop signal (SIGTERM, SIGINT, or SIGKILL with
//! `--kill`); once its process is gone a new one is started (a new port) and registers, then
//! load runs steady again before the next; `--rounds` times over.
//!
//! Every call carries a unique id in its first 8 bytes, and every serving process records the
//! id of each request its handler ran (`--record-calls`, `call_record.rs`), so calls run twice
//! are counted where they ran. Reported: calls, failed calls by error kind, calls run twice,
//! calls resent because they never ran and calls retried, p50/p99 before, during and after each
//! restart (by when the call started), the time from signal to process exit, and from signal to
//! the instance's absence from the controller's list (`volley ls`).
//!
//! The callers run on a thread and single-threaded runtime of their own; the restarts and the
//! list polling on another, so neither's timing waits on the other.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;
use volley::bytes::Bytes;
use volley::registry::Registry;
use volley::service_client::{Mode, ServiceClientStats, ServiceConfig};
use volley::{CallOptions, Error, ServiceClient};

use crate::call_record;
use crate::echo::ECHO;
use crate::output::outln;

#[derive(Args, Debug, Clone)]
pub struct RollingArgs {
    /// Echo server processes registered with the controller.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Times every instance is restarted.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How the callers reach the instances: direct, relayed (through the controller), or both
    /// (one run after the other).
    #[arg(long, value_enum, default_value = "direct")]
    mode: ModeArg,
    /// The stop signal: term (SIGTERM, as systemd, Kubernetes and Docker send) or int (SIGINT,
    /// Ctrl-C).
    #[arg(long, value_enum, default_value = "term")]
    signal: SignalArg,
    /// Stop every instance with SIGKILL instead, for comparison: nothing graceful happens.
    #[arg(long)]
    kill: bool,
    /// Seconds of steady load before the first restart and after each.
    #[arg(long, default_value_t = 1.0)]
    steady: f64,
    /// The instances' `--grace`: seconds they serve after deregistering.
    #[arg(long, default_value_t = 1.0)]
    grace: f64,
    /// Mark the calls idempotent (then calls that may have run are retried too). Default: not
    /// idempotent, so only calls that never ran may go again.
    #[arg(long)]
    idempotent: bool,
    /// Payload bytes per call (at least 8: the call's id).
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// One JSON object per mode instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ModeArg {
    Direct,
    Relayed,
    Both,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum SignalArg {
    Term,
    Int,
}

/// How an instance is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Signal(libc::c_int),
    Kill,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Stop::Signal(libc::SIGTERM) => "SIGTERM",
            Stop::Signal(libc::SIGINT) => "SIGINT",
            Stop::Signal(_) => "signal",
            Stop::Kill => "SIGKILL",
        }
    }
}

/// Latency of the calls that succeeded in one window, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
struct Latency {
    calls: u64,
    p50_us: u64,
    p99_us: u64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        Latency { calls: h.len(), p50_us: h.value_at_quantile(0.5), p99_us: h.value_at_quantile(0.99) }
    }
}

/// One instance's restart.
#[derive(Debug, Clone, Serialize)]
struct Restart {
    round: usize,
    instance: usize,
    /// From the signal to the process's exit.
    stop_ms: f64,
    /// From the signal to the first listing of the controller without the instance (`None`:
    /// still listed when the bench ended).
    gone_from_list_ms: Option<f64>,
    /// From the signal to the new process's registration.
    replaced_ms: f64,
    before: Latency,
    during: Latency,
    after: Latency,
}

#[derive(Debug, Serialize)]
struct Report {
    mode: Mode,
    stop: &'static str,
    instances: usize,
    rounds: usize,
    concurrency: usize,
    idempotent: bool,
    grace_s: f64,
    /// The instances' drain deadline (handlers still running after the go-away get this long).
    drain_deadline_s: f64,
    seconds: f64,
    /// Calls sent (each with its own id) = ok + failed.
    calls: u64,
    ok: u64,
    failed: u64,
    failed_by_kind: BTreeMap<String, u64>,
    /// Failed calls whose handler did run (their reply was lost).
    failed_that_ran: u64,
    /// Calls whose handler ran more than once, and the runs past the first.
    run_twice: u64,
    extra_runs: u64,
    /// Handler runs recorded by every process.
    executions: u64,
    /// Runs whose id a killed process never got to store (counted, id unknown).
    unrecorded_runs: u64,
    /// Calls sent again because their instance never ran them (`NotRun`), and calls retried
    /// after an error that leaves it open whether they ran (idempotent calls only): by the
    /// client in direct mode, by the controller's relay in relayed mode.
    resent_not_run: u64,
    retried: u64,
    /// Every steady window together, and every restart window together.
    steady: Latency,
    during: Latency,
    during_p99_over_steady: f64,
    worst_during_p99_over_steady: f64,
    max_stop_ms: f64,
    max_gone_from_list_ms: Option<f64>,
    restarts: Vec<Restart>,
}

pub fn run(args: RollingArgs) -> Result<(), String> {
    if args.instances == 0 || args.rounds == 0 || args.concurrency == 0 {
        return Err("--instances, --rounds and --concurrency must be at least 1".into());
    }
    if args.payload < 8 {
        return Err(format!("--payload {}: at least 8 bytes (the call's id)", args.payload));
    }
    if !(args.steady.is_finite() && args.steady > 0.0 && args.grace.is_finite() && args.grace >= 0.0) {
        return Err("--steady must be a positive number of seconds and --grace 0 or more".into());
    }
    let modes = match args.mode {
        ModeArg::Direct => vec![Mode::Direct],
        ModeArg::Relayed => vec![Mode::Relayed],
        ModeArg::Both => vec![Mode::Direct, Mode::Relayed],
    };
    for mode in modes {
        let report = run_mode(&args, mode)?;
        if args.json {
            outln!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
        } else {
            print(&report);
        }
    }
    Ok(())
}

/// What the callers share with the restarts.
struct Load {
    /// The window calls starting now count in: 0 the warm-up, then steady and restart windows
    /// in turn (odd: steady, even from 2: a restart).
    window: AtomicUsize,
    stop: AtomicBool,
    next_id: AtomicU64,
    tallies: Mutex<Tallies>,
}

struct Tallies {
    windows: Vec<Histogram<u64>>,
    ok: u64,
    failed_by_kind: BTreeMap<String, u64>,
    failed_ids: Vec<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
}

fn run_mode(args: &RollingArgs, mode: Mode) -> Result<Report, String> {
    let stop = match (args.kill, args.signal) {
        (true, _) => Stop::Kill,
        (false, SignalArg::Term) => Stop::Signal(libc::SIGTERM),
        (false, SignalArg::Int) => Stop::Signal(libc::SIGINT),
    };
    let restarts = args.instances * args.rounds;
    let windows = 2 * restarts + 2;
    let load = Arc::new(Load {
        window: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        next_id: AtomicU64::new(1),
        tallies: Mutex::new(Tallies {
            windows: (0..windows).map(|_| histogram()).collect(),
            ok: 0,
            failed_by_kind: BTreeMap::new(),
            failed_ids: Vec::new(),
        }),
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let (measured, mut fleet) = rt.block_on(async {
        let mut fleet = Fleet::start(args.instances, args.grace).await?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let callers = std::thread::spawn({
            let (load, registry) = (load.clone(), fleet.registry.clone());
            let (n, size, idempotent) = (args.concurrency, args.payload, args.idempotent);
            move || drive(&registry, mode, n, size, idempotent, &load, ready_tx)
        });
        let measured = async {
            ready_rx.await.map_err(|_| "the callers' thread ended".to_string())??;
            restart_all(args, &mut fleet, &load, stop).await
        }
        .await;
        load.stop.store(true, Relaxed);
        let client_stats = callers.join().map_err(|_| "the callers' thread panicked".to_string())??;
        let (mut restarts, polls) = measured?;
        // The last listings (a killed instance stays listed until its lease lapses).
        for (r, poll) in restarts.iter_mut().zip(polls) {
            r.gone_from_list_ms = poll.await.ok().flatten();
        }
        let resends = match mode {
            Mode::Relayed => relay_resends(&fleet.admin).await?,
            _ => resends(&client_stats),
        };
        fleet.stop_all().await;
        Ok::<_, String>(((restarts, resends), fleet))
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let (restarts, (resent_not_run, retried)) = measured;
    let t = load.tallies.lock().expect("not poisoned");
    let ran = fleet.executions()?;
    let failed: u64 = t.failed_by_kind.values().sum();
    let failed_that_ran = t.failed_ids.iter().filter(|id| ran.counts.contains_key(id)).count() as u64;
    let mut steady = histogram();
    let mut during = histogram();
    for (i, h) in t.windows.iter().enumerate().skip(1) {
        let _ = if i % 2 == 1 { steady.add(h) } else { during.add(h) };
    }
    let steady = Latency::of(&steady);
    let during = Latency::of(&during);
    let ratio = |l: &Latency| l.p99_us as f64 / steady.p99_us.max(1) as f64;
    let restarts: Vec<Restart> = restarts
        .into_iter()
        .enumerate()
        .map(|(k, r)| Restart {
            before: Latency::of(&t.windows[2 * k + 1]),
            during: Latency::of(&t.windows[2 * k + 2]),
            after: Latency::of(&t.windows[2 * k + 3]),
            ..r
        })
        .collect();
    fleet.dir.take();
    Ok(Report {
        mode,
        stop: stop.name(),
        instances: args.instances,
        rounds: args.rounds,
        concurrency: args.concurrency,
        idempotent: args.idempotent,
        grace_s: args.grace,
        drain_deadline_s: volley::Drain::default().deadline.as_secs_f64(),
        seconds,
        calls: t.ok + failed,
        ok: t.ok,
        failed,
        failed_by_kind: t.failed_by_kind.clone(),
        failed_that_ran,
        run_twice: ran.counts.values().filter(|&&n| n > 1).count() as u64,
        extra_runs: ran.counts.values().map(|&n| n.saturating_sub(1) as u64).sum(),
        executions: ran.executions,
        unrecorded_runs: ran.unrecorded,
        resent_not_run,
        retried,
        during_p99_over_steady: ratio(&during),
        worst_during_p99_over_steady: restarts.iter().map(|r| ratio(&r.during)).fold(0.0, f64::max),
        max_stop_ms: restarts.iter().map(|r| r.stop_ms).fold(0.0, f64::max),
        max_gone_from_list_ms: restarts
            .iter()
            .map(|r| r.gone_from_list_ms)
            .try_fold(0.0, |m: f64, g| g.map(|g| m.max(g))),
        steady,
        during,
        restarts,
    })
}

/// Resent-as-never-run and retried calls of a direct-mode client.
fn resends(s: &ServiceClientStats) -> (u64, u64) {
    (s.resent_unrun, s.failovers - s.resent_unrun)
}

/// The same counted by the controller's relay, read from its admin endpoint.
async fn relay_resends(admin: &str) -> Result<(u64, u64), String> {
    let vars = crate::top::fetch(admin).await?;
    let find = |key: &str| find_number(&vars, key).ok_or(format!("the controller's /vars.json has no {key}"));
    let (failovers, unrun) = (find("relay_failovers")?, find("relay_resent_unrun")?);
    Ok((unrun, failovers.saturating_sub(unrun)))
}

fn find_number(v: &serde_json::Value, key: &str) -> Option<u64> {
    match v {
        serde_json::Value::Object(m) => {
            m.get(key).and_then(|x| x.as_u64()).or_else(|| m.values().find_map(|x| find_number(x, key)))
        }
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_number(x, key)),
        _ => None,
    }
}

/// The callers: connects a client, says so on `ready`, and calls until `load.stop`.
fn drive(
    registry: &str,
    mode: Mode,
    concurrency: usize,
    size: usize,
    idempotent: bool,
    load: &Arc<Load>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) -> Result<ServiceClientStats, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = match ServiceClient::connect_with(registry, ServiceConfig::default().mode(mode)).await {
            Ok(c) => c,
            Err(e) => {
                let e = format!("connecting to the registry {registry}: {e}");
                let _ = ready.send(Err(e.clone()));
                return Err(e);
            }
        };
        let _ = ready.send(Ok(()));
        let opts = if idempotent { CallOptions::default().idempotent() } else { CallOptions::default() };
        let mut tasks = Vec::new();
        for _ in 0..concurrency {
            let (client, load) = (client.clone(), load.clone());
            tasks.push(tokio::spawn(async move {
                let mut payload = vec![0x5A; size];
                while !load.stop.load(Relaxed) {
                    let id = load.next_id.fetch_add(1, Relaxed);
                    payload[..8].copy_from_slice(&id.to_le_bytes());
                    let window = load.window.load(Relaxed);
                    let t0 = Instant::now();
                    let r = client.call_with(&ECHO, Bytes::copy_from_slice(&payload), opts).await;
                    let took = t0.elapsed().as_micros() as u64;
                    let failed = {
                        let mut t = load.tallies.lock().expect("not poisoned");
                        let kind = match &r {
                            Ok(reply) if reply[..] == payload[..] => None,
                            Ok(_) => Some("wrong reply".to_string()),
                            Err(e) => Some(kind(e)),
                        };
                        match kind {
                            None => {
                                t.ok += 1;
                                t.windows[window].saturating_record(took.max(1));
                            }
                            Some(k) => {
                                *t.failed_by_kind.entry(k).or_default() += 1;
                                t.failed_ids.push(id);
                            }
                        }
                        r.is_err()
                    };
                    if failed {
                        // A failing call may return at once: let the others run.
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        Ok(client.stats())
    })
}

/// A short name for what a failed call failed with.
fn kind(e: &Error) -> String {
    match e {
        Error::Timeout(_) => "timeout".into(),
        Error::Remote(s) => format!("remote {:?}", s.code),
        Error::Connection(_) => "connection".into(),
        Error::NotRun(_) => "not run".into(),
        Error::Closed => "closed".into(),
        Error::NoInstances { .. } => "no instances".into(),
        other => other.to_string().split(':').next().unwrap_or("other").to_string(),
    }
}

/// A listing poll started at a signal: how long until the instance was gone.
type Poll = tokio::task::JoinHandle<Option<f64>>;

/// The steady windows and the restarts, in turn; returns each restart (latencies filled in
/// later) and its listing poll.
async fn restart_all(
    args: &RollingArgs,
    fleet: &mut Fleet,
    load: &Load,
    stop: Stop,
) -> Result<(Vec<Restart>, Vec<Poll>), String> {
    let steady = Duration::from_secs_f64(args.steady);
    let lister = Registry::connect(&fleet.registry).await.map_err(|e| format!("registry: {e}"))?;
    // Warm-up: connections made, not measured.
    tokio::time::sleep(steady.min(Duration::from_millis(500))).await;
    let mut window = 1;
    load.window.store(window, Relaxed);
    tokio::time::sleep(steady).await;
    let (mut restarts, mut polls) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        for instance in 0..args.instances {
            let mut old = fleet.instances[instance].take().expect("every slot holds a running instance");
            window += 1;
            let signalled = Instant::now();
            match stop {
                Stop::Signal(sig) => old.proc.signal(sig)?,
                Stop::Kill => old.proc.kill()?,
            }
            load.window.store(window, Relaxed);
            polls.push(tokio::spawn(gone_from_list(lister.clone(), old.address.clone(), signalled)));
            old.proc.exited().await?;
            let stop_ms = ms(signalled.elapsed());
            fleet.instances[instance] = Some(fleet.start_instance().await?);
            let replaced_ms = ms(signalled.elapsed());
            window += 1;
            load.window.store(window, Relaxed);
            let zero = Latency { calls: 0, p50_us: 0, p99_us: 0 };
            restarts.push(Restart {
                round,
                instance: instance + 1,
                stop_ms,
                gone_from_list_ms: None,
                replaced_ms,
                before: zero,
                during: zero,
                after: zero,
            });
            tokio::time::sleep(steady).await;
        }
    }
    Ok((restarts, polls))
}

/// Polls the controller's list from `since` until `address` is no longer in it (at most 30 s),
/// and returns how long that took, in milliseconds.
async fn gone_from_list(registry: Registry, address: String, since: Instant) -> Option<f64> {
    let end = since + Duration::from_secs(30);
    while Instant::now() < end {
        if let Ok(listing) = registry.list().await
            && !listing.services.iter().flat_map(|s| &s.instances).any(|i| i.instance.address == address)
        {
            return Some(ms(since.elapsed()));
        }
        // Finely while a deregistration is due; then (a killed instance, listed until its lease
        // lapses) coarsely, so as not to load the controller the callers may be relaying through.
        let pause = if since.elapsed() < Duration::from_millis(500) { 1 } else { 25 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    None
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One process of this binary, its output (stdout and stderr) in a log file.
struct Proc {
    child: tokio::process::Child,
    log: PathBuf,
    what: String,
}

/// Generous: a loaded 2-core machine can stall a process start for seconds.
const START_DEADLINE: Duration = Duration::from_secs(60);

impl Proc {
    fn spawn(what: String, args: &[&str], log: PathBuf) -> Result<Proc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = tokio::process::Command::new(exe)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {what}: {e}"))?;
        Ok(Proc { child, log, what })
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The first word after `marker` on a whole line of the output, once it is there.
    async fn wait_for(&mut self, marker: &str) -> Result<String, String> {
        let end = Instant::now() + START_DEADLINE;
        loop {
            let out = self.output();
            let whole = &out[..out.rfind('\n').map_or(0, |i| i + 1)];
            if let Some(word) = whole.lines().find_map(|l| {
                let (_, rest) = l.split_once(marker)?;
                rest.split_whitespace().next().map(|w| w.trim_end_matches([',', '/']).to_string())
            }) {
                return Ok(word);
            }
            let exited = self.child.try_wait().map_err(|e| e.to_string())?;
            if exited.is_some() || Instant::now() >= end {
                let why = exited.map_or("did not".to_string(), |s| format!("exited ({s}) without"));
                return Err(format!("{} {why} printing {marker:?}; its output:\n{out}", self.what));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn signal(&self, sig: libc::c_int) -> Result<(), String> {
        let pid = self.child.id().ok_or(format!("{} already exited", self.what))?;
        // SAFETY: plain kill(2) on a child of ours that has not been reaped.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            return Err(format!("signalling {}: {}", self.what, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn kill(&mut self) -> Result<(), String> {
        self.child.start_kill().map_err(|e| format!("killing {}: {e}", self.what))
    }

    /// Waits for the process to end (bounded: a stop that hangs is an error, not a hang).
    async fn exited(&mut self) -> Result<std::process::ExitStatus, String> {
        match tokio::time::timeout(Duration::from_secs(120), self.child.wait()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("{} did not exit within 120 s of its stop signal", self.what)),
        }
    }
}

/// The controller and the echo servers.
struct Fleet {
    dir: Option<tempfile::TempDir>,
    controller: Proc,
    registry: String,
    admin: String,
    instances: Vec<Option<Instance>>,
    started: usize,
    grace: f64,
}

struct Instance {
    proc: Proc,
    address: String,
}

/// Every call's id and how often a handler ran it.
struct Executions {
    counts: HashMap<u64, u32>,
    executions: u64,
    unrecorded: u64,
}

impl Fleet {
    async fn start(instances: usize, grace: f64) -> Result<Fleet, String> {
        let dir = tempfile::Builder::new().prefix("volley-rolling-").tempdir().map_err(|e| e.to_string())?;
        let mut controller = Proc::spawn(
            "the controller".into(),
            &["controller", "--listen", "tcp://127.0.0.1:0", "--admin", "127.0.0.1:0"],
            dir.path().join("controller.log"),
        )?;
        let registry = controller.wait_for("registry controller on ").await?;
        let admin = controller.wait_for("admin endpoint on http://").await?;
        let mut fleet =
            Fleet { dir: Some(dir), controller, registry, admin, instances: Vec::new(), started: 0, grace };
        for _ in 0..instances {
            let i = fleet.start_instance().await?;
            fleet.instances.push(Some(i));
        }
        fleet.settled().await?;
        Ok(fleet)
    }

    /// Waits until the fresh controller has stopped settling (for a lease's time after its
    /// start, clients keep instances it no longer lists, since their servers may not have
    /// registered again yet): a restart measured then would measure the controller's start,
    /// not the instance's stop.
    async fn settled(&self) -> Result<(), String> {
        let registry = Registry::connect(&self.registry).await.map_err(|e| format!("registry: {e}"))?;
        let end = Instant::now() + volley::discovery::DEFAULT_TTL + START_DEADLINE;
        loop {
            let listing = registry.list().await.map_err(|e| format!("registry: {e}"))?;
            if !listing.settling {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err("the controller is still settling".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.as_ref().expect("the fleet's directory").path().join(name)
    }

    /// Starts one more echo server and waits until it has registered.
    async fn start_instance(&mut self) -> Result<Instance, String> {
        self.started += 1;
        let n = self.started;
        let record = self.path(&format!("calls-{n}"));
        let grace = self.grace.to_string();
        let mut proc = Proc::spawn(
            format!("echo server {n}"),
            &[
                "serve-echo",
                "--listen",
                "tcp://127.0.0.1:0",
                "--registry",
                &self.registry,
                "--grace",
                &grace,
                "--record-calls",
                path_str(&record)?,
            ],
            self.path(&format!("echo-{n}.log")),
        )?;
        let address = proc.wait_for("registered echo at ").await?;
        Ok(Instance { proc, address })
    }

    /// Stops the instances still running and the controller, gracefully.
    async fn stop_all(&mut self) {
        let mut stopping = Vec::new();
        for i in self.instances.iter_mut().filter_map(Option::take) {
            match i.proc.signal(libc::SIGTERM) {
                Ok(()) => stopping.push(i.proc),
                Err(e) => eprintln!("{e}"),
            }
        }
        for mut p in stopping {
            let _ = p.exited().await;
        }
        if self.controller.signal(libc::SIGTERM).is_ok() {
            let _ = self.controller.exited().await;
        }
    }

    /// What every echo server's record holds.
    fn executions(&self) -> Result<Executions, String> {
        let mut out = Executions { counts: HashMap::new(), executions: 0, unrecorded: 0 };
        for n in 1..=self.started {
            let r = call_record::read(&self.path(&format!("calls-{n}")))?;
            if r.overflow > 0 {
                return Err(format!("echo server {n} ran more calls than its record holds"));
            }
            out.executions += r.ids.len() as u64 + r.unwritten;
            out.unrecorded += r.unwritten;
            for id in r.ids {
                *out.counts.entry(id).or_default() += 1;
            }
        }
        Ok(out)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // On an error the processes are killed (`kill_on_drop`); the directory goes with the
        // fleet, unless a kept log is wanted (VOLLEY_KEEP_LOGS).
        if std::env::var_os("VOLLEY_KEEP_LOGS").is_some()
            && let Some(d) = self.dir.take()
        {
            eprintln!("logs kept in {}", d.keep().display());
        }
        for mut i in self.instances.iter_mut().filter_map(Option::take) {
            let _ = i.proc.kill();
        }
    }
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str().ok_or(format!("{}: not UTF-8", p.display()))
}

fn print(r: &Report) {
    let lat = |l: &Latency| format!("{}/{}", l.p50_us, l.p99_us);
    outln!(
        "rolling restart, {} mode: {} instances × {} rounds, {} callers, {}, grace {:.1} s, calls {}idempotent, {:.1} s",
        r.mode.name(),
        r.instances,
        r.rounds,
        r.concurrency,
        r.stop,
        r.grace_s,
        if r.idempotent { "" } else { "not " },
        r.seconds
    );
    let kinds: Vec<String> = r.failed_by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    outln!(
        "  calls {}: {} ok, {} failed{}; run twice (at the handler): {}; failed after running: {}",
        r.calls,
        r.ok,
        r.failed,
        if kinds.is_empty() { String::new() } else { format!(" ({})", kinds.join(", ")) },
        r.run_twice,
        r.failed_that_ran
    );
    if r.unrecorded_runs > 0 {
        outln!("  {} runs of killed processes have no id recorded", r.unrecorded_runs);
    }
    outln!("  resent because they never ran: {}; retried (may have run): {}", r.resent_not_run, r.retried);
    outln!(
        "  p50/p99 µs: steady {}, during restarts {} ({:.1}× the steady p99; worst restart {:.1}×)",
        lat(&r.steady),
        lat(&r.during),
        r.during_p99_over_steady,
        r.worst_during_p99_over_steady
    );
    let gone = |g: Option<f64>| g.map_or("-".to_string(), |g| format!("{g:.1}"));
    outln!(
        "  stops: longest {:.0} ms (bound: grace {:.1} s + drain deadline {:.0} s); gone from the list within {} ms",
        r.max_stop_ms,
        r.grace_s,
        r.drain_deadline_s,
        gone(r.max_gone_from_list_ms)
    );
    outln!(
        "  {:<6} {:>8} {:>8} {:>10} {:>10} {:>14} {:>14} {:>14}",
        "round",
        "instance",
        "stop ms",
        "unlisted",
        "replaced",
        "before µs",
        "during µs",
        "after µs"
    );
    for x in &r.restarts {
        outln!(
            "  {:<6} {:>8} {:>8.0} {:>10} {:>10.0} {:>14} {:>14} {:>14}",
            x.round,
            x.instance,
            x.stop_ms,
            gone(x.gone_from_list_ms),
            x.replaced_ms,
            lat(&x.before),
            lat(&x.during),
            lat(&x.after)
        );
    }
}
