//! A size-class pool of byte buffers (`BytesMut`), bounded in the bytes it keeps.
//!
//! Classes are powers of two from [`MIN_CLASS`] to [`MAX_CLASS`]. `get(n)` returns an empty
//! buffer with room for at least `n` bytes: from this thread's cache for the class, else from
//! the shared list, else freshly allocated. Requests above the largest class are allocated at
//! their size and never kept. `put` hands a buffer back; it is kept only while the pool's total
//! (every thread's cache and the shared list) stays under the bound — beyond it, and for
//! buffers that were reallocated away from their class, the memory goes straight back to the
//! system allocator.
//!
//! A buffer given back may still be shared: the frames a connection decoded are `Bytes` slices
//! of its receive buffer, and the caller holding a reply may not have dropped it yet when the
//! reader goes idle. Such a buffer is kept anyway, and `get` reclaims it only once it is unique
//! again (`BytesMut::try_reclaim`, no allocation); one that is still shared is skipped.
//!
//! Hand-written (a few dozen lines over `bytes`): no crate we found recycles `BytesMut` by
//! size class with a byte bound.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use parking_lot::Mutex;
use thread_local::ThreadLocal;

/// The smallest class (bytes).
pub const MIN_CLASS: usize = 64;
/// The largest class (bytes): larger requests bypass the pool.
pub const MAX_CLASS: usize = 1 << 20;
const CLASSES: usize = (MAX_CLASS.trailing_zeros() - MIN_CLASS.trailing_zeros() + 1) as usize;

/// The class index for a buffer of at least `n` bytes, if `n` is within the classes.
#[inline]
pub fn class_of(n: usize) -> Option<usize> {
    if n > MAX_CLASS {
        return None;
    }
    let size = n.max(MIN_CLASS).next_power_of_two();
    Some((size.trailing_zeros() - MIN_CLASS.trailing_zeros()) as usize)
}

/// The size of class `c`.
#[inline]
pub fn class_size(c: usize) -> usize {
    MIN_CLASS << c
}

/// A buffer handed out by a pool: remembers its class and where its memory starts, so that
/// giving it back can tell whether it is still that allocation (a `reserve` beyond its class
/// reallocates it).
#[derive(Debug, Default)]
pub struct PoolBuf {
    buf: BytesMut,
    /// (address of the allocation, class) while `buf` is a pooled allocation.
    origin: Option<(usize, u8)>,
}

impl PoolBuf {
    /// Wraps a buffer that did not come from a pool (it is never given back to one).
    pub fn unpooled(buf: BytesMut) -> Self {
        PoolBuf { buf, origin: None }
    }

    /// The buffer itself (for generic `BufMut` users, where `Deref` does not apply).
    #[inline]
    pub fn as_bytes_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Whether this still is the pooled allocation it was handed out as.
    fn pooled_class(&self) -> Option<usize> {
        let (start, class) = self.origin?;
        let at = self.buf.as_ptr() as usize;
        (at >= start && at <= start + class_size(class as usize)).then_some(class as usize)
    }
}

impl std::ops::Deref for PoolBuf {
    type Target = BytesMut;
    #[inline]
    fn deref(&self) -> &BytesMut {
        &self.buf
    }
}

impl std::ops::DerefMut for PoolBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
}

struct Class {
    /// Buffers of this class, oldest first (the oldest is the likeliest to be unique again).
    bufs: VecDeque<BytesMut>,
}

/// Counters of a buffer pool.
#[cfg(feature = "internals")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferStats {
    /// Bytes kept in the pool now (counted by class size).
    pub kept_bytes: usize,
    /// The bound on `kept_bytes`.
    pub bound: usize,
}

/// A size-class buffer pool. [`global`] is the one the transports use.
pub struct BufferPool {
    local: ThreadLocal<RefCell<[Class; CLASSES]>>,
    shared: Mutex<[Class; CLASSES]>,
    /// Bytes in the pool (caches and shared list), by class size.
    kept: AtomicUsize,
    bound: usize,
    /// Most buffers of one class a thread's cache holds before moving some to the shared list.
    local_per_class: usize,
}

fn classes() -> [Class; CLASSES] {
    std::array::from_fn(|_| Class { bufs: VecDeque::new() })
}

/// How many still-shared buffers `get` looks past before allocating.
const PROBE: usize = 2;

