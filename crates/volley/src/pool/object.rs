//! A pool of fixed-size objects: a per-thread cache in front of a shared free list.
//!
//! `take` pops from this thread's cache; when that is empty it refills half a cache from the
//! shared list under one lock, and only when both are empty does it allocate. `give` pushes
//! onto this thread's cache; a full cache moves half of itself to the shared list, and what
//! does not fit under the shared bound goes back to the system allocator. So a thread that
//! takes and gives in a loop touches no lock and no allocator, objects given back on another
//! thread (a reply completed by the reader task, its slot released by the caller) flow back
//! through the shared list, and the memory kept is bounded: `local_max` per thread plus
//! `shared_max`.
//!
//! Hand-written rather than taken from a crate: the crates we looked at either have no
//! per-thread cache (a lock or CAS per operation: `object-pool`, `lockfree-object-pool`'s
//! linear pool) or hand out slab indices rather than owned boxes (`sharded-slab`). The
//! per-thread part is the `thread_local` crate's `ThreadLocal`, which gives every pool
//! instance its own cache on each thread; a slot pool used on every call can keep its cache in
//! a `thread_local!` of its own instead (`SlotPool::with_cache`), a few instructions to reach
//! where `ThreadLocal`'s look-up is ~30. `volley-research pools` measures it against the system
//! allocator, mimalloc and jemalloc.

use std::cell::{RefCell, UnsafeCell};
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use thread_local::ThreadLocal;

/// A pool of boxed `T`s. Objects are handed out as they were given back: the user resets them.
pub struct ObjectPool<T: Send> {
    local: ThreadLocal<RefCell<Vec<Box<T>>>>,
    shared: Mutex<Vec<Box<T>>>,
    local_max: usize,
    shared_max: usize,
    created: AtomicU64,
}

/// Counters of a pool (for tests).
#[cfg(feature = "internals")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectStats {
    /// Objects allocated from the system since the pool was made.
    pub created: u64,
    /// Objects in the pool now (all thread caches and the shared list).
    pub available: usize,
}

impl<T: Send> ObjectPool<T> {
    /// A pool keeping at most `local_max` objects per thread and `shared_max` in the shared
    /// list.
    pub const fn new(local_max: usize, shared_max: usize) -> Self {
        ObjectPool {
            local: ThreadLocal::new(),
            shared: Mutex::new(Vec::new()),
            local_max: if local_max == 0 { 1 } else { local_max },
            shared_max,
            created: AtomicU64::new(0),
        }
    }

    fn cache(&self) -> &RefCell<Vec<Box<T>>> {
        self.local.get_or(|| RefCell::new(Vec::with_capacity(self.local_max)))
    }

    /// An object from the pool, or `make()` if the pool is empty.
    #[cfg(any(test, feature = "internals"))]
    #[inline]
    pub fn take(&self, make: impl FnOnce() -> T) -> Box<T> {
        match self.cache().try_borrow_mut() {
            Ok(mut local) => self.take_from(&mut local, make),
            Err(_) => self.fresh(make),
        }
    }

    /// Gives an object back (already reset by the caller).
    #[cfg(any(test, feature = "internals"))]
    #[inline]
    pub fn give(&self, b: Box<T>) {
        match self.cache().try_borrow_mut() {
            Ok(mut local) => self.give_to(&mut local, b),
            Err(_) => self.give_shared(vec![b]),
        }
    }

