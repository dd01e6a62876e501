//! `volley-research large`: large-payload echo over TCP with the server's (de)serialization on the
//! connection's task ("inline") against on the codec pool ("offload"), side by side in one run.
//!
//! Two servers run in this process on one multi-thread runtime (two workers, as
//! `#[tokio::main]` gives on this machine): one with offloading turned off, one with
//! `--offload-min-bytes`. Each decodes every request into a typed value (`--codec fast`: a
//! bitcode struct of rows; `general`: the same as JSON) and encodes it back. One connection
//! carries `--concurrency` callers.
//!
//! The load generator is deliberately light: it sends a pre-encoded payload with `call_raw`
//! and checks the echoed bytes without decoding them, standing in for clients on other
//! machines. A typed client in the same process would spend as much CPU as the server and, on
//! two cores, hide what the server can do. Modes alternate round by round; medians are
//! reported with the offload ÷ inline ratio.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::output::outln;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use volley::bytes::{Bytes, BytesMut};
use volley::codec::Json;
use volley::{CallOptions, Client, Method, Server, Wire};

#[derive(Args, Debug, Clone)]
pub struct LargeArgs {
    /// Encoded size of each request (and reply).
    #[arg(long, default_value_t = 1 << 20)]
    payload_bytes: usize,
    /// Which codec the server decodes and encodes with.
    #[arg(long, value_enum, default_value_t = CodecChoice::Both)]
    codec: CodecChoice,
    /// Calls in flight on the one connection.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Rounds per mode (alternating); the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds measured per round (after a short warm-up).
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// The offloading server's threshold.
    #[arg(long, default_value_t = 64 << 10)]
    offload_min_bytes: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq)]
enum CodecChoice {
    Fast,
    General,
    Both,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    id: u64,
    score: f64,
    title: String,
    tags: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Rows {
    rows: Vec<Row>,
}
volley::wire!(Rows);

const FAST: Method<Rows, Rows> = Method::new("large", "fast");
const GENERAL: Method<Json<Rows>, Json<Rows>> = Method::new("large", "general");

#[derive(Serialize)]
struct Line {
    codec: &'static str,
    mode: &'static str,
    payload_bytes: usize,
    concurrency: usize,
    rounds: usize,
    /// Median over the rounds.
    calls_per_s: f64,
    /// Payload bytes echoed per second, one way.
    mib_per_s: f64,
    /// Median offload ÷ median inline (on the offload line only).
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
}

pub fn run(args: LargeArgs) -> Result<(), String> {
    if args.rounds == 0 || args.concurrency == 0 || args.duration <= 0.0 {
        return Err("--rounds, --concurrency and --duration must be positive".into());
    }
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("server")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let servers = server_rt.block_on(start_servers(args.offload_min_bytes))?;
    let client_rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let codecs: &[&'static str] = match args.codec {
        CodecChoice::Fast => &["fast"],
        CodecChoice::General => &["general"],
        CodecChoice::Both => &["fast", "general"],
    };
    if !args.json {
        outln!(
            "large-payload echo over tcp: {} B requests, {} callers on one connection, {} rounds × {} s",
            args.payload_bytes,
            args.concurrency,
            args.rounds,
            args.duration
        );
        outln!("{:<8} {:<8} {:>12} {:>10} {:>8}", "codec", "mode", "calls/s", "MiB/s", "ratio");
    }
    let addrs = [servers[0].1.as_str(), servers[1].1.as_str()];
    let result = codecs.iter().try_for_each(|&codec| compare(&client_rt, addrs, codec, &args));
    server_rt.block_on(async {
        for (server, _) in servers {
            server.shutdown().await;
        }
    });
    result
}

/// The inline server (offloading turned off), then the offloading one, with their addresses.
async fn start_servers(offload_min_bytes: usize) -> Result<Vec<(Server, String)>, String> {
    let mut servers = Vec::new();
    for min in [usize::MAX, offload_min_bytes] {
        let server =
            Server::builder().offload_min_bytes(min).handle_fn(&FAST, Ok).handle_fn(&GENERAL, Ok).build();
        let addr = server.listen("tcp://127.0.0.1:0").await.map_err(|e| e.to_string())?;
        servers.push((server, addr.to_string()));
    }
    Ok(servers)
}

/// One codec through both servers (`[inline, offload]`), rounds alternating; prints the
/// medians and their ratio.
fn compare(
    rt: &tokio::runtime::Runtime,
    addrs: [&str; 2],
    codec: &'static str,
    args: &LargeArgs,
) -> Result<(), String> {
    let payload = match codec {
        "fast" => encode_sized(args.payload_bytes, |rows| Rows { rows }),
        _ => encode_sized(args.payload_bytes, |rows| Json(Rows { rows })),
    };
    let method = if codec == "fast" { FAST.name() } else { GENERAL.name() };
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        // Alternate which mode goes first so drift on a shared machine favours neither.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for mode in order {
            rates[mode].push(rt.block_on(measure(addrs[mode], method, payload.clone(), args))?);
        }
    }
    let inline = median(&mut rates[0]);
    let offload = median(&mut rates[1]);
    let mib = |rate: f64| rate * payload.len() as f64 / (1 << 20) as f64;
    for (mode, rate, ratio) in [("inline", inline, None), ("offload", offload, Some(offload / inline))] {
        let line = Line {
            codec,
            mode,
            payload_bytes: payload.len(),
            concurrency: args.concurrency,
            rounds: args.rounds,
            calls_per_s: rate,
            mib_per_s: mib(rate),
            ratio,
        };
        if args.json {
            outln!("{}", serde_json::to_string(&line).map_err(|e| e.to_string())?);
        } else {
            let ratio = ratio.map(|r| format!("{r:.2}×")).unwrap_or_default();
            outln!("{codec:<8} {mode:<8} {rate:>12.1} {:>10.1} {ratio:>8}", mib(rate));
        }
    }
    Ok(())
}

/// The encoded bytes of a value of about `target` bytes, built from rows by `make`.
fn encode_sized<T: Wire>(target: usize, make: impl Fn(Vec<Row>) -> T) -> Bytes {
    let row = |id: u64| Row {
        id,
        score: id as f64 / 4.0, // exact in binary and decimal, so JSON echoes it byte for byte
        title: format!("document title number {id:010}"),
        tags: vec![id as u32, 7, 42, 1000 + id as u32],
    };
    let encoded = |n: u64| {
        let mut buf = BytesMut::new();
        make((0..n).map(row).collect()).encode(&mut buf).expect("rows encode");
        buf.freeze()
    };
    let per_row = encoded(1000).len() as f64 / 1000.0;
    encoded(((target as f64 / per_row) as u64).max(1))
}

/// Calls per second echoing `payload` with `concurrency` callers for the round's duration.
async fn measure(addr: &str, method: &'static str, payload: Bytes, args: &LargeArgs) -> Result<f64, String> {
    let client = Client::connect(addr).await.map_err(|e| e.to_string())?;
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (client, payload) = (client.clone(), payload.clone());
            let (counting, stop, done) = (counting.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let reply = client
                        .call_raw("large", method, payload.clone(), CallOptions::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    // Echoing a value through a deterministic codec gives the same bytes back.
                    let head = payload.len().min(64);
                    if reply.len() != payload.len() || reply[..head] != payload[..head] {
                        return Err("the echo differs from the request".to_string());
                    }
                    if counting.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
    let calls = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.map_err(|e| e.to_string())??;
    }
    Ok(calls as f64 / elapsed)
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
