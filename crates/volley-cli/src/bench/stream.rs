//! `volley bench --stream`: items per second through server streams, beside `call_batch` in
//! the same run and on the same server.
//!
//! The server (its own thread and single-threaded runtime, as `--runtime split`) serves
//! `echo/echo` and a stream method whose producer yields `--payload`-byte items as fast as
//! credit allows. Three measurements, each after a warm-up: `--concurrency` callers making
//! `call_batch`es of `--batch-size`; one stream read as fast as it comes; `--streams`
//! concurrent streams (default 256) on the one connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde::Serialize;
use volley::{BatchOptions, Client, Server, Status, StreamMethod, StreamOptions};

use super::BenchArgs;
use super::transport::{Transport, client_config};
use crate::echo::ECHO;
use crate::output::outln;

/// The stream method: items of the payload the request names the size of, without end.
const ITEMS: StreamMethod<u64, Bytes> = StreamMethod::new("bench", "items");

/// One measurement's result.
#[derive(Debug, Serialize)]
struct Figure {
    what: String,
    items_per_s: f64,
    items: u64,
    seconds: f64,
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    if !matches!(args.transport, Transport::Tcp | Transport::Unix) || args.connect.is_some() {
        return Err("--stream starts its own server: use it with --transport tcp or unix".into());
    }
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let listen = args.transport.listen_address("stream");
    let server_thread = std::thread::Builder::new()
        .name("volley-server".into())
        .spawn(move || -> Result<(), String> {
            let rt = current_thread()?;
            rt.block_on(async move {
                let server = Server::builder()
                    .handle_fn(&ECHO, Ok)
                    .handle_stream(&ITEMS, |size: u64| async move {
                        let item = Bytes::from(vec![7u8; size as usize]);
                        Ok(futures_util::stream::repeat_with(move || Ok::<_, Status>(item.clone())))
                    })
                    .build();
                match server.listen(&listen).await {
                    Ok(addr) => {
                        let _ = addr_tx.send(Ok(addr.to_string()));
                        let _ = stop_rx.await;
                        server.shutdown().await;
                    }
                    Err(e) => {
                        let _ = addr_tx.send(Err(e.to_string()));
                    }
                }
            });
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let addr = addr_rx.recv().map_err(|e| e.to_string())??;
    let figures = current_thread()?.block_on(measure_all(&addr, args));
    let _ = stop_tx.send(());
    server_thread.join().map_err(|_| "server thread panicked".to_string())??;
    let figures = figures?;
    report(&figures, args)
}

async fn measure_all(addr: &str, args: &BenchArgs) -> Result<Vec<Figure>, String> {
    let config = client_config(addr, args.token.as_deref());
    let client = Client::connect_with(addr, config).await.map_err(|e| e.to_string())?;
    let (warmup, duration) = (Duration::from_secs_f64(args.warmup), Duration::from_secs_f64(args.duration));
    let payload = Bytes::from(vec![7u8; args.payload]);
    let batch = args.batch_size.max(1);
    let batch_opts = BatchOptions::default().chunk_size(args.chunk_size.max(1));
    let callers = args.concurrency.max(1);
    let batches = measure(warmup, duration, callers, |counted, stop| {
        let (client, payload) = (client.clone(), payload.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let results = client.call_batch_with(&ECHO, vec![payload.clone(); batch], batch_opts).await;
                if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
                    return Err(e.to_string());
                }
                counted.fetch_add(results.len() as u64, Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .await?;
    let mut figures = vec![Figure { what: format!("call_batch ({callers} callers × {batch})"), ..batches }];
    let window = args.stream_window;
    for streams in [1, args.streams.max(1)] {
        let f = measure(warmup, duration, streams, |counted, stop| {
            let client = client.clone();
            let size = args.payload as u64;
            async move {
                let opts = StreamOptions::default().window(window);
                let mut s = client.open_stream_with(&ITEMS, size, opts).await.map_err(|e| e.to_string())?;
                while !stop.load(Ordering::Relaxed) {
                    match s.next().await {
                        Some(Ok(_)) => counted.fetch_add(1, Ordering::Relaxed),
                        Some(Err(e)) => return Err(e.to_string()),
                        None => return Err("the stream ended".into()),
                    };
                }
                Ok(())
            }
        })
        .await?;
        let what = if streams == 1 { "1 stream".to_string() } else { format!("{streams} streams") };
        figures.push(Figure { what, ..f });
    }
    Ok(figures)
}

/// Runs `tasks` copies of `task` together, counts the items they report after `warmup` for
/// `duration`, then stops them.
async fn measure<F, Fut>(
    warmup: Duration,
    duration: Duration,
    tasks: usize,
    task: F,
) -> Result<Figure, String>
where
    F: Fn(Arc<AtomicU64>, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>> + 'static,
{
    let counted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let local = tokio::task::LocalSet::new();
    let handles: Vec<_> =
        (0..tasks).map(|_| local.spawn_local(task(counted.clone(), stop.clone()))).collect();
    let timing = async {
        tokio::time::sleep(warmup).await;
        let (c0, t0) = (counted.load(Ordering::Relaxed), Instant::now());
        tokio::time::sleep(duration).await;
        let (c1, secs) = (counted.load(Ordering::Relaxed), t0.elapsed().as_secs_f64());
        stop.store(true, Ordering::Relaxed);
        let mut failed = None;
        for h in handles {
            if let Ok(Err(e)) = h.await {
                failed.get_or_insert(e);
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(Figure {
                what: String::new(),
                items_per_s: (c1 - c0) as f64 / secs,
                items: c1 - c0,
                seconds: secs,
            }),
        }
    };
    local.run_until(timing).await
}

fn report(figures: &[Figure], args: &BenchArgs) -> Result<(), String> {
    if args.json {
        let json = serde_json::json!({
            "transport": args.transport, "payload": args.payload, "window": args.stream_window,
            "figures": figures,
        });
        outln!("{json}");
        return Ok(());
    }
    outln!("stream benchmark: {:?}, {} B items, window {}", args.transport, args.payload, args.stream_window);
    for f in figures {
        outln!("{:<32} {:>12.0} items/s", f.what, f.items_per_s);
    }
    if let [batch, one, many] = figures {
        outln!("1 stream / call_batch: {:.2}", one.items_per_s / batch.items_per_s.max(f64::MIN_POSITIVE));
        outln!("{} / 1 stream: {:.2}", many.what, many.items_per_s / one.items_per_s.max(f64::MIN_POSITIVE));
    }
    Ok(())
}

fn current_thread() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}
