//! A 1,000,000-item streamed batch passes through with bounded memory: peak heap stays far
//! below the size of all the items. Its own test binary, because it counts every allocation
//! of the process with a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
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

#[test]
fn million_item_stream_has_bounded_peak_heap() {
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
        eprintln!("peak heap above baseline: {peak} bytes; all items: {all_items} bytes");
        assert!(
            peak < all_items / 10,
            "peak heap {peak} bytes is not far below the {all_items} bytes of all items"
        );
        server.shutdown().await;
    });
}
