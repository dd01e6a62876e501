//! `volley bench pools`: seeds/002's memory-pool experiments, side by side in one process —
//! Volley's pools against the system allocator, mimalloc and jemalloc, each allocator called
//! directly through its `GlobalAlloc` impl (whatever the binary's global allocator is).
//!
//! Cases (the seed's tables 1-5):
//!
//! - `fixed`: 100,000 fixed-size (64-byte) objects allocated, then all freed (table 1);
//!   Volley's object pool against each allocator.
//! - `hash-churn`: a hash table whose values are heap nodes (64 bytes): 50,000 inserts, then
//!   50,000 removes, with one thread and with several, each thread its own table (table 2).
//! - `map`: a map whose memory comes from the allocator under test (table 3). Rust's std maps
//!   take no allocator on stable (`allocator_api` is unstable); hashbrown does, through
//!   allocator-api2, so the map is a `hashbrown::HashMap` with the allocator as a type
//!   parameter and the arena (`&bumpalo::Bump`) as the pool. hashbrown keeps entries in one
//!   table, not one node per entry, so this case allocates only when the table grows — which
//!   is why the allocator matters so little here; the node-per-entry shape is `hash-churn`.
//! - `variable`: sizes 1-10,000 bytes, 4 threads, 5,000 buffers each, allocated then freed, 20
//!   times (table 4); Volley's size-class buffer pool against each allocator.
//! - `arena`: 4-byte allocations, 50,000 in a row, then released (table 5); Volley's per-batch
//!   arena (bumpalo) against each allocator (which frees them one by one).
//!
//! Every case runs once per round for every allocator, rounds interleaved; the median time is
//! reported, and the speed-up against the system allocator of the same case.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::NonNull;
use std::sync::Barrier;
use std::time::Instant;

use crate::output::outln;
use allocator_api2::alloc::{AllocError, Allocator};
use bumpalo::Bump;
use clap::Args;
use serde::Serialize;
use volley::pool::buffer::BufferPool;
use volley::pool::object::ObjectPool;

#[derive(Args, Debug, Clone)]
pub struct PoolsArgs {
    /// Rounds (interleaved); the median of each case is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Threads of the multi-threaded cases.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Only the cases whose name contains this.
    #[arg(long)]
    case: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Debug, Clone)]
struct Row {
    case: String,
    allocator: String,
    threads: usize,
    /// Median seconds of one run of the case.
    seconds: f64,
    /// Allocations (and frees) in one run.
    ops: u64,
    ns_per_op: f64,
    /// The system allocator's time over this one's, same case (>1: faster than system).
    speedup_vs_system: f64,
    rounds: usize,
}

static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocators compared, by name.
fn allocators() -> [(&'static str, &'static (dyn GlobalAlloc + Sync)); 3] {
    [("system", &System), ("mimalloc", &MIMALLOC), ("jemalloc", &JEMALLOC)]
}

const NODE: Layout = Layout::new::<[u64; 8]>();

// --- fixed -----------------------------------------------------------------------------------

const FIXED_N: usize = 100_000;

fn fixed_alloc(a: &dyn GlobalAlloc, ptrs: &mut Vec<*mut u8>) {
    for _ in 0..FIXED_N {
        let p = unsafe { a.alloc(NODE) };
        assert!(!p.is_null());
        unsafe { p.cast::<u64>().write(1) };
        ptrs.push(p);
    }
    for p in ptrs.drain(..) {
        unsafe { a.dealloc(p, NODE) };
    }
}

// The boxes are the point: they are the pool's objects, held while "allocated".
#[allow(clippy::vec_box)]
fn fixed_pool(pool: &ObjectPool<[u64; 8]>, objs: &mut Vec<Box<[u64; 8]>>) {
    // This thread's cache, held for the whole loop (the hot path's own use takes and gives one
    // at a time: `ObjectPool::take`/`give`, one thread-local look-up each).
    let mut local = pool.local();
    for _ in 0..FIXED_N {
        let mut b = local.take(|| [0; 8]);
        b[0] = 1;
        objs.push(b);
    }
    for b in objs.drain(..) {
        local.give(b);
    }
}

// --- hash churn ------------------------------------------------------------------------------

