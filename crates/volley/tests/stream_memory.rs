//! What server streams to stalled readers hold: the heap of both sides (server and client are
//! in this process) while 100 streams whose producers never run dry have readers that take
//! nothing. Each stream's credit window bounds it, whatever the producer could make. Its own
//! test binary, because it counts every allocation of the process with a global allocator.
//! `--nocapture` prints the figures (docs/BENCHMARKS.md, "Server streams").

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use volley::bytes::Bytes;
use volley::{Client, Server, Status, StreamMethod, StreamOptions};

struct Counting;

#[path = "support/wait.rs"]
mod wait;
use wait::eventually;

static CURRENT: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            CURRENT.fetch_add(layout.size(), Ordering::Relaxed);
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

const ITEMS: StreamMethod<u64, Bytes> = StreamMethod::new("mem", "items");
const STREAMS: usize = 100;
const ITEM_BYTES: usize = 64;

/// Heap held (bytes, over the idle connection) with `STREAMS` stalled streams of `window`.
async fn stalled(window: u32) -> usize {
    let made = Arc::new(AtomicU64::new(0));
    let m = made.clone();
    let server = Server::builder()
        // Items of streams opened with 1 are counted (not the warm-up's).
        .handle_stream(&ITEMS, move |counted: u64| {
            let m = m.clone();
            async move {
                Ok(futures_util::stream::iter(0u64..).map(move |i| {
                    m.fetch_add(counted, Ordering::SeqCst);
                    Ok::<_, Status>(Bytes::from(vec![i as u8; ITEM_BYTES]))
                }))
            }
        })
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    // Warm up (buffers, tables), then measure from the idle connection.
    let warm = client.open_stream(&ITEMS, 0).await.unwrap().take(10_000).count().await;
    assert_eq!(warm, 10_000);
    // The real heap settles (the warm-up stream's buffers go back) before the base is read.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let base = CURRENT.load(Ordering::SeqCst);

    let opts = StreamOptions::default().window(window);
    let mut open = Vec::new();
    for _ in 0..STREAMS {
        open.push(client.open_stream_with(&ITEMS, 1, opts).await.unwrap());
    }
    // A stalled reader granted its window and nothing more: each producer makes exactly that.
    let want = STREAMS as u64 * u64::from(window);
    assert!(
        eventually(Duration::from_secs(30), || made.load(Ordering::SeqCst) >= want).await,
        "the producers did not fill the windows"
    );
    // The items reach the client's side; then the heap stays where it is.
    let mut last = 0;
    assert!(
        eventually(Duration::from_secs(30), || {
            let now = CURRENT.load(Ordering::SeqCst);
            std::mem::replace(&mut last, now) == now
        })
        .await
    );
    // A window of real time in which a producer that ran past its credit would show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = CURRENT.load(Ordering::SeqCst).saturating_sub(base);
    assert_eq!(made.load(Ordering::SeqCst), want, "a producer ran past its credit");
    drop(open);
    server.shutdown().await;
    held
}

#[test]
fn stalled_streams_hold_what_their_windows_allow() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut per_stream = Vec::new();
    for window in [16u32, 256, 1024] {
        let held = rt.block_on(stalled(window));
        let each = held / STREAMS;
        let payload = window as usize * ITEM_BYTES;
        println!(
            "window {window}: {held} bytes held by {STREAMS} stalled streams, {each} per stream \
             ({payload} of payload, {:.2}x)",
            each as f64 / payload as f64
        );
        per_stream.push((window, each));
    }
    // Bounded by the window: a stream's bytes grow with its window, at a few times its payload
    // at most, never with what the producer could make (it never runs dry).
    for (window, each) in per_stream {
        let bound = 6 * window as usize * ITEM_BYTES + 32 * 1024;
        assert!(each <= bound, "window {window}: {each} bytes per stalled stream, over {bound}");
    }
}
