//! One measurement: a server on its own thread and runtime, a client on another, each pinned
//! to its own core, both torn down afterwards so nothing carries over between measurements.

use std::time::{Duration, Instant};

use core_affinity::CoreId;
use serde::{Deserialize, Serialize};

use crate::load::{self, LoadSpec, Sample};
use crate::scenario::{Kind, Scenario, Settings, pin, unique, unix_path};
use crate::{raw_echo, tarpc_echo, tonic_echo, volley_echo};

/// A framework on one transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    VolleyTcp,
    TonicTcp,
    TarpcTcp,
    VolleyUnix,
    VolleyInproc,
    TarpcInproc,
    /// No framework: the bundled echo on blocking threads (throughput) and a tokio
    /// ping-pong (latency), the ceiling the frameworks are measured against.
    RawTcp,
    RawUnix,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::VolleyTcp,
        Target::TonicTcp,
        Target::TarpcTcp,
        Target::VolleyUnix,
        Target::VolleyInproc,
        Target::TarpcInproc,
        Target::RawTcp,
        Target::RawUnix,
    ];

    pub fn framework(self) -> &'static str {
        match self {
            Target::VolleyTcp | Target::VolleyUnix | Target::VolleyInproc => "volley",
            Target::TonicTcp => "tonic",
            Target::TarpcTcp | Target::TarpcInproc => "tarpc",
            Target::RawTcp | Target::RawUnix => "raw",
        }
    }

    pub fn transport(self) -> &'static str {
        match self {
            Target::VolleyTcp | Target::TonicTcp | Target::TarpcTcp | Target::RawTcp => "tcp",
            Target::VolleyUnix | Target::RawUnix => "unix",
            Target::VolleyInproc | Target::TarpcInproc => "inproc",
        }
    }

    pub fn label(self) -> String {
        format!("{}/{}", self.framework(), self.transport())
    }

    /// The ways this target runs a scenario (for a batch, best candidates first); none where
    /// it has no way (the raw echo has no batch of its own: its throughput rows are one).
    pub fn methods(self, kind: Kind) -> &'static [Method] {
        match (self.framework(), kind) {
            ("raw", Kind::Latency) => &[Method::PingPong],
            ("raw", Kind::Throughput) => &[Method::Bundled],
            ("raw", Kind::Batch) => &[],
            ("volley", Kind::Batch) => &[Method::CallBatchStream, Method::BatchHandler],
            ("tonic", Kind::Batch) => &[Method::Unary, Method::BidiStream],
            ("volley" | "tonic", Kind::ServerStream) => &[Method::ServerStream],
            (_, Kind::ServerStream) => &[],
            _ => &[Method::Unary],
        }
    }
}

/// How the calls of a measurement are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// One call per request (`Client::call`, a gRPC unary call, a tarpc call).
    Unary,
    /// Volley's `Client::call_batch_stream`, served by the same per-request handler as every
    /// other scenario.
    CallBatchStream,
    /// `Client::call_batch_stream` to a batch handler (`ServerBuilder::handle_batch`).
    #[serde(rename = "call_batch_stream+handle_batch")]
    BatchHandler,
    /// One gRPC bidirectional stream carrying every request.
    BidiStream,
    /// Server streams: Volley's (PROTOCOL.md §9.9) and gRPC's server streaming.
    ServerStream,
    /// The raw echo's bundles: all callers' messages in one write, on blocking threads.
    Bundled,
    /// The raw echo one message at a time on tokio.
    PingPong,
}

/// The tokio runtime each side runs on.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// `new_current_thread`: everything on the one (pinned) thread.
    Current,
    /// `new_multi_thread().worker_threads(1)`: one worker (pinned), work runs on it.
    Multi1,
    /// No runtime: plain blocking threads (the raw bundled echo only, so not an option).
    #[value(skip)]
    Threads,
}

impl Flavor {
    pub fn short(self) -> &'static str {
        match self {
            Flavor::Current => "ct",
            Flavor::Multi1 => "mt",
            Flavor::Threads => "th",
        }
    }
}

/// Where the client finds the server.
enum Endpoint {
    Volley(String),
    Tonic(std::net::SocketAddr),
    TarpcTcp(std::net::SocketAddr),
    TarpcInproc(tarpc_echo::ClientChannel),
    Raw(raw_echo::Addr),
}

