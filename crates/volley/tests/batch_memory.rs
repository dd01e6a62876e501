//! A 1,000,000-item streamed batch passes through with bounded memory: peak heap stays far
//! below the size of all the items. Its own test binary, because it counts every allocation
//! of the process with a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use volley::bytes::Bytes;
use volley::{BatchOptions, Client, Method, Server};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");
const ITEMS: usize = 1_000_000;
const ITEM_BYTES: usize = 64;

/// The tests of this binary measure the same process-wide counters: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn million_item_stream_has_bounded_peak_heap() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let server = Server::builder()
            .handle_batch(&ECHO, |b: Vec<Bytes>| async move { b.into_iter().map(Ok).collect() })
            .build();
        let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        // Warm up, then measure the peak from here on.
        let _ = client.call_batch(&ECHO, (0..1000).map(|_| Bytes::from(vec![0u8; ITEM_BYTES]))).await;
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);

        let reqs = (0..ITEMS).map(|i| Bytes::from(vec![(i % 251) as u8; ITEM_BYTES]));
        let mut stream = client.call_batch_stream(&ECHO, reqs, BatchOptions::default());
        let (mut n, mut bad) = (0usize, 0usize);
        while let Some(r) = stream.next().await {
            match r {
                Ok(b) if b.len() == ITEM_BYTES && b[0] == (n % 251) as u8 => {}
                _ => bad += 1,
            }
            n += 1;
        }
        drop(stream);
        assert_eq!((n, bad), (ITEMS, 0));
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let all_items = ITEMS * ITEM_BYTES;
        // What the window holds: its requests, their replies, and the frames carrying both.
        let opts = BatchOptions::default();
        let window = opts.window * opts.chunk_size * ITEM_BYTES;
        eprintln!(
            "peak heap above baseline: {peak} bytes; window {window} bytes; all items: {all_items} bytes"
        );
        // Plus what the buffer pool may keep for reuse (its shared bound).
        let bound = window * 8 + volley::pool::buffer::GLOBAL_BOUND;
        assert!(bound <= all_items / 2, "the test's batch is not much larger than the window");
        assert!(
            peak < bound,
            "peak heap {peak} bytes is not bounded by the window of {window} bytes and the buffer \
             pool (all items: {all_items})"
        );
        server.shutdown().await;
    });
}

const SLOW: Method<Bytes, Bytes> = Method::new("slow", "echo");

/// A flood far beyond what a slow handler can serve: the server answers `Overloaded` at once
/// for what it cannot hold, every call ends, and memory stays under a fixed bound however long
/// the flood lasts.
#[test]
fn overload_keeps_memory_bounded() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let server = Server::builder()
            .max_queued(2_000)
            .handle(&SLOW, |b: Bytes| async move {
                // Slow work that keeps the real socket's queue full (memory is the measure).
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                Ok(b)
            })
            .build();
        let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
        let config = volley::ClientConfig::default().max_in_flight(10_000);
        let client = Client::connect_with(&bound.to_string(), config).await.unwrap();
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);

        // The flood lasts until it has offered four times the heap bound in payloads (not for a
        // fixed time, so a slow machine floods as hard as a fast one).
        const FLOOD: u64 = 4 * (24 << 20) / 256;
        let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for t in 0..40 {
            let (client, total) = (client.clone(), total.clone());
            tasks.push(tokio::spawn(async move {
                let (mut ok, mut overloaded, mut offered) = (0u64, 0u64, 0u64);
                while total.fetch_add(500, Ordering::Relaxed) < FLOOD {
                    let reqs = (0..500).map(|_| Bytes::from(vec![t as u8; 256]));
                    for r in client.call_batch_with(&SLOW, reqs, BatchOptions::default().chunk_size(50)).await
                    {
                        offered += 1;
                        match r {
                            Ok(b) => {
                                assert_eq!(b.len(), 256);
                                ok += 1;
                            }
                            Err(e) if e.code() == Some(volley::Code::Overloaded) => overloaded += 1,
                            Err(e) => panic!("unexpected error: {e}"),
                        }
                    }
                }
                (ok, overloaded, offered)
            }));
        }
        let (mut ok, mut overloaded, mut offered) = (0, 0, 0);
        for t in tasks {
            // Generous: a debug build under CPU steal floods slowly; a hang never ends.
            let (o, v, f) = tokio::time::timeout(std::time::Duration::from_secs(60), t)
                .await
                .expect("a caller hung under overload")
                .unwrap();
            ok += o;
            overloaded += v;
            offered += f;
        }
        let peak = PEAK.load(Ordering::Relaxed) - base;
        eprintln!("offered {offered} requests: {ok} served, {overloaded} overloaded; peak heap {peak} bytes");
        assert_eq!(ok + overloaded, offered, "every request ended");
        assert!(ok >= 2_000, "admitted requests complete: {ok}");
        // Much of the flood must have been refused: about 90% on a quiet machine, but how much
        // gets served meanwhile grows with how long the flood takes (a slow machine floods
        // slowly), so the bound is loose. The memory bound below is the point of the test.
        assert!(overloaded >= offered / 10, "the flood was not refused: {overloaded} of {offered}");
        assert!(
            offered as usize * 256 > 4 * (24 << 20),
            "the flood offered far more than the bound: {offered}"
        );
        assert!(peak < 24 << 20, "peak heap {peak} bytes under overload");
        server.shutdown().await;
    });
}
