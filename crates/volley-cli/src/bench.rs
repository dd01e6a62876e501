//! `volley bench`: the echo benchmark.
//!
//! N concurrent callers share one connection (through a registry in direct mode: one per
//! instance) and call `echo/echo` in a loop for a fixed time after a warm-up — single calls, or
//! `call_batch` of `--batch-size` requests. Latency of every call goes into an HDR histogram;
//! throughput is calls (and requests) completed inside the measured window divided by its
//! length. Frames and messages sent by the client show how well bundling works (messages per
//! frame). `--api` picks the `Method` layer or the `#[volley::service]` trait's generated client
//! and server (`both`: side by side, in rounds interleaved by `--rounds`, with the ratio of the
//! medians); `--hostile` adds a misbehaving connection beside the callers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use volley::bytes::Bytes;
use volley::registry::{
    Controller, ControllerConfig, InstanceSpec, LeaseConfig, Mode, Registry, ServiceConfig,
};
use volley::{BatchOptions, Client, Method, Server, ServiceClient, Snapshot};

use crate::bench_api::{Api, ApiChoice, Figure};
use crate::echo::{ECHO, EchoAsyncServer, EchoClient, EchoServer, Echoer, method_named, server_named_with};
use crate::hostile::{self, Hostile};
use crate::output::outln;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Transport for the in-process server (ignored with --connect).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    transport: Transport,
    /// Drive an already running `volley serve-echo` at this address instead.
    #[arg(long)]
    connect: Option<String>,
    /// Find the echo service through the registry at this address (servers registered with
    /// `volley serve-echo --registry`) instead of starting one. Implies `--mode direct` unless
    /// `--mode relayed` is given.
    #[arg(long)]
    registry: Option<String>,
    /// The service to resolve through the registry.
    #[arg(long, default_value = "echo")]
    service: String,
    /// Comma-separated or repeated. Call style: `single` (the default), `batch` (`call_batch`
    /// of `--batch-size` requests) or `both` (one after the other in this run, to compare).
    /// Registry mode: `direct` (resolve once, call instances) or `relayed` (every call through
    /// the controller); without `--registry` an in-process controller is started and the server
    /// registers with it.
    #[arg(long, value_enum, value_delimiter = ',')]
    mode: Vec<BenchMode>,
    /// Requests per `call_batch` in batch mode.
    #[arg(long, default_value_t = 128)]
    batch_size: usize,
    /// Requests per chunk (one message on the wire) in batch mode.
    #[arg(long, default_value_t = 128)]
    chunk_size: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Concurrent callers, sharing one connection (through a registry in direct mode: one
    /// connection per instance; with --raw: one connection each).
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Warm-up seconds, not measured.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// How threads are used: `split` = server and client each on their own single-threaded
    /// runtime (one core each; the default, fastest here), `shared` = both on one
    /// single-threaded runtime, `multi` = both on one two-worker multi-threaded runtime.
    #[arg(long, value_enum, default_value_t = RuntimeMode::Split)]
    runtime: RuntimeMode,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The API that calls and serves: `method` (`Client::call(&ECHO, ..)` against a
    /// `handle_fn` closure), `generated` (the `Echo` trait's `EchoClient` and `EchoServer`),
    /// or `both` (a server for each in this process, measured in turn: with `--rounds`, the
    /// generated form's cost against the `Method` layer's).
    #[arg(long, value_enum, default_value_t = ApiChoice::Method)]
    api: ApiChoice,
    /// Measure everything this many times, interleaved (round 1 of every API and call style,
    /// then round 2, ...; the APIs take turns going first); with `--api both` the text report
    /// ends with the ratio of the medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The in-process server's handler: `sync` (runs inline: `handle_fn`, a `#[sync] fn`) or
    /// `async` (a future per request: `handle`, an `async fn`).
    #[arg(long, value_enum, default_value_t = Handler::Sync)]
    handler: Handler,
    /// Instead of Volley, run a bare tokio ping-pong (length-prefixed echo, one connection
    /// per caller, same runtime setup): the floor Volley's latency is compared against.
    #[arg(long)]
    raw: bool,
    /// One hostile client beside the callers, on a connection of its own: `noread` pipelines
    /// 1 KiB requests and never reads a reply, `pipeline` pipelines frames of 1,000 requests
    /// without end. Every round measures the callers without it, then with it.
    #[arg(long, value_enum)]
    hostile: Option<Hostile>,
    /// Each caller waits this long after every call (0: calls back to back). With
    /// `--concurrency 1 --pace-ms 10`, one connection calling every 10 ms.
    #[arg(long, default_value_t = 0)]
    pace_ms: u64,
    /// The token to present to the server and the registry (environment: VOLLEY_TOKEN).
    #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Handler {
    Sync,
    Async,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Transport {
    Inproc,
    Unix,
    Tcp,
    /// tcp with TLS: a certificate generated for the run (rcgen), verified by the client.
    Tls,
    /// Shared memory (Linux), set up over a unix socket in the temporary directory.
    Shm,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum BenchMode {
    Single,
    Batch,
    Both,
    /// A steady mix on every caller: three single calls, then one `call_batch`, over and over
    /// (the soak test's load; resident memory is sampled every second).
    Mix,
    Direct,
    Relayed,
}

/// How one measurement makes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Style {
    Single,
    Batch,
    Mix,
}

/// How the client finds the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum RegistryMode {
    /// By address (`--connect`, or the in-process server's address).
    None,
    Direct,
    Relayed,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum RuntimeMode {
    Split,
    Shared,
    Multi,
}

#[derive(Serialize, Debug)]
struct Report {
    /// `method` or `generated` (`--api`).
    api: Api,
    /// 1-based, with `--rounds`.
    round: usize,
    /// The in-process server's handler form (`sync` or `async`).
    handler: Handler,
    transport: String,
    runtime: RuntimeMode,
    /// `single` or `batch`.
    mode: Style,
    /// Requests per call (1 in single mode).
    batch_size: usize,
    payload: usize,
    concurrency: usize,
    /// Calls completed (a `call_batch` counts once).
    calls: u64,
    /// Requests completed.
    items: u64,
    seconds: f64,
    calls_per_s: f64,
    items_per_s: f64,
    p50_us: f64,
    p95_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    errors: u64,
    frames_sent: u64,
    messages_sent: u64,
    messages_per_frame: f64,
    /// `none`, `direct` or `relayed`.
    registry_mode: RegistryMode,
    /// The service resolved through the registry (null without one).
    service: Option<String>,
    /// Registry look-ups the client made (whole run: in direct mode, one).
    lookups: u64,
    /// Messages the client sent to and received from the controller in the measured window
    /// (in relayed mode every call's request and reply).
    registry_messages: u64,
    /// The binary's global allocator (`system`, `mimalloc`, `jemalloc`).
    global_allocator: &'static str,
    /// CPU time (user + system) of the whole process — client and, when in-process, server —
    /// in the measured window. On a shared machine this is steadier than calls/s: time the
    /// process spends waiting for a core does not count.
    cpu_seconds: f64,
    cpu_us_per_call: f64,
    /// Resident memory of the process (server and client) when measuring started (after the
    /// warm-up), at its end, and the most seen, sampled every second; growth from start to
    /// end in percent. For leaks: a steady load must not grow it.
    rss_start_kb: u64,
    rss_end_kb: u64,
    rss_max_kb: u64,
    rss_growth_pct: f64,
    /// Resident memory every ~10 s of the measured window (KiB), to tell a leak (steady
    /// growth) from an allocator settling (a step, then flat).
    rss_samples_kb: Vec<u64>,
    /// Heap bytes the program holds (allocated and not freed; glibc's `mallinfo2`, with the
    /// system allocator only), at the same moments as `rss_samples_kb`. Flat while resident
    /// memory grows means the allocator is keeping freed memory, not that the program leaks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    heap_samples_kb: Vec<u64>,
    /// The hostile client beside the callers in this measurement (null: none).
    hostile: Option<Hostile>,
    /// Bytes the hostile client wrote to the server (warm-up and measured window).
    hostile_bytes_sent: Option<u64>,
    /// CPU time of the in-process server's thread over the measured window, in percent of
    /// one core (with `--runtime split` only).
    server_cpu_pct: Option<f64>,
}

/// Checks `--mode` and the flags that go with it; returns the registry mode and the call
/// styles to measure, in order.
fn plan(args: &BenchArgs) -> Result<(RegistryMode, Vec<Style>), String> {
    let mut style = None;
    let mut registry = None;
    for &m in &args.mode {
        let (slot, name) = match m {
            BenchMode::Single | BenchMode::Batch | BenchMode::Both | BenchMode::Mix => {
                (&mut style, "call style")
            }
            BenchMode::Direct | BenchMode::Relayed => (&mut registry, "registry mode"),
        };
        if slot.replace(m).is_some_and(|prev| prev != m) {
            return Err(format!("--mode names two {name}s; pick one"));
        }
    }
    let styles = match style {
        Some(BenchMode::Batch) => vec![Style::Batch],
        Some(BenchMode::Both) => vec![Style::Single, Style::Batch],
        Some(BenchMode::Mix) => vec![Style::Mix],
        _ => vec![Style::Single],
    };
    if args.raw && styles != [Style::Single] {
        return Err("--raw measures single calls only".into());
    }
    let mode = match registry {
        Some(BenchMode::Relayed) => RegistryMode::Relayed,
        Some(_) => RegistryMode::Direct,
        None if args.registry.is_some() => RegistryMode::Direct,
        None => RegistryMode::None,
    };
    if mode != RegistryMode::None && (args.connect.is_some() || args.raw) {
        return Err("--mode direct|relayed and --registry do not go with --connect or --raw".into());
    }
    if mode != RegistryMode::None && args.transport == Transport::Tls {
        return Err("--transport tls measures a server by address, without a registry".into());
    }
    if args.hostile.is_some()
        && (mode != RegistryMode::None
            || args.raw
            || matches!(args.transport, Transport::Inproc | Transport::Tls))
    {
        return Err(
            "--hostile needs a tcp or unix server by address (no --raw, registry, inproc or tls)".into()
        );
    }
    if args.api != ApiChoice::Method && (args.raw || args.service != ECHO.service()) {
        return Err(format!(
            "--api {:?} calls the `Echo` trait's service, `{}`: not with --raw or another --service",
            args.api,
            ECHO.service()
        ));
    }
    if args.api == ApiChoice::Both && (mode != RegistryMode::None || args.connect.is_some()) {
        return Err(
            "--api both starts a server for each API in this process: not with --connect or a registry"
                .into(),
        );
    }
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    Ok((mode, styles))
}

/// Where the load goes.
#[derive(Debug, Clone)]
enum Target {
    /// A server at this address.
    Plain(String),
    /// The service, through the registry at this address.
    Registry(String, RegistryMode),
}

/// What `volley bench` started in-process (the server, and a controller in registry modes).
struct Local {
    server: Server,
    controller: Option<Controller>,
}

impl Local {
    async fn start(args: &BenchArgs, mode: RegistryMode, api: Api) -> Result<(Target, Local), String> {
        let tls = |b: volley::ServerBuilder| match args.transport {
            Transport::Tls => b.tls(bench_tls().0.clone()),
            _ => b,
        };
        let m = method_named(&args.service);
        let (server, role) = match (api, args.handler) {
            (Api::Method, Handler::Sync) => (server_named_with(&args.service, tls), "echo"),
            (Api::Method, Handler::Async) => {
                (tls(Server::builder().handle(&m, |b: Bytes| async move { Ok(b) })).build(), "echo")
            }
            (Api::Generated, Handler::Sync) => {
                (tls(Server::builder().serve(EchoServer::new(Echoer))).build(), "echo-generated")
            }
            (Api::Generated, Handler::Async) => {
                (tls(Server::builder().serve(EchoAsyncServer::new(Echoer))).build(), "echo-generated")
            }
        };
        let bound = server.listen(&listen_address(args.transport, role)).await.map_err(|e| e.to_string())?;
        if mode == RegistryMode::None {
            return Ok((Target::Plain(bound.to_string()), Local { server, controller: None }));
        }
        let controller = Controller::new(ControllerConfig::default());
        let reg_addr = controller
            .listen(&listen_address(args.transport, "registry"))
            .await
            .map_err(|e| e.to_string())?
            .to_string();
        let registry = Registry::connect(&reg_addr).await.map_err(|e| e.to_string())?;
        let spec = InstanceSpec::new(args.service.clone(), bound.to_string());
        registry.register(&server, vec![spec], LeaseConfig::default()).await.map_err(|e| e.to_string())?;
        Ok((Target::Registry(reg_addr, mode), Local { server, controller: Some(controller) }))
    }

    /// A server (and controller) for each API, in this order.
    async fn start_all(
        args: &BenchArgs,
        mode: RegistryMode,
        apis: &[Api],
    ) -> Result<(Vec<(Api, Target)>, Vec<Local>), String> {
        let (mut targets, mut locals) = (Vec::new(), Vec::new());
        for &api in apis {
            let (target, local) = Local::start(args, mode, api).await?;
            targets.push((api, target));
            locals.push(local);
        }
        Ok((targets, locals))
    }

    async fn shutdown(self) {
        self.server.shutdown().await;
        if let Some(c) = self.controller {
            c.shutdown().await;
        }
    }
}

/// The client side of the benchmark: a plain client, or a service client through a registry;
/// through the `Method` layer or the generated `EchoClient`.
enum Caller {
    Plain(Client),
    Service(ServiceClient, Method<Bytes, Bytes>),
    Generated(EchoClient<Client>),
    GeneratedService(EchoClient<ServiceClient>),
}

impl Caller {
    async fn call(&self, p: Bytes) -> Outcome {
        let len = p.len();
        let r = match self {
            Caller::Plain(c) => c.call(&ECHO, p).await,
            Caller::Service(c, m) => c.call(m, p).await,
            Caller::Generated(c) => c.echo(p).await,
            Caller::GeneratedService(c) => c.echo(p).await,
        };
        Outcome::of(std::iter::once(r), len)
    }

    async fn call_batch(&self, p: Bytes, n: usize, opts: BatchOptions) -> Outcome {
        let reqs = (0..n).map(|_| p.clone());
        let results = match self {
            Caller::Plain(c) => c.call_batch_with(&ECHO, reqs, opts).await,
            Caller::Service(c, m) => c.call_batch_with(m, reqs, opts).await,
            Caller::Generated(c) => c.echo_batch_with(reqs, opts).await,
            Caller::GeneratedService(c) => c.echo_batch_with(reqs, opts).await,
        };
        Outcome::of(results, p.len())
    }

    /// One call before the run: a refusal that retrying will not fix (a wrong token) ends the
    /// benchmark at once, with the flag that fixes it, instead of failing every call.
    async fn probe(&self, what: &str) -> Result<(), String> {
        let r = match self {
            Caller::Plain(c) => c.call(&ECHO, Bytes::new()).await,
            Caller::Generated(c) => c.echo(Bytes::new()).await,
            Caller::Service(c, m) => c.call(m, Bytes::new()).await,
            Caller::GeneratedService(c) => c.echo(Bytes::new()).await,
        };
        match r {
            Err(e) if e.is_permanent() => {
                Err(crate::refusal::connecting(what, &e, "--token", "VOLLEY_TOKEN"))
            }
            _ => Ok(()),
        }
    }

    /// Transport counters of every connection the client uses.
    fn counters(&self) -> Snapshot {
        match self {
            Caller::Plain(c) => c.counters(),
            Caller::Generated(c) => c.inner().counters(),
            Caller::Service(c, _) => c.stats().transport(),
            Caller::GeneratedService(c) => c.inner().stats().transport(),
        }
    }

    /// (registry look-ups, messages to and from the controller).
    fn registry(&self) -> (u64, u64) {
        let service = match self {
            Caller::Plain(_) | Caller::Generated(_) => return (0, 0),
            Caller::Service(c, _) => c,
            Caller::GeneratedService(c) => c.inner(),
        };
        let s = service.stats();
        (s.lookups, s.registry_messages())
    }
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.raw && (args.connect.is_some() || args.transport != Transport::Tcp) {
        return Err("--raw runs its own bare tcp echo: use it with --transport tcp, without --connect".into());
    }
    // Checked here so a bad --mode fails before anything starts; `drive` reads the styles.
    let (mode, _) = plan(&args)?;
    let apis = args.api.apis();
    // `plan` allows several APIs only with servers started here.
    let every_api = |target: Target| apis.iter().map(|&api| (api, target.clone())).collect::<Vec<_>>();
    let reports = match (&args.connect, &args.registry, args.runtime) {
        (Some(addr), _, _) => client_runtime(args.runtime)?
            .block_on(drive(every_api(Target::Plain(addr.clone())), args.clone()))?,
        (None, Some(reg), _) => client_runtime(args.runtime)?
            .block_on(drive(every_api(Target::Registry(reg.clone(), mode)), args.clone()))?,
        (None, None, RuntimeMode::Split) => {
            // The server (and the controller, in registry modes) get a thread and a
            // single-threaded runtime of their own.
            let (target_tx, target_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let server_args = args.clone();
            let server_thread = std::thread::Builder::new()
                .name("volley-server".into())
                .spawn(move || -> Result<(), String> {
                    server_cpu::register_this_thread();
                    let rt = current_thread()?;
                    rt.block_on(async move {
                        if server_args.raw {
                            let bound = raw::listen().await;
                            let _ = target_tx.send(bound.map(|b| vec![(Api::Method, Target::Plain(b))]));
                            let _ = stop_rx.await;
                            return;
                        }
                        match Local::start_all(&server_args, mode, &apis).await {
                            Ok((targets, locals)) => {
                                let _ = target_tx.send(Ok(targets));
                                let _ = stop_rx.await;
                                for local in locals {
                                    local.shutdown().await;
                                }
                            }
                            Err(e) => {
                                let _ = target_tx.send(Err(e));
                            }
                        }
                    });
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
            let targets = target_rx.recv().map_err(|e| e.to_string())??;
            let reports = current_thread()?.block_on(drive(targets, args.clone()));
            let _ = stop_tx.send(());
            server_thread.join().map_err(|_| "server thread panicked".to_string())??;
            reports?
        }
        (None, None, runtime) => client_runtime(runtime)?.block_on(async {
            if args.raw {
                let addr = raw::listen().await?;
                return drive(vec![(Api::Method, Target::Plain(addr))], args.clone()).await;
            }
            let (targets, locals) = Local::start_all(&args, mode, &apis).await?;
            let reports = drive(targets, args.clone()).await;
            for local in locals {
                local.shutdown().await;
            }
            reports
        })?,
    };
    for report in &reports {
        if args.json {
            outln!("{}", serde_json::to_string(report).map_err(|e| e.to_string())?);
        } else {
            print_report(report);
        }
    }
    if args.hostile.is_some() && !args.json {
        print_hostile_summary(&reports);
    }
    if let [single, batch] = &reports[..]
        && !args.json
        && args.hostile.is_none()
    {
        let ratio = batch.items_per_s / single.items_per_s.max(f64::MIN_POSITIVE);
        outln!("batch/single: {ratio:.1}x the requests per second");
    }
    if !args.json {
        let style = |r: &Report| match r.mode {
            Style::Single => "single",
            Style::Batch => "batch",
            Style::Mix => "mix",
        };
        let figures: Vec<Figure> = reports
            .iter()
            .map(|r| Figure { api: r.api, style: style(r), items_per_s: r.items_per_s })
            .collect();
        crate::bench_api::ratios(&figures).iter().for_each(|line| println!("{line}"));
    }
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    if errors > 0 {
        return Err(format!("{errors} requests failed"));
    }
    Ok(())
}

fn listen_address(t: Transport, role: &str) -> String {
    match t {
        Transport::Inproc => format!("inproc://bench-{role}"),
        Transport::Unix => {
            format!(
                "unix://{}/volley-bench-{role}-{}.sock",
                std::env::temp_dir().display(),
                std::process::id()
            )
        }
        Transport::Tcp => "tcp://127.0.0.1:0".into(),
        Transport::Tls => "tls://127.0.0.1:0".into(),
        Transport::Shm => {
            format!(
                "shm://{}/volley-bench-{role}-{}.sock",
                std::env::temp_dir().display(),
                std::process::id()
            )
        }
    }
}

/// The run's TLS settings: a self-signed certificate for 127.0.0.1 made at start-up, and a
/// client that trusts exactly it (so the handshake verifies as in production).
fn bench_tls() -> &'static (volley::transport::tls::TlsServer, volley::transport::tls::TlsClient) {
    static TLS: std::sync::OnceLock<(volley::transport::tls::TlsServer, volley::transport::tls::TlsClient)> =
        std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        use volley::transport::tls::{TlsClient, TlsServer};
        let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("generate a certificate");
        let (cert, key) = (c.cert.pem(), c.key_pair.serialize_pem());
        let server = TlsServer::from_pem(cert.as_bytes(), key.as_bytes(), None).expect("server TLS settings");
        let client = TlsClient::from_pem(cert.as_bytes(), None).expect("client TLS settings");
        (server, client)
    })
}

/// Heap memory the program holds, in KiB: what the system allocator has handed out and not
/// taken back (glibc only; `None` under mimalloc, jemalloc or another libc).
fn heap_in_use_kb() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if crate::GLOBAL_ALLOCATOR == "system" {
        // SAFETY: mallinfo2 only reads the allocator's own statistics.
        let m = unsafe { libc::mallinfo2() };
        return Some(((m.uordblks + m.hblkhd) / 1024) as u64);
    }
    None
}

/// Resident memory of this process in KiB (0 where /proc is not available).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

fn current_thread() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

fn client_runtime(mode: RuntimeMode) -> Result<tokio::runtime::Runtime, String> {
    match mode {
        RuntimeMode::Multi => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string()),
        _ => current_thread(),
    }
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

struct CallerResult {
    hist: Histogram<u64>,
    calls: u64,
    items: u64,
    errors: u64,
    first_error: Option<String>,
}

/// What one call (single or batch) achieved.
#[derive(Default)]
struct Outcome {
    ok: u64,
    failed: u64,
    error: Option<String>,
}

impl Outcome {
    /// Counts replies of the expected length as successes.
    fn of(results: impl IntoIterator<Item = Result<Bytes, volley::Error>>, len: usize) -> Outcome {
        let mut o = Outcome::default();
        for r in results {
            match r {
                Ok(reply) if reply.len() == len => o.ok += 1,
                Ok(reply) => o.fail(format!("reply of {} bytes, sent {len}", reply.len())),
                Err(e) => o.fail(e.to_string()),
            }
        }
        o
    }

    fn fail(&mut self, e: String) {
        self.failed += 1;
        self.error.get_or_insert(e);
    }
}

/// One API's end of the benchmark: where the load goes, and what calls.
struct Side {
    api: Api,
    target: Target,
    /// `None` for `--raw`.
    caller: Option<Arc<Caller>>,
    transport: String,
    registry_mode: RegistryMode,
}

/// The client settings of every caller: the token, if one was given.
fn client_config(args: &BenchArgs) -> volley::ClientConfig {
    let mut config = volley::ClientConfig::default();
    config.token = args.token.clone().map(String::into_bytes);
    config
}

impl Side {
    async fn connect(api: Api, target: Target, args: &BenchArgs) -> Result<Side, String> {
        let (caller, transport, registry_mode) = match &target {
            Target::Plain(addr) => {
                let mut config = client_config(args);
                if addr.starts_with("tls://") {
                    config = config.tls(bench_tls().1.clone());
                }
                let client = if args.raw {
                    None
                } else {
                    Some(Client::connect_with(addr, config).await.map_err(|e| e.to_string())?)
                };
                let transport = if args.raw { "raw-tcp".to_string() } else { scheme(addr) };
                let caller = client.map(|c| match api {
                    Api::Method => Caller::Plain(c),
                    Api::Generated => Caller::Generated(EchoClient::new(c)),
                });
                (caller, transport, RegistryMode::None)
            }
            Target::Registry(reg, mode) => {
                let how = if *mode == RegistryMode::Relayed { Mode::Relayed } else { Mode::Direct };
                let config = ServiceConfig::default().mode(how).client(client_config(args));
                let what = format!("registry {reg}");
                let client =
                    ServiceClient::connect_with(reg, config).await.map_err(|e| match e.is_permanent() {
                        true => crate::refusal::connecting(&what, &e, "--token", "VOLLEY_TOKEN"),
                        false => format!("{what}: {e}"),
                    })?;
                let transport = match mode {
                    // Every call goes to the controller; the client never looks the service up.
                    RegistryMode::Relayed => scheme(reg),
                    // Resolves the service: the one look-up of the run.
                    _ => {
                        let instances = client
                            .instances(&args.service)
                            .await
                            .map_err(|e| format!("{}: {e}", args.service))?;
                        scheme(&instances[0].address)
                    }
                };
                let caller = match api {
                    Api::Method => Caller::Service(client, method_named(&args.service)),
                    Api::Generated => Caller::GeneratedService(EchoClient::new(client)),
                };
                (Some(caller), transport, *mode)
            }
        };
        if let Some(c) = &caller {
            let what = match &target {
                Target::Plain(addr) => format!("server {addr}"),
                Target::Registry(reg, _) => format!("service {} through registry {reg}", args.service),
            };
            c.probe(&what).await?;
        }
        Ok(Side { api, target, caller: caller.map(Arc::new), transport, registry_mode })
    }
}

/// Every round, call style and API of the run, interleaved: round 1 of each style through
/// each API, then round 2, so that a change in the machine's load falls on all alike. The
/// APIs take turns going first (A B, B A, ...), so neither always runs right after the other.
async fn drive(targets: Vec<(Api, Target)>, args: BenchArgs) -> Result<Vec<Report>, String> {
    let (_, styles) = plan(&args)?;
    let mut sides = Vec::new();
    for (api, target) in targets {
        sides.push(Side::connect(api, target, &args).await?);
    }
    let mut reports = Vec::new();
    let kinds: &[Option<Hostile>] = match &args.hostile {
        Some(h) => &[None, Some(*h)],
        None => &[None],
    };
    for round in 1..=args.rounds.max(1) {
        for &style in &styles {
            let mut order: Vec<&Side> = sides.iter().collect();
            if round % 2 == 0 {
                order.reverse();
            }
            for side in order {
                for &hostile in kinds {
                    reports.push(measure(side, &args, Run { style, round, hostile }).await?);
                }
            }
        }
    }
    Ok(reports)
}

/// What one measurement varies.
#[derive(Clone, Copy)]
struct Run {
    style: Style,
    round: usize,
    hostile: Option<Hostile>,
}

/// One measurement: warm up, measure, gather the callers' histograms.
async fn measure(
    side: &Side,
    args: &BenchArgs,
    Run { style, round, hostile }: Run,
) -> Result<Report, String> {
    let Side { api, target, caller, transport, registry_mode } = side;
    let (api, registry_mode) = (*api, *registry_mode);
    let hostile = match (hostile, target) {
        (Some(kind), Target::Plain(addr)) => {
            Some(hostile::Running::start(kind, addr, &args.service, ECHO.name())?)
        }
        _ => None,
    };
    // A static payload: cloning it costs no reference counting, so the figures measure Volley
    // rather than the load generator (the server's replies are still real buffers).
    let payload = Bytes::from_static(Vec::leak(vec![0xA5u8; args.payload]));
    let batch_size = if style == Style::Single { 1 } else { args.batch_size.max(1) };
    let opts = BatchOptions::default().chunk_size(args.chunk_size);
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let pace = Duration::from_millis(args.pace_ms);
    let mut callers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (payload, phase) = (payload.clone(), phase.clone());
        callers.push(match (caller, target) {
            (Some(c), _) => {
                let c = c.clone();
                let mut turn = 0u64;
                tokio::spawn(caller_loop(
                    pace,
                    move || {
                        let (c, p) = (c.clone(), payload.clone());
                        turn += 1;
                        let batch = style == Style::Batch || (style == Style::Mix && turn.is_multiple_of(4));
                        async move {
                            if batch { c.call_batch(p, batch_size, opts).await } else { c.call(p).await }
                        }
                    },
                    phase,
                ))
            }
            (None, Target::Plain(addr)) => {
                let conn = Arc::new(raw::connect(addr).await?);
                tokio::spawn(caller_loop(
                    pace,
                    move || {
                        let (conn, p) = (conn.clone(), payload.clone());
                        async move {
                            let len = p.len();
                            let r = conn.call(p).await.map_err(volley::Error::Connection);
                            Outcome::of(std::iter::once(r), len)
                        }
                    },
                    phase,
                ))
            }
            (None, Target::Registry(..)) => unreachable!("registry targets always have a caller"),
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let counters = || caller.as_ref().map(|c| c.counters()).unwrap_or_default();
    let registry = || caller.as_ref().map(|c| c.registry()).unwrap_or_default();
    let (before, registry_before) = (counters(), registry());
    let (cpu_before, server_cpu_before) = (process_cpu_seconds(), server_cpu::seconds());
    let start = Instant::now();
    phase.store(MEASURE, Ordering::Relaxed);
    let rss_start = rss_kb();
    let mut rss_max = rss_start;
    let mut rss_samples = vec![rss_start];
    let mut heap_samples: Vec<u64> = heap_in_use_kb().into_iter().collect();
    let end = start + Duration::from_secs_f64(args.duration);
    let mut tick = 0u64;
    while Instant::now() < end {
        tokio::time::sleep((end - Instant::now()).min(Duration::from_secs(1))).await;
        let rss = rss_kb();
        rss_max = rss_max.max(rss);
        tick += 1;
        if tick.is_multiple_of(10) {
            rss_samples.push(rss);
            heap_samples.extend(heap_in_use_kb());
        }
    }
    let rss_end = rss_kb();
    heap_samples.extend(heap_in_use_kb());
    phase.store(STOP, Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = process_cpu_seconds() - cpu_before;
    let server_cpu_pct = server_cpu::seconds().zip(server_cpu_before).map(|(a, b)| (a - b) / seconds * 100.0);
    let (after, registry_after) = (counters(), registry());
    let mut hist = new_histogram();
    let (mut calls, mut items, mut errors, mut first_error) = (0, 0, 0, None);
    for c in callers {
        let r = c.await.map_err(|e| e.to_string())?;
        hist.add(&r.hist).map_err(|e| e.to_string())?;
        calls += r.calls;
        items += r.items;
        errors += r.errors;
        first_error = first_error.or(r.first_error);
    }
    if let Some(e) = first_error {
        eprintln!("first error: {e}");
    }
    let hostile_bytes_sent = hostile.map(|h| h.stop().0);
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let frames_sent = after.frames_sent - before.frames_sent;
    let messages_sent = after.messages_sent - before.messages_sent;
    Ok(Report {
        api,
        round,
        handler: args.handler,
        transport: transport.to_string(),
        runtime: args.runtime,
        mode: style,
        batch_size,
        payload: args.payload,
        concurrency: args.concurrency,
        calls,
        items,
        seconds,
        calls_per_s: calls as f64 / seconds,
        items_per_s: items as f64 / seconds,
        p50_us: us(0.5),
        p95_us: us(0.95),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: hist.max() as f64 / 1000.0,
        errors,
        frames_sent,
        messages_sent,
        messages_per_frame: if frames_sent == 0 { 0.0 } else { messages_sent as f64 / frames_sent as f64 },
        registry_mode,
        service: (registry_mode != RegistryMode::None).then(|| args.service.clone()),
        lookups: registry_after.0,
        registry_messages: registry_after.1 - registry_before.1,
        global_allocator: crate::GLOBAL_ALLOCATOR,
        cpu_seconds,
        cpu_us_per_call: if calls == 0 { 0.0 } else { cpu_seconds * 1e6 / calls as f64 },
        rss_start_kb: rss_start,
        rss_end_kb: rss_end,
        rss_max_kb: rss_max.max(rss_end),
        rss_samples_kb: rss_samples,
        heap_samples_kb: heap_samples,
        rss_growth_pct: if rss_start == 0 { 0.0 } else { (rss_end as f64 / rss_start as f64 - 1.0) * 100.0 },
        hostile: hostile_bytes_sent.and(args.hostile),
        hostile_bytes_sent,
        server_cpu_pct,
    })
}

/// User + system CPU seconds of this process so far.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid `rusage`.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn new_histogram() -> Histogram<u64> {
    // Nanoseconds up to 60 s at 2 significant digits: small enough to keep one per caller.
    Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid histogram bounds")
}

fn scheme(addr: &str) -> String {
    addr.split("://").next().unwrap_or("?").to_string()
}

async fn caller_loop<F, Fut>(pace: Duration, mut call: F, phase: Arc<AtomicU8>) -> CallerResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let mut r = CallerResult { hist: new_histogram(), calls: 0, items: 0, errors: 0, first_error: None };
    // One clock read per call: each call's end is the next one's start.
    let mut t0 = Instant::now();
    loop {
        let p = phase.load(Ordering::Relaxed);
        if p == STOP {
            return r;
        }
        let outcome = call().await;
        let t1 = Instant::now();
        let ns = (t1 - t0).as_nanos() as u64;
        if pace.is_zero() {
            t0 = t1;
        } else {
            tokio::time::sleep(pace).await;
            t0 = Instant::now();
        }
        if outcome.failed > 0 {
            r.errors += outcome.failed;
            r.first_error = r.first_error.or(outcome.error);
        }
        if p == MEASURE && phase.load(Ordering::Relaxed) == MEASURE {
            r.hist.saturating_record(ns.max(1));
            r.calls += 1;
            r.items += outcome.ok;
        }
    }
}

fn print_report(r: &Report) {
    let batch = match r.mode {
        Style::Batch => format!(" of {} requests", r.batch_size),
        Style::Mix => format!(" (3 single, then a batch of {}, repeated)", r.batch_size),
        Style::Single => String::new(),
    };
    outln!(
        "{} echo, {} B payload, {} callers {}, runtime {:?}, {:?} calls{batch}, {:?} API, {:?} handler, round {}",
        r.transport,
        r.payload,
        r.concurrency,
        how_callers_connect(&r.transport, r.registry_mode),
        r.runtime,
        r.mode,
        r.api,
        r.handler,
        r.round
    );
    if let (Some(h), Some(sent)) = (r.hostile, r.hostile_bytes_sent) {
        outln!("  beside a hostile client ({h:?}) that wrote {:.1} MiB", sent as f64 / (1 << 20) as f64);
    }
    outln!("  {:.0} calls/s ({} calls in {:.2} s, {} errors)", r.calls_per_s, r.calls, r.seconds, r.errors);
    if let Some(cpu) = r.server_cpu_pct {
        outln!("  server thread CPU: {cpu:.1}% of a core");
    }
    if r.mode != Style::Single {
        outln!("  {:.0} requests/s; latency below is per call (a batch call counts once)", r.items_per_s);
    }
    outln!(
        "  resident memory: {} KiB after warm-up, {} KiB at the end ({:+.1}%), {} KiB at most",
        r.rss_start_kb,
        r.rss_end_kb,
        r.rss_growth_pct,
        r.rss_max_kb
    );
    if let (Some(first), Some(last)) = (r.heap_samples_kb.first(), r.heap_samples_kb.last()) {
        outln!("  heap in use: {first} KiB after warm-up, {last} KiB at the end");
    }
    outln!(
        "  latency us: p50 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        r.p50_us,
        r.p95_us,
        r.p99_us,
        r.p999_us,
        r.max_us
    );
    outln!(
        "  client sent {} messages in {} frames ({:.1} messages per frame)",
        r.messages_sent,
        r.frames_sent,
        r.messages_per_frame
    );
    if r.registry_mode != RegistryMode::None {
        outln!(
            "  registry: {:?} mode, service {}, {} look-ups, {} messages to and from the controller while measured",
            r.registry_mode,
            r.service.as_deref().unwrap_or("?"),
            r.lookups,
            r.registry_messages
        );
    }
}

/// How the callers reach the server, for the report's header.
fn how_callers_connect(transport: &str, registry: RegistryMode) -> &'static str {
    match registry {
        RegistryMode::Direct => "through the registry, one connection per instance",
        RegistryMode::Relayed => "relayed through the controller",
        RegistryMode::None if transport == "raw-tcp" => "each on its own connection",
        RegistryMode::None => "on one connection",
    }
}

/// CPU time of the in-process server's thread (`--runtime split`), read from another thread
/// through the thread's CPU clock.
mod server_cpu {
    use std::sync::OnceLock;

    static CLOCK: OnceLock<libc::clockid_t> = OnceLock::new();

    /// Called on the server's thread before it starts serving.
    pub fn register_this_thread() {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_self is always valid; the call writes only `clock`.
        if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
            let _ = CLOCK.set(clock);
        }
    }

    /// CPU seconds the server's thread has used (None without a registered server thread).
    pub fn seconds() -> Option<f64> {
        let clock = *CLOCK.get()?;
        // SAFETY: clock_gettime writes only the struct we pass; zeroed is a valid timespec.
        let mut t: libc::timespec = unsafe { std::mem::zeroed() };
        (unsafe { libc::clock_gettime(clock, &mut t) } == 0).then(|| t.tv_sec as f64 + t.tv_nsec as f64 / 1e9)
    }
}