enum Running {
    Volley(volley::Server),
    Tonic(tonic_echo::Running),
    Tarpc(tokio::task::JoinHandle<()>),
    Raw(tokio::task::JoinHandle<()>, raw_echo::Addr),
}

async fn start(target: Target) -> Result<(Running, Endpoint), String> {
    let volley = |addr: String| async move {
        let (server, bound) = volley_echo::serve(&addr).await?;
        Ok::<_, String>((Running::Volley(server), Endpoint::Volley(bound)))
    };
    match target {
        Target::VolleyTcp => volley("tcp://127.0.0.1:0".into()).await,
        Target::VolleyUnix => volley(format!("unix://{}", unix_path("volley").display())).await,
        Target::VolleyInproc => volley(format!("inproc://volley-compare-{}", unique())).await,
        Target::TonicTcp => {
            let (running, addr) = tonic_echo::serve().await?;
            Ok((Running::Tonic(running), Endpoint::Tonic(addr)))
        }
        Target::TarpcTcp => {
            let (task, addr) = tarpc_echo::serve_tcp().await?;
            Ok((Running::Tarpc(task), Endpoint::TarpcTcp(addr)))
        }
        Target::TarpcInproc => {
            let (task, channel) = tarpc_echo::serve_inproc();
            Ok((Running::Tarpc(task), Endpoint::TarpcInproc(channel)))
        }
        Target::RawTcp | Target::RawUnix => {
            let addr = match target {
                Target::RawTcp => raw_echo::Addr::Tcp(([127, 0, 0, 1], 0).into()),
                _ => raw_echo::Addr::Unix(unix_path("raw")),
            };
            let (task, bound) = raw_echo::serve(addr).await.map_err(|e| format!("raw echo: {e}"))?;
            Ok((Running::Raw(task, bound.clone()), Endpoint::Raw(bound)))
        }
    }
}