const CHURN_N: u64 = 50_000;

/// Where the nodes of a churned table come from.
trait Nodes {
    fn alloc(&mut self) -> NonNull<[u64; 8]>;
    fn free(&mut self, n: NonNull<[u64; 8]>);
}

struct ViaGlobal<'a>(&'a dyn GlobalAlloc);

impl Nodes for ViaGlobal<'_> {
    fn alloc(&mut self) -> NonNull<[u64; 8]> {
        NonNull::new(unsafe { self.0.alloc(NODE) }.cast()).expect("allocation")
    }
    fn free(&mut self, n: NonNull<[u64; 8]>) {
        unsafe { self.0.dealloc(n.as_ptr().cast(), NODE) }
    }
}

impl Nodes for volley::pool::object::LocalPool<'_, [u64; 8]> {
    fn alloc(&mut self) -> NonNull<[u64; 8]> {
        NonNull::from(Box::leak(self.take(|| [0; 8])))
    }
    fn free(&mut self, n: NonNull<[u64; 8]>) {
        self.give(unsafe { Box::from_raw(n.as_ptr()) })
    }
}

/// A table of heap nodes: insert `CHURN_N`, then remove them all.
fn churn(nodes: &mut impl Nodes, seed: u64) {
    let mut map: hashbrown::HashMap<u64, NonNull<[u64; 8]>, rustc_hash_like::Build> =
        hashbrown::HashMap::with_capacity_and_hasher(CHURN_N as usize, Default::default());
    for i in 0..CHURN_N {
        let mut n = nodes.alloc();
        unsafe { n.as_mut()[0] = i };
        map.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed, n);
    }
    for i in 0..CHURN_N {
        let n = map.remove(&(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed)).expect("inserted");
        nodes.free(n);
    }
}

/// A tiny multiplicative hasher so the table costs the same for every allocator.
mod rustc_hash_like {
    #[derive(Default, Clone, Copy)]
    pub struct Build;
    pub struct H(u64);
    impl std::hash::BuildHasher for Build {
        type Hasher = H;
        fn build_hasher(&self) -> H {
            H(0)
        }
    }
    impl std::hash::Hasher for H {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = (self.0.rotate_left(5) ^ *b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
            }
        }
        fn write_u64(&mut self, i: u64) {
            self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
}

fn churn_alloc(a: &dyn GlobalAlloc, seed: u64) {
    churn(&mut ViaGlobal(a), seed)
}

fn churn_pool(pool: &ObjectPool<[u64; 8]>, seed: u64) {
    churn(&mut pool.local(), seed)
}

// --- map -------------------------------------------------------------------------------------

const MAP_N: u64 = 100_000;

/// An allocator-api2 face for a `GlobalAlloc`.
#[derive(Clone, Copy)]
struct Via(&'static (dyn GlobalAlloc + Sync));

unsafe impl Allocator for Via {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let p = if layout.size() == 0 { layout.align() as *mut u8 } else { unsafe { self.0.alloc(layout) } };
        NonNull::new(p).map(|p| NonNull::slice_from_raw_parts(p, layout.size())).ok_or(AllocError)
    }
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            unsafe { self.0.dealloc(ptr.as_ptr(), layout) }
        }
    }
}

fn map_fill<A: Allocator>(alloc: A, seed: u64) -> u64 {
    let mut map: hashbrown::HashMap<u64, u64, rustc_hash_like::Build, A> =
        hashbrown::HashMap::with_hasher_in(Default::default(), alloc);
    for i in 0..MAP_N {
        map.insert(i ^ seed, i);
    }
    let sum = map.values().sum();
    map.clear();
    sum
}

// --- variable --------------------------------------------------------------------------------

const VAR_SLOTS: usize = 5_000;
const VAR_CYCLES: usize = 20;

fn sizes(seed: u64) -> Vec<usize> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..VAR_SLOTS).map(|_| rng.usize(1..=10_000)).collect()
}