impl BufferPool {
    /// A pool keeping at most `bound` bytes.
    pub fn new(bound: usize, local_per_class: usize) -> Self {
        BufferPool {
            local: ThreadLocal::new(),
            shared: Mutex::new(classes()),
            kept: AtomicUsize::new(0),
            bound,
            local_per_class: local_per_class.max(1),
        }
    }

    fn cache(&self) -> &RefCell<[Class; CLASSES]> {
        self.local.get_or(|| RefCell::new(classes()))
    }

    /// An empty buffer with room for at least `n` bytes.
    #[inline]
    pub fn get(&self, n: usize) -> PoolBuf {
        let Some(c) = class_of(n) else {
            return PoolBuf::unpooled(BytesMut::with_capacity(n));
        };
        let size = class_size(c);
        if let Some(buf) = self.take_local(c, size).or_else(|| self.take_shared(c, size)) {
            self.kept.fetch_sub(size, Ordering::Relaxed);
            let start = buf.as_ptr() as usize;
            return PoolBuf { buf, origin: Some((start, c as u8)) };
        }
        let buf = BytesMut::with_capacity(size);
        let start = buf.as_ptr() as usize;
        PoolBuf { buf, origin: Some((start, c as u8)) }
    }

    fn take_local(&self, c: usize, size: usize) -> Option<BytesMut> {
        let mut local = self.cache().borrow_mut();
        reclaim_from(&mut local[c].bufs, size)
    }

    fn take_shared(&self, c: usize, size: usize) -> Option<BytesMut> {
        let mut shared = self.shared.lock();
        reclaim_from(&mut shared[c].bufs, size)
    }

    /// Gives a buffer back. Kept if it is still its pooled allocation and the pool is under its
    /// bound; otherwise freed (now, or when its last `Bytes` slice goes).
    #[inline]
    pub fn put(&self, mut b: PoolBuf) {
        let Some(c) = b.pooled_class() else { return };
        let size = class_size(c);
        if self.kept.fetch_add(size, Ordering::Relaxed) + size > self.bound {
            self.kept.fetch_sub(size, Ordering::Relaxed);
            return;
        }
        b.buf.clear();
        let mut local = self.cache().borrow_mut();
        let bufs = &mut local[c].bufs;
        bufs.push_back(b.buf);
        if bufs.len() > self.local_per_class {
            // Move the older half to the shared list, where other threads find it.
            let n = bufs.len() / 2;
            let mut shared = self.shared.lock();
            shared[c].bufs.extend(bufs.drain(..n));
        }
    }

    /// Bytes kept and the bound.
    #[cfg(feature = "internals")]
    pub fn stats(&self) -> BufferStats {
        BufferStats { kept_bytes: self.kept.load(Ordering::Relaxed), bound: self.bound }
    }

    /// Bytes actually held by buffers in the pool (walks every cache; for tests).
    #[cfg(feature = "internals")]
    pub fn held_bytes(&mut self) -> usize {
        let local: usize = self
            .local
            .iter_mut()
            .flat_map(|c| c.get_mut().iter())
            .flat_map(|class| class.bufs.iter())
            .map(|b| b.capacity())
            .sum();
        let shared: usize = self.shared.lock().iter().flat_map(|c| c.bufs.iter()).map(|b| b.capacity()).sum();
        local + shared
    }
}

/// Takes the first buffer of `bufs` that can hold `size` bytes without allocating (i.e. no
/// `Bytes` slice of it is alive any more); skipped ones move to the back.
#[inline]
fn reclaim_from(bufs: &mut VecDeque<BytesMut>, size: usize) -> Option<BytesMut> {
    for _ in 0..PROBE.min(bufs.len()) {
        let mut b = bufs.pop_front()?;
        if b.try_reclaim(size) {
            return Some(b);
        }
        bufs.push_back(b);
    }
    None
}

/// Bound of the process-wide pool the transports use: 4 MiB (64 buffers of 64 KiB), a few
/// for each busy connection; idle ones hold none.
pub const GLOBAL_BOUND: usize = 4 << 20;

static GLOBAL: LazyLock<BufferPool> = LazyLock::new(|| BufferPool::new(GLOBAL_BOUND, 8));

/// The process-wide buffer pool of the transports.
#[cfg(feature = "internals")]
pub fn global() -> &'static BufferPool {
    &GLOBAL
}

/// A buffer for `n` bytes from the global pool.
#[inline]
pub fn get(n: usize) -> PoolBuf {
    GLOBAL.get(n)
}

/// Gives a buffer back to the global pool.
#[inline]
pub fn put(b: PoolBuf) {
    GLOBAL.put(b)
}