    /// This thread's cache, held for a run of takes and gives: saves the thread-local look-up
    /// of every single call (while it is held, `take` and `give` on this thread bypass the
    /// cache). For benchmarks of the pool itself.
    #[cfg(feature = "internals")]
    pub fn local(&self) -> LocalPool<'_, T> {
        LocalPool { pool: self, cache: self.cache().borrow_mut() }
    }

    #[inline]
    fn take_from(&self, local: &mut Vec<Box<T>>, make: impl FnOnce() -> T) -> Box<T> {
        if let Some(b) = local.pop() {
            return b;
        }
        self.refill(local);
        match local.pop() {
            Some(b) => b,
            None => self.fresh(make),
        }
    }

    #[cold]
    fn refill(&self, local: &mut Vec<Box<T>>) {
        let mut shared = self.shared.lock();
        let n = shared.len().min(self.local_max / 2 + 1);
        let from = shared.len() - n;
        local.extend(shared.drain(from..));
    }

    #[cold]
    fn fresh(&self, make: impl FnOnce() -> T) -> Box<T> {
        self.created.fetch_add(1, Ordering::Relaxed);
        Box::new(make())
    }

    #[inline]
    fn give_to(&self, local: &mut Vec<Box<T>>, b: Box<T>) {
        if local.len() < self.local_max {
            local.push(b);
            return;
        }
        self.spill(local);
        local.push(b);
    }

    /// A full cache moves half of itself to the shared list; what does not fit under its bound
    /// is freed.
    #[cold]
    fn spill(&self, local: &mut Vec<Box<T>>) {
        let keep = self.local_max / 2;
        let mut shared = self.shared.lock();
        let room = self.shared_max.saturating_sub(shared.len());
        let moving = local.len() - keep;
        let mut drained = local.drain(keep..);
        shared.extend(drained.by_ref().take(room.min(moving)));
        drop(shared);
        drop(drained); // the rest is freed
    }

    #[cold]
    fn give_shared(&self, objs: Vec<Box<T>>) {
        let mut shared = self.shared.lock();
        let room = self.shared_max.saturating_sub(shared.len());
        shared.extend(objs.into_iter().take(room));
    }

    /// Objects allocated from the system since the pool was made.
    #[cfg(feature = "internals")]
    pub fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Counts (needs `&mut self` to see every thread's cache).
    #[cfg(feature = "internals")]
    pub fn stats(&mut self) -> ObjectStats {
        let local: usize = self.local.iter_mut().map(|c| c.get_mut().len()).sum();
        ObjectStats {
            created: self.created.load(Ordering::Relaxed),
            available: local + self.shared.lock().len(),
        }
    }
}

/// A pool's cache on this thread, held (see [`ObjectPool::local`]).
#[cfg(feature = "internals")]
pub struct LocalPool<'p, T: Send> {
    pool: &'p ObjectPool<T>,
    cache: std::cell::RefMut<'p, Vec<Box<T>>>,
}

#[cfg(feature = "internals")]
impl<T: Send> LocalPool<'_, T> {
    /// An object from the pool, or `make()` if the pool is empty.
    #[inline]
    pub fn take(&mut self, make: impl FnOnce() -> T) -> Box<T> {
        self.pool.take_from(&mut self.cache, make)
    }

    /// Gives an object back (already reset by the caller).
    #[inline]
    pub fn give(&mut self, b: Box<T>) {
        self.pool.give_to(&mut self.cache, b)
    }
}

// ---------------------------------------------------------------------------------------------
// Completion slots: a pooled one-shot.

const EMPTY: u8 = 0;
const READY: u8 = 1;
const CLOSED: u8 = 2;
const TAKEN: u8 = 3;

/// The shared state of one call's completion: written once by the sender, read once by the
/// receiver; the last of the two to let go gives it back to the pool.
pub struct Slot<T> {
    refs: AtomicUsize,
    state: AtomicU8,
    value: UnsafeCell<MaybeUninit<T>>,
    waker: AtomicWaker,
}

// SAFETY: `value` is written only by the one sender before it publishes READY (release) and
// read only by the one receiver after it observes READY (acquire); the state machine makes
// the two accesses exclusive in time.
unsafe impl<T: Send> Send for Slot<T> {}
unsafe impl<T: Send> Sync for Slot<T> {}

impl<T> Slot<T> {
    fn new() -> Self {
        Slot {
            refs: AtomicUsize::new(0),
            state: AtomicU8::new(EMPTY),
            value: UnsafeCell::new(MaybeUninit::uninit()),
            waker: AtomicWaker::new(),
        }
    }
}

/// This thread's cache of completion slots of one value type.
pub type SlotCache<T> = RefCell<Vec<Box<Slot<T>>>>;

/// Where completion slots of one value type come from and go back to.
pub trait SlotPool<T: Send + 'static>: Sized + 'static {
    fn pool() -> &'static ObjectPool<Slot<T>>;

    /// Runs `f` on this thread's cache of slots, or returns `None` if the thread has none to
    /// lend (it is exiting, or the cache is in use further up the stack). By default the cache
    /// is the pool's own per-thread one; a pool used on every call keeps it in a `thread_local!`
    /// of its own instead (see [`local_slot_cache`]): the pool's look-up costs ~30 instructions,
    /// paid when a slot is taken and again when it is given back (scripts/callcost.py).
    #[inline]
    fn with_cache<R>(f: impl FnOnce(&mut Vec<Box<Slot<T>>>) -> R) -> Option<R> {
        Self::pool().cache().try_borrow_mut().ok().map(|mut cache| f(&mut cache))
    }
}

/// [`SlotPool::with_cache`] over a `thread_local!` cache.
#[inline(always)]
pub fn local_slot_cache<T: Send + 'static, R>(
    key: &'static std::thread::LocalKey<SlotCache<T>>,
    f: impl FnOnce(&mut Vec<Box<Slot<T>>>) -> R,
) -> Option<R> {
    key.try_with(|cache| cache.try_borrow_mut().ok().map(|mut cache| f(&mut cache))).ok().flatten()
}

