//! What `volley bench` is asked to measure: its flags, and the checks that they fit together.

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::api::ApiChoice;
use super::hostile::Hostile;
use super::transport::Transport;
use crate::echo::ECHO;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Transport for the in-process server (ignored with --connect).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Drive an already running `volley serve-echo` at this address instead.
    #[arg(long)]
    pub connect: Option<String>,
    /// Find the echo service through the registry at this address (servers registered with
    /// `volley serve-echo --registry`) instead of starting one. Implies `--mode direct` unless
    /// `--mode relayed` is given.
    #[arg(long)]
    pub registry: Option<String>,
    /// The service to resolve through the registry.
    #[arg(long, default_value = "echo")]
    pub service: String,
    /// Comma-separated or repeated. Call style: `single` (the default), `batch` (`call_batch`
    /// of `--batch-size` requests) or `both` (one after the other in this run, to compare).
    /// Registry mode: `direct` (resolve once, call instances) or `relayed` (every call through
    /// the controller); without `--registry` an in-process controller is started and the server
    /// registers with it.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub mode: Vec<BenchMode>,
    /// Requests per `call_batch` in batch mode.
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// Requests per chunk (one message on the wire) in batch mode.
    #[arg(long, default_value_t = 128)]
    pub chunk_size: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Concurrent callers, sharing one connection (through a registry in direct mode: one
    /// connection per instance; with --raw: one connection each).
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Warm-up seconds, not measured.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// How threads are used: `split` = server and client each on their own single-threaded
    /// runtime (one core each; the default, fastest here), `shared` = both on one
    /// single-threaded runtime, `multi` = both on one two-worker multi-threaded runtime.
    #[arg(long, value_enum, default_value_t = RuntimeMode::Split)]
    pub runtime: RuntimeMode,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The API that calls and serves: `method` (`Client::call(&ECHO, ..)` against a
    /// `handle_fn` closure), `generated` (the `Echo` trait's `EchoClient` and `EchoServer`),
    /// or `both` (a server for each in this process, measured in turn: with `--rounds`, the
    /// generated form's cost against the `Method` layer's).
    #[arg(long, value_enum, default_value_t = ApiChoice::Method)]
    pub api: ApiChoice,
    /// Measure everything this many times, interleaved (round 1 of every API and call style,
    /// then round 2, ...; the APIs take turns going first); with `--api both` the text report
    /// ends with the ratio of the medians.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// The in-process server's handler: `sync` (runs inline: `handle_fn`, a `#[sync] fn`) or
    /// `async` (a future per request: `handle`, an `async fn`).
    #[arg(long, value_enum, default_value_t = Handler::Sync)]
    pub handler: Handler,
    /// Instead of Volley, run a bare tokio ping-pong (length-prefixed echo, one connection
    /// per caller, same runtime setup): the floor Volley's latency is compared against.
    #[arg(long)]
    pub raw: bool,
    /// One hostile client beside the callers, on a connection of its own: `noread` pipelines
    /// 1 KiB requests and never reads a reply, `pipeline` pipelines frames of 1,000 requests
    /// without end. Every round measures the callers without it, then with it.
    #[arg(long, value_enum)]
    pub hostile: Option<Hostile>,
    /// Each caller waits this long after every call (0: calls back to back). With
    /// `--concurrency 1 --pace-ms 10`, one connection calling every 10 ms.
    #[arg(long, default_value_t = 0)]
    pub pace_ms: u64,
    /// The token to present to the server and the registry (environment: VOLLEY_TOKEN).
    #[arg(long, env = "VOLLEY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Keep no per-method metrics in the in-process server and the callers (they are on by
    /// default): run with and without it to measure what they cost.
    #[arg(long)]
    pub no_metrics: bool,
    /// Measure server streams instead (PROTOCOL.md §9.9): items per second of one stream and
    /// of `--streams` concurrent streams of `--payload`-byte items, beside `call_batch` of
    /// `--batch-size` by `--concurrency` callers, on one server over `--transport tcp|unix`.
    #[arg(long)]
    pub stream: bool,
    /// Concurrent streams in the second stream measurement of `--stream`.
    #[arg(long, default_value_t = 256)]
    pub streams: usize,
    /// Each stream's credit window in `--stream` (items the server may send ahead).
    #[arg(long, default_value_t = 256)]
    pub stream_window: u32,
    /// In direct registry mode, connect to instances on this host through the same-host
    /// address they registered (`serve-echo --listen-local`), if any. Without --registry, the
    /// in-process server also listens on shared memory and registers that address beside its
    /// --transport one. The report's transport is the one the calls went over.
    #[arg(long)]
    pub prefer_local: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Handler {
    Sync,
    Async,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchMode {
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
pub enum Style {
    Single,
    Batch,
    Mix,
}

impl Style {
    pub fn name(self) -> &'static str {
        match self {
            Style::Single => "single",
            Style::Batch => "batch",
            Style::Mix => "mix",
        }
    }
}

/// How the client finds the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RegistryMode {
    /// By address (`--connect`, or the in-process server's address).
    None,
    Direct,
    Relayed,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeMode {
    Split,
    Shared,
    Multi,
}

/// Checks `--mode` and the flags that go with it; returns the registry mode and the call
/// styles to measure, in order.
pub fn plan(args: &BenchArgs) -> Result<(RegistryMode, Vec<Style>), String> {
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
    if args.prefer_local && mode != RegistryMode::Direct {
        return Err("--prefer-local picks an instance's address through the registry: it needs --mode direct or --registry".into());
    }
    if args.prefer_local
        && args.registry.is_none()
        && !matches!(args.transport, Transport::Tcp | Transport::Unix)
    {
        return Err(
            "--prefer-local adds a shm address beside the in-process server's: use --transport tcp or unix"
                .into(),
        );
    }
    if mode != RegistryMode::None && args.transport == Transport::Tls {
        return Err("--transport tls measures a server by address, without a registry".into());
    }
    if args.hostile.is_some()
        && (mode != RegistryMode::None || args.raw || !args.transport.hostile_can_reach())
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
