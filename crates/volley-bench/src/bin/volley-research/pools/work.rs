//! The allocation patterns of the pool cases, each written once against an allocator (any
//! `GlobalAlloc`) and once against the Volley pool that replaces it.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator};
use bumpalo::Bump;
use volley::pool::buffer::BufferPool;
use volley::pool::object::ObjectPool;

const NODE: Layout = Layout::new::<[u64; 8]>();

// --- fixed -----------------------------------------------------------------------------------

pub const FIXED_N: usize = 100_000;

pub fn fixed_alloc(a: &dyn GlobalAlloc, ptrs: &mut Vec<*mut u8>) {
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
pub fn fixed_pool(pool: &ObjectPool<[u64; 8]>, objs: &mut Vec<Box<[u64; 8]>>) {
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

pub const CHURN_N: u64 = 50_000;

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

pub fn churn_alloc(a: &dyn GlobalAlloc, seed: u64) {
    churn(&mut ViaGlobal(a), seed)
}

pub fn churn_pool(pool: &ObjectPool<[u64; 8]>, seed: u64) {
    churn(&mut pool.local(), seed)
}

// --- map -------------------------------------------------------------------------------------

pub const MAP_N: u64 = 100_000;

/// An allocator-api2 face for a `GlobalAlloc`.
#[derive(Clone, Copy)]
pub struct Via(pub &'static (dyn GlobalAlloc + Sync));

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

pub fn map_fill<A: Allocator>(alloc: A, seed: u64) -> u64 {
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

pub const VAR_SLOTS: usize = 5_000;
pub const VAR_CYCLES: usize = 20;

pub fn sizes(seed: u64) -> Vec<usize> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..VAR_SLOTS).map(|_| rng.usize(1..=10_000)).collect()
}

pub fn variable_alloc(a: &dyn GlobalAlloc, sizes: &[usize]) {
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

pub fn variable_pool(pool: &BufferPool, sizes: &[usize]) {
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

pub const ARENA_N: usize = 50_000;
const SMALL: Layout = Layout::new::<u32>();

pub fn arena_alloc(a: &dyn GlobalAlloc, ptrs: &mut Vec<*mut u8>) {
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
pub fn arena_bump(bump: &mut Bump) {
    for i in 0..ARENA_N {
        let p: &mut u32 = bump.alloc(i as u32);
        std::hint::black_box(p);
    }
    bump.reset();
}
