//! `volley bench`: the echo benchmark.
//!
//! N concurrent callers share one connection and call `echo/echo` in a loop for a fixed time
//! after a warm-up. Latency of every call goes into an HDR histogram; throughput is calls
//! completed inside the measured window divided by its length. Frames and messages sent by the
//! client show how well bundling works (messages per frame).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use volley::bytes::Bytes;
use volley::{BatchOptions, Client};

use crate::echo::{ECHO, server};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Transport for the in-process server (ignored with --connect).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    transport: Transport,
    /// Drive an already running `volley serve-echo` at this address instead.
    #[arg(long)]
    connect: Option<String>,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Concurrent callers, all sharing one connection.
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
    /// How calls are made: `single` (one call per request), `batch` (`call_batch` of
    /// `--batch-size` requests), or `both` (one after the other in this run, to compare).
    /// Comma-separated; `direct` (the default) and `relayed` choose how a registry-resolved
    /// service is reached.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "single")]
    mode: Vec<Mode>,
    /// Requests per `call_batch` in batch mode.
    #[arg(long, default_value_t = 128)]
    batch_size: usize,
    /// Requests per chunk (one message on the wire) in batch mode.
    #[arg(long, default_value_t = 128)]
    chunk_size: usize,
    /// Instead of Volley, run a bare tokio ping-pong (length-prefixed echo, one connection
    /// per caller, same runtime setup): the floor Volley's latency is compared against.
    #[arg(long)]
    raw: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Transport {
    Inproc,
    Unix,
    Tcp,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Single,
    Batch,
    Both,
    Direct,
    Relayed,
}

/// How one measurement makes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Style {
    Single,
    Batch,
}