/// Makes a one-shot from a pooled slot.
pub fn completion<T: Send + 'static, P: SlotPool<T>>() -> (Completer<T, P>, Completion<T, P>) {
    let pool = P::pool();
    let slot =
        P::with_cache(|cache| pool.take_from(cache, Slot::new)).unwrap_or_else(|| pool.fresh(Slot::new));
    slot.refs.store(2, Ordering::Relaxed);
    slot.state.store(EMPTY, Ordering::Relaxed);
    let ptr = Box::into_raw(slot);
    (
        Completer { slot: ptr, _p: std::marker::PhantomData },
        Completion { slot: ptr, _p: std::marker::PhantomData },
    )
}

/// The sending half: completes the call once. Dropped unsent, the receiver sees `Err(Dropped)`.
pub struct Completer<T: Send + 'static, P: SlotPool<T>> {
    slot: *mut Slot<T>,
    _p: std::marker::PhantomData<fn() -> P>,
}

/// The receiving half: a future of the value.
pub struct Completion<T: Send + 'static, P: SlotPool<T>> {
    slot: *mut Slot<T>,
    _p: std::marker::PhantomData<fn() -> P>,
}

// SAFETY: each half is the only user of its side of the slot; the slot itself is Sync.
unsafe impl<T: Send, P: SlotPool<T>> Send for Completer<T, P> {}
unsafe impl<T: Send, P: SlotPool<T>> Sync for Completer<T, P> {}
unsafe impl<T: Send, P: SlotPool<T>> Send for Completion<T, P> {}
unsafe impl<T: Send, P: SlotPool<T>> Sync for Completion<T, P> {}

/// The sender went away without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped;

impl<T: Send + 'static, P: SlotPool<T>> Completer<T, P> {
    /// Completes the call; the value is dropped if the receiver is gone.
    pub fn send(self, value: T) {
        let slot = unsafe { &*self.slot };
        // SAFETY: only this sender writes, and only before publishing READY.
        unsafe { (*slot.value.get()).write(value) };
        slot.state.store(READY, Ordering::Release);
        slot.waker.wake();
        // The drop below releases our reference without closing.
        let me = std::mem::ManuallyDrop::new(self);
        unsafe { release::<T, P>(me.slot) };
    }
}

impl<T: Send + 'static, P: SlotPool<T>> Drop for Completer<T, P> {
    fn drop(&mut self) {
        let slot = unsafe { &*self.slot };
        slot.state.store(CLOSED, Ordering::Release);
        slot.waker.wake();
        unsafe { release::<T, P>(self.slot) };
    }
}

impl<T: Send + 'static, P: SlotPool<T>> Future for Completion<T, P> {
    type Output = Result<T, Dropped>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let slot = unsafe { &*self.slot };
        let take = |slot: &Slot<T>| match slot.state.load(Ordering::Acquire) {
            READY => {
                slot.state.store(TAKEN, Ordering::Relaxed);
                // SAFETY: READY was published after the write; only we read, once (TAKEN).
                Some(Ok(unsafe { (*slot.value.get()).assume_init_read() }))
            }
            CLOSED => Some(Err(Dropped)),
            TAKEN => panic!("Completion polled after it completed"),
            _ => None,
        };
        if let Some(r) = take(slot) {
            return Poll::Ready(r);
        }
        slot.waker.register(cx.waker());
        match take(slot) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl<T: Send + 'static, P: SlotPool<T>> Drop for Completion<T, P> {
    fn drop(&mut self) {
        unsafe { release::<T, P>(self.slot) };
    }
}

/// Drops one reference; the last one drops an unread value and recycles the slot.
unsafe fn release<T: Send + 'static, P: SlotPool<T>>(ptr: *mut Slot<T>) {
    let slot = unsafe { &*ptr };
    if slot.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    if slot.state.load(Ordering::Acquire) == READY {
        // Sent but never received: drop the value here.
        unsafe { (*slot.value.get()).assume_init_drop() };
    }
    let b = unsafe { Box::from_raw(ptr) };
    b.state.store(EMPTY, Ordering::Relaxed);
    drop(b.waker.take());
    let pool = P::pool();
    let mut b = Some(b);
    if P::with_cache(|cache| pool.give_to(cache, b.take().expect("given once"))).is_none() {
        pool.give_shared(b.into_iter().collect());
    }
}

/// A pool with room for a busy connection's worth of slots per thread.
pub const fn slot_pool<T: Send + 'static>() -> ObjectPool<Slot<T>> {
    ObjectPool::new(1024, 16 * 1024)
}
