//! Heap allocations per echo call in steady state, counted by a global allocator over every
//! thread of the process (client and server both live here). Its own test binary, because the
//! counting allocator is process-wide.
//!
//! The bound: 0 allocations per call for plain-data payloads over tcp and inproc, at
//! most 2 otherwise. Each test warms up (connection buffers, pools, tables reach their steady
//! size), then counts the allocations of `CALLS` sequential calls — one caller, so nothing is
//! amortized over a bundle: every turn of the server and every read and write is paid by one
//! call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use volley::{Client, Method, Server};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A plain-data payload: 64 bytes, its memory is its encoding.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Pod64 {
    words: [u64; 8],
}
volley::wire!(pod: Pod64);

/// A fast-tier payload (bitcode's derive): a small struct with a string.
#[derive(Clone, Debug, PartialEq, volley::bitcode::Encode, volley::bitcode::Decode)]
struct Fast {
    id: u64,
    score: f32,
    name: String,
}
volley::wire!(bitcode: Fast);

const ECHO_POD: Method<Pod64, Pod64> = Method::new("echo", "pod");
const ECHO_FAST: Method<Fast, Fast> = Method::new("echo", "fast");

const WARMUP: usize = 3_000;
const CALLS: u64 = 20_000;

/// The tests of this binary read the same process-wide counter: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allocations per call of `call` after a warm-up, on one current-thread runtime that runs the
/// server too.
fn per_call<F, Fut>(addr: &str, call: F) -> f64
where
    F: Fn(Client, u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let server = Server::builder()
            .handle_fn(&ECHO_POD, |p: Pod64| Ok(p))
            .handle_fn(&ECHO_FAST, |f: Fast| Ok(f))
            .build();
        let bound = server.listen(addr).await.unwrap();
        let client = Client::connect(&bound.to_string()).await.unwrap();
        for i in 0..WARMUP as u64 {
            call(client.clone(), i).await;
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        for i in 0..CALLS {
            call(client.clone(), i).await;
        }
        let allocs = ALLOCS.load(Ordering::Relaxed) - before;
        drop(client);
        server.shutdown().await;
        let per = allocs as f64 / CALLS as f64;
        eprintln!("{addr}: {allocs} allocations in {CALLS} calls = {per:.3} per call");
        per
    })
}

async fn pod_call(c: Client, i: u64) {
    let req = Pod64 { words: [i; 8] };
    assert_eq!(c.call(&ECHO_POD, req).await.unwrap(), req);
}

async fn fast_call(c: Client, i: u64) {
    let req = Fast { id: i, score: 0.5, name: "volley".to_string() };
    let reply = c.call(&ECHO_FAST, req).await.unwrap();
    assert_eq!(reply.id, i);
}

/// The fast-tier request itself owns a `String`: one allocation per call is the caller's own
/// (building the request), not Volley's.
const CALLERS_OWN_FAST: f64 = 1.0;

#[test]
fn pod_echo_over_tcp_allocates_nothing_per_call() {
    let per = per_call("tcp://127.0.0.1:0", pod_call);
    assert!(per < 0.01, "{per:.3} allocations per plain-data echo call over tcp (want 0)");
}

#[test]
fn pod_echo_inproc_allocates_nothing_per_call() {
    let per = per_call("inproc://alloc-count-pod", pod_call);
    assert!(per < 0.01, "{per:.3} allocations per plain-data echo call inproc (want 0)");
}

#[test]
fn fast_tier_echo_over_tcp_allocates_at_most_two_per_call() {
    let per = per_call("tcp://127.0.0.1:0", fast_call) - CALLERS_OWN_FAST;
    assert!(per <= 2.01, "{per:.3} allocations per fast-tier echo call over tcp (want <= 2)");
}

#[test]
fn fast_tier_echo_inproc_allocates_at_most_two_per_call() {
    let per = per_call("inproc://alloc-count-fast", fast_call) - CALLERS_OWN_FAST;
    assert!(per <= 2.01, "{per:.3} allocations per fast-tier echo call inproc (want <= 2)");
}
