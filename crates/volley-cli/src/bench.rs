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
use volley::Client;
use volley::bytes::Bytes;

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
enum RuntimeMode {
    Split,
    Shared,
    Multi,
}

#[derive(Serialize, Debug)]
struct Report {
    transport: String,
    runtime: RuntimeMode,
    payload: usize,
    concurrency: usize,
    calls: u64,
    seconds: f64,
    calls_per_s: f64,
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
    let report = match (&args.connect, args.runtime) {
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
            let report = current_thread()?.block_on(drive(addr, args.clone()));
            let _ = stop_tx.send(());
            server_thread.join().map_err(|_| "server thread panicked".to_string())??;
            report?
        }
        (None, mode) => client_runtime(mode)?.block_on(async {
            if args.raw {
                let addr = raw::listen().await?;
                return drive(addr, args.clone()).await;
            }
            let server = server();
            let addr = server.listen(&listen_address(args.transport)).await.map_err(|e| e.to_string())?;
            let report = drive(addr.to_string(), args.clone()).await;
            server.shutdown().await;
            report
        })?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        print_report(&report);
    }
    if report.errors > 0 {
        return Err(format!("{} calls failed", report.errors));
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
    errors: u64,
    first_error: Option<String>,
}

async fn drive(addr: String, args: BenchArgs) -> Result<Report, String> {
    let client = Client::connect(&addr).await.map_err(|e| e.to_string())?;
    let payload = Bytes::from(vec![0xA5u8; args.payload]);
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let mut callers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (payload, phase) = (payload.clone(), phase.clone());
        callers.push(if args.raw {
            let conn = raw::connect(&addr).await?;
            tokio::spawn(caller(move |p| conn.call(p), payload, phase))
        } else {
            let client = client.clone();
            tokio::spawn(caller(
                move |p| {
                    let client = client.clone();
                    async move { client.call(&ECHO, p).await.map_err(|e| e.to_string()) }
                },
                payload,
                phase,
            ))
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
    let (mut calls, mut errors, mut first_error) = (0, 0, None);
    for c in callers {
        let r = c.await.map_err(|e| e.to_string())?;
        hist.add(&r.hist).map_err(|e| e.to_string())?;
        calls += r.calls;
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
        payload: args.payload,
        concurrency: args.concurrency,
        calls,
        seconds,
        calls_per_s: calls as f64 / seconds,
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

fn new_histogram() -> Histogram<u64> {
    // Nanoseconds up to 60 s at 2 significant digits: small enough to keep one per caller.
    Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid histogram bounds")
}

async fn caller<F, Fut>(mut call: F, payload: Bytes, phase: Arc<AtomicU8>) -> CallerResult
where
    F: FnMut(Bytes) -> Fut,
    Fut: std::future::Future<Output = Result<Bytes, String>>,
{
    let mut r = CallerResult { hist: new_histogram(), calls: 0, errors: 0, first_error: None };
    // One clock read per call: each call's end is the next one's start.
    let mut t0 = Instant::now();
    loop {
        let p = phase.load(Ordering::Relaxed);
        if p == STOP {
            return r;
        }
        let result = call(payload.clone()).await;
        let t1 = Instant::now();
        let ns = (t1 - t0).as_nanos() as u64;
        t0 = t1;
        let counted = p == MEASURE && phase.load(Ordering::Relaxed) == MEASURE;
        match result {
            Ok(reply) if reply.len() == payload.len() => {
                if counted {
                    r.hist.saturating_record(ns.max(1));
                    r.calls += 1;
                }
            }
            Ok(reply) => {
                r.errors += 1;
                r.first_error
                    .get_or_insert_with(|| format!("reply of {} bytes, sent {}", reply.len(), payload.len()));
            }
            Err(e) => {
                r.errors += 1;
                r.first_error.get_or_insert(e);
            }
        }
    }
}

fn print_report(r: &Report) {
    println!(
        "{} echo, {} B payload, {} callers on one connection, runtime {:?}",
        r.transport, r.payload, r.concurrency, r.runtime
    );
    println!("  {:.0} calls/s ({} calls in {:.2} s, {} errors)", r.calls_per_s, r.calls, r.seconds, r.errors);
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