/// With `--hostile`: the callers' figures without and with the hostile client, as medians of
/// the rounds, and their ratio.
fn print_hostile_summary(reports: &[Report]) {
    let median = |with: bool, f: fn(&Report) -> f64| {
        let mut v: Vec<f64> = reports.iter().filter(|r| r.hostile.is_some() == with).map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let Some(kind) = reports.iter().find_map(|r| r.hostile) else { return };
    let rounds = reports.iter().filter(|r| r.hostile.is_some()).count();
    let (clean, beside) = (median(false, |r| r.calls_per_s), median(true, |r| r.calls_per_s));
    let (p99_clean, p99_beside) = (median(false, |r| r.p99_us), median(true, |r| r.p99_us));
    let (max_clean, max_beside) = (median(false, |r| r.max_us), median(true, |r| r.max_us));
    println!("hostile client ({kind:?}), medians of {rounds} interleaved rounds:");
    println!(
        "  calls/s {clean:.0} without, {beside:.0} beside it: {:.1}%",
        beside / clean.max(f64::MIN_POSITIVE) * 100.0
    );
    println!(
        "  p99 us {p99_clean:.1} without, {p99_beside:.1} beside it; max us {max_clean:.1} and {max_beside:.1}"
    );
    let cpu = |with| reports.iter().filter(|r| r.hostile.is_some() == with).find_map(|r| r.server_cpu_pct);
    if cpu(true).is_some() {
        let (a, b) = (
            median(false, |r| r.server_cpu_pct.unwrap_or(0.0)),
            median(true, |r| r.server_cpu_pct.unwrap_or(0.0)),
        );
        println!("  server thread CPU {a:.1}% without, {b:.1}% beside it");
    }
}

/// The floor: a bare tokio TCP echo with a 4-byte length prefix, one connection per caller.
mod raw {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Mutex;
    use volley::bytes::Bytes;

    pub async fn listen() -> Result<String, String> {
        let l = TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.set_nodelay(true);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let Ok(n) = s.read_u32_le().await else { return };
                        buf.resize(n as usize + 4, 0);
                        buf[..4].copy_from_slice(&n.to_le_bytes());
                        if s.read_exact(&mut buf[4..]).await.is_err() || s.write_all(&buf).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(format!("tcp://{addr}"))
    }

    pub struct Conn(Arc<Mutex<TcpStream>>);

    pub async fn connect(addr: &str) -> Result<Conn, String> {
        let s = TcpStream::connect(addr.trim_start_matches("tcp://")).await.map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Conn(Arc::new(Mutex::new(s))))
    }

    impl Conn {
        pub fn call(&self, p: Bytes) -> impl std::future::Future<Output = Result<Bytes, String>> + use<> {
            let s = self.0.clone();
            async move {
                let mut s = s.lock().await;
                let mut msg = Vec::with_capacity(p.len() + 4);
                msg.extend_from_slice(&(p.len() as u32).to_le_bytes());
                msg.extend_from_slice(&p);
                s.write_all(&msg).await.map_err(|e| e.to_string())?;
                let n = s.read_u32_le().await.map_err(|e| e.to_string())?;
                let mut reply = vec![0; n as usize];
                s.read_exact(&mut reply).await.map_err(|e| e.to_string())?;
                Ok(reply.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_says_how_the_callers_connect() {
        assert_eq!(how_callers_connect("tcp", RegistryMode::None), "on one connection");
        assert_eq!(how_callers_connect("raw-tcp", RegistryMode::None), "each on its own connection");
        assert!(how_callers_connect("tcp", RegistryMode::Direct).contains("one connection per instance"));
        assert!(how_callers_connect("tcp", RegistryMode::Relayed).contains("through the controller"));
    }
}