impl BenchArgs {
    fn styles(&self) -> Vec<Style> {
        let has = |m| self.mode.contains(&m);
        match (has(Mode::Single), has(Mode::Batch), has(Mode::Both)) {
            (_, _, true) | (true, true, _) => vec![Style::Single, Style::Batch],
            (_, true, _) => vec![Style::Batch],
            _ => vec![Style::Single],
        }
    }
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
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.raw && (args.connect.is_some() || args.transport != Transport::Tcp) {
        return Err("--raw runs its own bare tcp echo: use it with --transport tcp, without --connect".into());
    }
    if args.raw && args.styles() != [Style::Single] {
        return Err("--raw measures single calls only".into());
    }
    if args.mode.contains(&Mode::Relayed) {
        return Err("--mode relayed needs a registry (--registry), which this build does not have yet".into());
    }
    let reports = match (&args.connect, args.runtime) {
        (Some(addr), _) => client_runtime(args.runtime)?.block_on(drive(addr.clone(), args.clone()))?,
        (None, RuntimeMode::Split) => {
            // The server gets a thread and a single-threaded runtime of its own.
            let (addr_tx, addr_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let listen = listen_address(args.transport);
            let raw = args.raw;
            let server_thread = std::thread::Builder::new()
                .name("volley-server".into())
                .spawn(move || -> Result<(), String> {
                    let rt = current_thread()?;
                    rt.block_on(async move {
                        if raw {
                            let bound = raw::listen().await;
                            let _ = addr_tx.send(bound);
                            let _ = stop_rx.await;
                            return;
                        }
                        let server = server();
                        let bound = server.listen(&listen).await.map_err(|e| e.to_string());
                        let ok = bound.is_ok();
                        let _ = addr_tx.send(bound.map(|a| a.to_string()));
                        if ok {
                            let _ = stop_rx.await;
                            server.shutdown().await;
                        }
                    });
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
            let addr = addr_rx.recv().map_err(|e| e.to_string())??;
            let reports = current_thread()?.block_on(drive(addr, args.clone()));
            let _ = stop_tx.send(());
            server_thread.join().map_err(|_| "server thread panicked".to_string())??;
            reports?
        }
        (None, mode) => client_runtime(mode)?.block_on(async {
            if args.raw {
                let addr = raw::listen().await?;
                return drive(addr, args.clone()).await;
            }
            let server = server();
            let addr = server.listen(&listen_address(args.transport)).await.map_err(|e| e.to_string())?;
            let reports = drive(addr.to_string(), args.clone()).await;
            server.shutdown().await;
            reports
        })?,
    };
    for report in &reports {
        if args.json {
            println!("{}", serde_json::to_string(report).map_err(|e| e.to_string())?);
        } else {
            print_report(report);
        }
    }
    if let [single, batch] = &reports[..]
        && !args.json
    {
        println!(
            "batch/single: {:.1}x the requests per second",
            batch.items_per_s / single.items_per_s.max(f64::MIN_POSITIVE)
        );
    }
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    if errors > 0 {
        return Err(format!("{errors} requests failed"));
    }
    Ok(())
}

fn listen_address(t: Transport) -> String {
    match t {
        Transport::Inproc => "inproc://bench-echo".into(),
        Transport::Unix => {
            format!("unix://{}/volley-bench-{}.sock", std::env::temp_dir().display(), std::process::id())
        }
        Transport::Tcp => "tcp://127.0.0.1:0".into(),
    }
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

async fn drive(addr: String, args: BenchArgs) -> Result<Vec<Report>, String> {
    let client = Client::connect(&addr).await.map_err(|e| e.to_string())?;
    let mut reports = Vec::new();
    for style in args.styles() {
        reports.push(measure(&client, &addr, &args, style).await?);
    }
    Ok(reports)
}

/// One measurement: warm up, measure, gather the callers' histograms.
async fn measure(client: &Client, addr: &str, args: &BenchArgs, style: Style) -> Result<Report, String> {
    // A static payload: cloning it costs no reference counting, so the figures measure Volley
    // rather than the load generator (the server's replies are still real buffers).
    let payload = Bytes::from_static(Vec::leak(vec![0xA5u8; args.payload]));
    let batch_size = if style == Style::Batch { args.batch_size.max(1) } else { 1 };
    let opts = BatchOptions::default().chunk_size(args.chunk_size);
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let mut callers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (payload, phase, client) = (payload.clone(), phase.clone(), client.clone());
        callers.push(match (args.raw, style) {
            (true, _) => {
                let conn = raw::connect(addr).await?;
                tokio::spawn(caller(move || single_outcome(conn.call(payload.clone()), payload.len()), phase))
            }
            (false, Style::Single) => tokio::spawn(caller(
                move || {
                    let (client, payload) = (client.clone(), payload.clone());
                    let n = payload.len();
                    single_outcome(
                        async move { client.call(&ECHO, payload).await.map_err(|e| e.to_string()) },
                        n,
                    )
                },
                phase,
            )),
            (false, Style::Batch) => tokio::spawn(caller(
                move || {
                    let (client, payload) = (client.clone(), payload.clone());
                    async move {
                        let reqs = (0..batch_size).map(|_| payload.clone());
                        let mut o = Outcome::default();
                        for r in client.call_batch_with(&ECHO, reqs, opts).await {
                            match r {
                                Ok(reply) if reply.len() == payload.len() => o.ok += 1,
                                Ok(reply) => {
                                    o.fail(format!("reply of {} bytes, sent {}", reply.len(), payload.len()))
                                }
                                Err(e) => o.fail(e.to_string()),
                            }
                        }
                        o
                    }
                },
                phase,
            )),
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let before = client.counters();
    let start = Instant::now();
    phase.store(MEASURE, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
    phase.store(STOP, Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    let after = client.counters();
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
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let frames_sent = after.frames_sent - before.frames_sent;
    let messages_sent = after.messages_sent - before.messages_sent;
    Ok(Report {
        transport: if args.raw {
            "raw-tcp".into()
        } else {
            addr.split("://").next().unwrap_or("?").to_string()
        },
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
    })
}

/// What one call (single or batch) achieved.
#[derive(Default)]
struct Outcome {
    ok: u64,
    failed: u64,
    error: Option<String>,
}

impl Outcome {
    fn fail(&mut self, e: String) {
        self.failed += 1;
        self.error.get_or_insert(e);
    }
}

async fn single_outcome(
    call: impl std::future::Future<Output = Result<Bytes, String>>,
    len: usize,
) -> Outcome {
    let mut o = Outcome::default();
    match call.await {
        Ok(reply) if reply.len() == len => o.ok = 1,
        Ok(reply) => o.fail(format!("reply of {} bytes, sent {len}", reply.len())),
        Err(e) => o.fail(e),
    }
    o
}

fn new_histogram() -> Histogram<u64> {
    // Nanoseconds up to 60 s at 2 significant digits: small enough to keep one per caller.
    Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid histogram bounds")
}

async fn caller<F, Fut>(mut call: F, phase: Arc<AtomicU8>) -> CallerResult
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
        t0 = t1;
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
    println!(
        "{} echo, {} B payload, {} callers on one connection, runtime {:?}, {:?} calls{}",
        r.transport,
        r.payload,
        r.concurrency,
        r.runtime,
        r.mode,
        if r.mode == Style::Batch { format!(" of {} requests", r.batch_size) } else { String::new() }
    );
    println!("  {:.0} calls/s ({} calls in {:.2} s, {} errors)", r.calls_per_s, r.calls, r.seconds, r.errors);
    if r.mode == Style::Batch {
        println!("  {:.0} requests/s; latency below is per batch call", r.items_per_s);
    }
    println!(
        "  latency us: p50 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        r.p50_us, r.p95_us, r.p99_us, r.p999_us, r.max_us
    );
    println!(
        "  client sent {} messages in {} frames ({:.1} messages per frame)",
        r.messages_sent, r.frames_sent, r.messages_per_frame
    );
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