fn variable_alloc(a: &dyn GlobalAlloc, sizes: &[usize]) {
    let mut ptrs = Vec::with_capacity(sizes.len());
    for _ in 0..VAR_CYCLES {
        for &n in sizes {
            let p = unsafe { a.alloc(Layout::from_size_align(n, 1).unwrap()) };
            assert!(!p.is_null());
            unsafe { p.write(1) };
            ptrs.push((p, n));
        }
        for (p, n) in ptrs.drain(..) {
            unsafe { a.dealloc(p, Layout::from_size_align(n, 1).unwrap()) };
        }
    }
}

fn variable_pool(pool: &BufferPool, sizes: &[usize]) {
    let mut bufs = Vec::with_capacity(sizes.len());
    for _ in 0..VAR_CYCLES {
        for &n in sizes {
            let mut b = pool.get(n);
            b.spare_capacity_mut()[0].write(1);
            bufs.push(b);
        }
        for b in bufs.drain(..) {
            pool.put(b);
        }
    }
}

// --- arena -----------------------------------------------------------------------------------

const ARENA_N: usize = 50_000;
const SMALL: Layout = Layout::new::<u32>();

fn arena_alloc(a: &dyn GlobalAlloc, ptrs: &mut Vec<*mut u8>) {
    for i in 0..ARENA_N {
        let p = unsafe { a.alloc(SMALL) };
        assert!(!p.is_null());
        unsafe { p.cast::<u32>().write(i as u32) };
        ptrs.push(p);
    }
    for p in ptrs.drain(..) {
        unsafe { a.dealloc(p, SMALL) };
    }
}

/// The arena keeps no list of what it handed out: the reset releases it all.
fn arena_bump(bump: &mut Bump) {
    for i in 0..ARENA_N {
        let p: &mut u32 = bump.alloc(i as u32);
        std::hint::black_box(p);
    }
    bump.reset();
}

// --- driver ----------------------------------------------------------------------------------

