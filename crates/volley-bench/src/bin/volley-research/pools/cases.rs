//! The table of pool cases: every case once per allocator and once with the Volley pool that
//! replaces the allocator, each a closure that runs the case once and returns its wall time.

use std::alloc::{GlobalAlloc, System};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use bumpalo::Bump;
use volley::pool::buffer::BufferPool;
use volley::pool::object::ObjectPool;

use super::work::*;

/// One case on one allocator.
pub struct Case {
    pub name: &'static str,
    pub threads: usize,
    pub allocator: &'static str,
    /// Allocations (and frees) in one run.
    pub ops: u64,
    /// Runs the case once; returns its wall time in seconds.
    pub run: Box<dyn FnMut() -> f64>,
}

impl Case {
    fn new(
        name: &'static str,
        threads: usize,
        allocator: &'static str,
        ops: u64,
        run: impl FnMut() -> f64 + 'static,
    ) -> Case {
        Case { name, threads, allocator, ops, run: Box::new(run) }
    }
}

static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocators compared, by name, each called directly through its `GlobalAlloc` impl.
fn allocators() -> [(&'static str, &'static (dyn GlobalAlloc + Sync)); 3] {
    [("system", &System), ("mimalloc", &MIMALLOC), ("jemalloc", &JEMALLOC)]
}

/// Every case whose name contains `filter` (all without one); the multi-threaded ones on
/// `threads` threads (at least 2).
pub fn cases(threads: usize, filter: Option<&str>) -> Vec<Case> {
    let threads = threads.max(2);
    let mut out = fixed();
    for n in [1, threads] {
        out.extend(hash_churn(n));
    }
    for n in [1, threads] {
        out.extend(map(n));
    }
    out.extend(variable(threads));
    out.extend(arena());
    if let Some(filter) = filter {
        out.retain(|c| c.name.contains(filter));
    }
    out
}

/// Times `f` once on this thread.
fn timed(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Runs `f` on `threads` threads at once (started together) and returns the wall time.
fn timed_threads(threads: usize, f: impl Fn(usize) + Sync) -> f64 {
    if threads == 1 {
        return timed(|| f(0));
    }
    let start = Barrier::new(threads + 1);
    let done = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for i in 0..threads {
            let (f, start, done) = (&f, &start, &done);
            s.spawn(move || {
                start.wait();
                f(i);
                done.wait();
            });
        }
        start.wait();
        let t = Instant::now();
        done.wait();
        t.elapsed().as_secs_f64()
    })
}

fn fixed() -> Vec<Case> {
    let mut out = Vec::new();
    for (name, a) in allocators() {
        let mut ptrs = Vec::with_capacity(FIXED_N);
        out.push(Case::new("fixed", 1, name, FIXED_N as u64, move || timed(|| fixed_alloc(a, &mut ptrs))));
    }
    let pool: &'static ObjectPool<[u64; 8]> = Box::leak(Box::new(ObjectPool::new(256, 2 * FIXED_N)));
    let mut objs = Vec::with_capacity(FIXED_N);
    out.push(Case::new("fixed", 1, "volley object pool", FIXED_N as u64, move || {
        timed(|| fixed_pool(pool, &mut objs))
    }));
    out
}

fn hash_churn(n: usize) -> Vec<Case> {
    let ops = 2 * CHURN_N * n as u64;
    let mut out = Vec::new();
    for (name, a) in allocators() {
        out.push(Case::new("hash-churn", n, name, ops, move || {
            timed_threads(n, |i| churn_alloc(a, i as u64))
        }));
    }
    let pool: &'static ObjectPool<[u64; 8]> =
        Box::leak(Box::new(ObjectPool::new(256, 2 * CHURN_N as usize * n)));
    out.push(Case::new("hash-churn", n, "volley object pool", ops, move || {
        timed_threads(n, |i| churn_pool(pool, i as u64))
    }));
    out
}

fn map(n: usize) -> Vec<Case> {
    let ops = MAP_N * n as u64;
    let mut out = Vec::new();
    for (name, a) in allocators() {
        out.push(Case::new("map", n, name, ops, move || {
            timed_threads(n, |i| {
                black_box(map_fill(Via(a), i as u64));
            })
        }));
    }
    out.push(Case::new("map", n, "volley arena (bumpalo)", ops, move || {
        timed_threads(n, |i| {
            let bump = Bump::new();
            black_box(map_fill(&bump, i as u64));
        })
    }));
    out
}

fn variable(threads: usize) -> Vec<Case> {
    let var_sizes: &'static [Vec<usize>] =
        Box::leak((0..threads).map(|i| sizes(i as u64 + 1)).collect::<Vec<_>>().into_boxed_slice());
    let ops = 2 * (VAR_SLOTS * VAR_CYCLES * threads) as u64;
    let mut out = Vec::new();
    for (name, a) in allocators() {
        out.push(Case::new("variable", threads, name, ops, move || {
            timed_threads(threads, |i| variable_alloc(a, &var_sizes[i]))
        }));
    }
    // Room for every thread's 5,000 buffers (their size classes are up to 16 KiB).
    let pool: &'static BufferPool =
        Box::leak(Box::new(BufferPool::new(threads * VAR_SLOTS * 16 * 1024, VAR_SLOTS)));
    out.push(Case::new("variable", threads, "volley buffer pool", ops, move || {
        timed_threads(threads, |i| variable_pool(pool, &var_sizes[i]))
    }));
    out
}

fn arena() -> Vec<Case> {
    let mut out = Vec::new();
    for (name, a) in allocators() {
        let mut ptrs = Vec::with_capacity(ARENA_N);
        out.push(Case::new("arena-4-bytes", 1, name, ARENA_N as u64, move || {
            timed(|| arena_alloc(a, &mut ptrs))
        }));
    }
    let mut bump = Bump::new();
    out.push(Case::new("arena-4-bytes", 1, "volley arena (bumpalo)", ARENA_N as u64, move || {
        timed(|| arena_bump(&mut bump))
    }));
    out
}