async fn stop(r: Running) {
    match r {
        Running::Volley(s) => volley_echo::stop(s).await,
        Running::Tonic(t) => tonic_echo::stop(t).await,
        Running::Tarpc(task) => task.abort(),
        Running::Raw(task, addr) => {
            task.abort();
            if let raw_echo::Addr::Unix(path) = addr {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The client side of one measurement.
async fn drive(ep: Endpoint, sc: Scenario, method: Method, s: Settings) -> Result<Sample, String> {
    let spec = LoadSpec {
        concurrency: sc.concurrency,
        payload: sc.payload,
        warmup: s.warmup,
        duration: s.duration,
        rate: s.rate,
    };
    // Batch runs warm up on a twentieth of the requests first (connections, buffers, caches).
    let warm = (sc.requests / 20).max(1);
    match (ep, sc.kind, method) {
        (Endpoint::Volley(addr), Kind::Batch, m) => {
            let c = volley_echo::connect(&addr).await?;
            let to_batch_handler = m == Method::BatchHandler;
            let (chunk, window) = (s.chunk_size, s.chunk_window);
            volley_echo::batch(&c, to_batch_handler, warm, chunk, window, sc.payload).await;
            Ok(volley_echo::batch(&c, to_batch_handler, sc.requests, chunk, window, sc.payload).await)
        }
        (Endpoint::Volley(addr), Kind::ServerStream, _) => {
            let c = volley_echo::connect(&addr).await?;
            let (n, per) = (sc.concurrency, sc.requests / sc.concurrency.max(1) as u64);
            volley_echo::server_streams(&c, n, (per / 20).max(1), sc.payload, s.stream_window).await;
            Ok(volley_echo::server_streams(&c, n, per, sc.payload, s.stream_window).await)
        }
        (Endpoint::Volley(addr), _, _) => load::run(volley_echo::connect(&addr).await?, spec).await,
        (Endpoint::Tonic(addr), Kind::Batch, Method::BidiStream) => {
            let c = tonic_echo::connect(addr).await?;
            tonic_echo::stream_batch(&c, warm, sc.payload).await;
            Ok(tonic_echo::stream_batch(&c, sc.requests, sc.payload).await)
        }
        (Endpoint::Tonic(addr), Kind::Batch, _) => {
            let c = tonic_echo::connect(addr).await?;
            unary_batch(c, sc, warm, &s).await
        }
        (Endpoint::Tonic(addr), Kind::ServerStream, _) => {
            let c = tonic_echo::connect(addr).await?;
            let (n, per) = (sc.concurrency, sc.requests / sc.concurrency.max(1) as u64);
            tonic_echo::server_streams(&c, n, (per / 20).max(1), sc.payload).await;
            Ok(tonic_echo::server_streams(&c, n, per, sc.payload).await)
        }
        (Endpoint::Tonic(addr), _, _) => load::run(tonic_echo::connect(addr).await?, spec).await,
        (Endpoint::TarpcTcp(addr), Kind::Batch, _) => {
            unary_batch(tarpc_echo::connect_tcp(addr).await?, sc, warm, &s).await
        }
        (Endpoint::TarpcTcp(addr), _, _) => load::run(tarpc_echo::connect_tcp(addr).await?, spec).await,
        (Endpoint::TarpcInproc(ch), Kind::Batch, _) => {
            unary_batch(tarpc_echo::connect_inproc(ch), sc, warm, &s).await
        }
        (Endpoint::TarpcInproc(ch), _, _) => load::run(tarpc_echo::connect_inproc(ch), spec).await,
        (Endpoint::Raw(addr), _, _) => load::run(raw_echo::PingPong::new(addr), spec).await,
    }
}

async fn unary_batch<C: load::Caller>(c: C, sc: Scenario, warm: u64, s: &Settings) -> Result<Sample, String> {
    let now = Instant::now();
    load::unary_window(c.clone(), warm, sc.concurrency, sc.payload, now + s.warmup).await?;
    load::unary_window(c, sc.requests, sc.concurrency, sc.payload, Instant::now() + s.batch_max).await
}

fn runtime(flavor: Flavor, core: Option<CoreId>, name: &str) -> Result<tokio::runtime::Runtime, String> {
    // The thread building the runtime is the one `block_on` runs on: pin it too.
    pin(core);
    let mut b = match flavor {
        Flavor::Current => tokio::runtime::Builder::new_current_thread(),
        Flavor::Multi1 => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            // Every thread the runtime starts (its worker, and blocking threads should any
            // appear) lands on the same core.
            b.worker_threads(1).thread_name(name).on_thread_start(move || pin(core));
            b
        }
        Flavor::Threads => return Err("plain threads have no tokio runtime".into()),
    };
    b.enable_all().build().map_err(|e| e.to_string())
}

/// Runs one measurement of `target` on `flavor` runtimes and tears everything down.
pub fn measure(
    target: Target,
    flavor: Flavor,
    sc: Scenario,
    method: Method,
    s: &Settings,
) -> Result<Sample, String> {
    if method == Method::Bundled {
        return raw_echo::bundled(target.transport(), sc, s);
    }
    let (server_core, client_core) = match s.cores {
        Some((a, b)) => (Some(a), Some(b)),
        None => (None, None),
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Endpoint, String>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::Builder::new()
        .name("compare-server".into())
        .spawn(move || -> Result<(), String> {
            let rt = runtime(flavor, server_core, "compare-server-worker")?;
            // Spawned, so that on the multi-thread runtime the server runs on its worker.
            let served = rt.block_on(async move {
                tokio::spawn(async move {
                    match start(target).await {
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                        Ok((running, ep)) => {
                            let _ = ready_tx.send(Ok(ep));
                            let _ = stop_rx.await;
                            stop(running).await;
                        }
                    }
                })
                .await
            });
            rt.shutdown_timeout(Duration::from_millis(500));
            served.map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let result = match ready_rx.recv() {
        Ok(Ok(ep)) => {
            let s = s.clone();
            let client = std::thread::Builder::new()
                .name("compare-client".into())
                .spawn(move || -> Result<Sample, String> {
                    let rt = runtime(flavor, client_core, "compare-client-worker")?;
                    let sample = rt.block_on(async move { tokio::spawn(drive(ep, sc, method, s)).await });
                    rt.shutdown_timeout(Duration::from_millis(500));
                    sample.map_err(|e| e.to_string())?
                })
                .map_err(|e| e.to_string())?;
            client.join().map_err(|_| "client thread panicked".to_string())?
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err("server thread ended before it was ready".into()),
    };
    let _ = stop_tx.send(());
    server.join().map_err(|_| "server thread panicked".to_string())??;
    result
}