/// Runs `f` on `threads` threads at once (started together) and returns the wall time.
fn timed_threads(threads: usize, f: impl Fn(usize) + Sync) -> f64 {
    if threads == 1 {
        let t = Instant::now();
        f(0);
        return t.elapsed().as_secs_f64();
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

type Case = (String, usize, String, u64, Box<dyn FnMut() -> f64>);

fn cases(args: &PoolsArgs) -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    let threads = args.threads.max(2);
    // fixed
    for (name, a) in allocators() {
        let mut ptrs = Vec::with_capacity(FIXED_N);
        out.push((
            "fixed".into(),
            1,
            name.into(),
            FIXED_N as u64,
            Box::new(move || {
                let t = Instant::now();
                fixed_alloc(a, &mut ptrs);
                t.elapsed().as_secs_f64()
            }),
        ));
    }
    let pool: &'static ObjectPool<[u64; 8]> = Box::leak(Box::new(ObjectPool::new(256, 2 * FIXED_N)));
    let mut objs = Vec::with_capacity(FIXED_N);
    out.push((
        "fixed".into(),
        1,
        "volley object pool".into(),
        FIXED_N as u64,
        Box::new(move || {
            let t = Instant::now();
            fixed_pool(pool, &mut objs);
            t.elapsed().as_secs_f64()
        }),
    ));
    // hash churn, 1 and N threads
    for n in [1, threads] {
        for (name, a) in allocators() {
            out.push((
                "hash-churn".into(),
                n,
                name.into(),
                2 * CHURN_N * n as u64,
                Box::new(move || timed_threads(n, |i| churn_alloc(a, i as u64))),
            ));
        }
        let pool: &'static ObjectPool<[u64; 8]> =
            Box::leak(Box::new(ObjectPool::new(256, 2 * CHURN_N as usize * n)));
        out.push((
            "hash-churn".into(),
            n,
            "volley object pool".into(),
            2 * CHURN_N * n as u64,
            Box::new(move || timed_threads(n, |i| churn_pool(pool, i as u64))),
        ));
    }
    // map, 1 and N threads
    for n in [1, threads] {
        for (name, a) in allocators() {
            out.push((
                "map".into(),
                n,
                name.into(),
                MAP_N * n as u64,
                Box::new(move || {
                    timed_threads(n, |i| {
                        std::hint::black_box(map_fill(Via(a), i as u64));
                    })
                }),
            ));
        }
        out.push((
            "map".into(),
            n,
            "volley arena (bumpalo)".into(),
            MAP_N * n as u64,
            Box::new(move || {
                timed_threads(n, |i| {
                    let bump = Bump::new();
                    std::hint::black_box(map_fill(&bump, i as u64));
                })
            }),
        ));
    }
    // variable sizes, N threads
    let var_sizes: &'static [Vec<usize>] =
        Box::leak((0..threads).map(|i| sizes(i as u64 + 1)).collect::<Vec<_>>().into_boxed_slice());
    let var_ops = 2 * (VAR_SLOTS * VAR_CYCLES * threads) as u64;
    for (name, a) in allocators() {
        out.push((
            "variable".into(),
            threads,
            name.into(),
            var_ops,
            Box::new(move || timed_threads(threads, |i| variable_alloc(a, &var_sizes[i]))),
        ));
    }
    // Room for every thread's 5,000 buffers (their size classes are up to 16 KiB).
    let bpool: &'static BufferPool =
        Box::leak(Box::new(BufferPool::new(threads * VAR_SLOTS * 16 * 1024, VAR_SLOTS)));
    out.push((
        "variable".into(),
        threads,
        "volley buffer pool".into(),
        var_ops,
        Box::new(move || timed_threads(threads, |i| variable_pool(bpool, &var_sizes[i]))),
    ));
    // arena
    for (name, a) in allocators() {
        let mut ptrs = Vec::with_capacity(ARENA_N);
        out.push((
            "arena-4-bytes".into(),
            1,
            name.into(),
            ARENA_N as u64,
            Box::new(move || {
                let t = Instant::now();
                arena_alloc(a, &mut ptrs);
                t.elapsed().as_secs_f64()
            }),
        ));
    }
    let mut bump = Bump::new();
    out.push((
        "arena-4-bytes".into(),
        1,
        "volley arena (bumpalo)".into(),
        ARENA_N as u64,
        Box::new(move || {
            let t = Instant::now();
            arena_bump(&mut bump);
            t.elapsed().as_secs_f64()
        }),
    ));
    if let Some(filter) = &args.case {
        out.retain(|c| c.0.contains(filter.as_str()));
    }
    out
}

pub fn run(args: PoolsArgs) -> Result<(), String> {
    let mut cases = cases(&args);
    if cases.is_empty() {
        return Err("no case matches --case".into());
    }
    // One untimed pass warms every pool and allocator up.
    for c in cases.iter_mut() {
        (c.4)();
    }
    let rounds = args.rounds.max(1);
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for r in 0..rounds {
        for (i, c) in cases.iter_mut().enumerate() {
            times[i].push((c.4)());
        }
        if !args.json {
            eprintln!("round {}/{rounds} done", r + 1);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut rows: Vec<Row> = cases
        .iter()
        .zip(times.iter_mut())
        .map(|(c, t)| {
            let seconds = median(t);
            Row {
                case: c.0.clone(),
                allocator: c.2.clone(),
                threads: c.1,
                seconds,
                ops: c.3,
                ns_per_op: seconds * 1e9 / c.3 as f64,
                speedup_vs_system: 0.0,
                rounds,
            }
        })
        .collect();
    let system: Vec<(String, usize, f64)> = rows
        .iter()
        .filter(|r| r.allocator == "system")
        .map(|r| (r.case.clone(), r.threads, r.seconds))
        .collect();
    for r in &mut rows {
        if let Some((_, _, s)) = system.iter().find(|(c, t, _)| *c == r.case && *t == r.threads) {
            r.speedup_vs_system = s / r.seconds;
        }
    }
    if args.json {
        for r in &rows {
            outln!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
        }
    } else {
        outln!("| case | threads | allocator | median ms | ns/op | vs system |");
        outln!("|---|---:|---|---:|---:|---:|");
        for r in &rows {
            outln!(
                "| {} | {} | {} | {:.3} | {:.1} | {:.2}x |",
                r.case,
                r.threads,
                r.allocator,
                r.seconds * 1e3,
                r.ns_per_op,
                r.speedup_vs_system
            );
        }
        outln!(
            "\nmedians of {rounds} interleaved rounds; every allocator called through its GlobalAlloc impl"
        );
    }
    Ok(())
}
