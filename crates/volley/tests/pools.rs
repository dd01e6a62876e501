//! The pools under concurrent use: nothing handed out twice, everything given back, bounds
//! kept.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, LazyLock, Mutex};

use volley::bytes::Bytes;
use volley::pool::buffer::{BufferPool, MAX_CLASS, class_size};
use volley::pool::object::{ObjectPool, Slot, SlotCache, SlotPool, completion, local_slot_cache, slot_pool};

/// An object that knows whether someone holds it.
#[derive(Default)]
struct Obj {
    held: AtomicBool,
    uses: AtomicU64,
}

#[test]
fn object_pool_never_hands_an_object_out_twice_and_gets_all_back() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 20_000;
    const HOLD: usize = 8;
    let mut pool: ObjectPool<Obj> = ObjectPool::new(16, 1 << 20);
    let seen = Mutex::new(HashSet::new());
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (pool, seen, barrier) = (&pool, &seen, &barrier);
            s.spawn(move || {
                barrier.wait();
                let mut held = Vec::with_capacity(HOLD);
                let mut mine = HashSet::new();
                for r in 0..ROUNDS {
                    // Hold a varying number at once, so objects move between this thread's
                    // cache and the shared list, and to and from other threads.
                    for _ in 0..(r + t) % HOLD + 1 {
                        let o = pool.take(Obj::default);
                        assert!(!o.held.swap(true, Ordering::AcqRel), "an object was handed out twice");
                        o.uses.fetch_add(1, Ordering::Relaxed);
                        mine.insert(&*o as *const Obj as usize);
                        held.push(o);
                    }
                    for o in held.drain(..) {
                        assert!(o.held.swap(false, Ordering::AcqRel), "a held object was not marked held");
                        pool.give(o);
                    }
                }
                seen.lock().unwrap().extend(mine);
            });
        }
    });
    let stats = pool.stats();
    let distinct = seen.lock().unwrap().len() as u64;
    assert_eq!(stats.created, distinct, "every object made was seen, and no address twice");
    assert_eq!(stats.available as u64, stats.created, "every object came back to the pool");
    // Reuse: far fewer objects than takes.
    assert!(stats.created <= (THREADS * 64) as u64, "{} objects for {THREADS} threads", stats.created);
}

#[test]
fn object_pool_frees_what_exceeds_its_bounds() {
    let mut pool: ObjectPool<Obj> = ObjectPool::new(4, 8);
    let objs: Vec<_> = (0..100).map(|_| pool.take(Obj::default)).collect();
    for o in objs {
        pool.give(o);
    }
    let stats = pool.stats();
    assert_eq!(stats.created, 100);
    assert!(stats.available <= 4 + 8, "kept {} objects with bounds 4 + 8", stats.available);
}

struct TestSlots;
static TEST_SLOTS: LazyLock<ObjectPool<Slot<u64>>> = LazyLock::new(slot_pool);
impl SlotPool<u64> for TestSlots {
    fn pool() -> &'static ObjectPool<Slot<u64>> {
        &TEST_SLOTS
    }
}

#[test]
fn completions_deliver_each_value_once_across_threads() {
    const N: u64 = 50_000;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(3).build().unwrap();
    let sum = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..N {
            let (tx, rx) = completion::<u64, TestSlots>();
            // Sender and receiver on different tasks (and threads).
            tokio::spawn(async move {
                if i % 7 == 0 {
                    drop(tx); // never sent: the receiver sees it
                } else {
                    tx.send(i);
                }
            });
            tasks.push(tokio::spawn(async move { rx.await.ok() }));
        }
        let mut sum = 0u64;
        let mut dropped = 0u64;
        for t in tasks {
            match t.await.unwrap() {
                Some(v) => sum += v,
                None => dropped += 1,
            }
        }
        assert_eq!(dropped, N.div_ceil(7));
        sum
    });
    let want: u64 = (0..N).filter(|i| i % 7 != 0).sum();
    assert_eq!(sum, want, "every sent value arrived exactly once");
    assert!(TEST_SLOTS.created() <= N, "no more slots than completions");
}

#[test]
fn completion_slots_are_reused() {
    struct Local;
    static LOCAL: LazyLock<ObjectPool<Slot<String>>> = LazyLock::new(slot_pool);
    impl SlotPool<String> for Local {
        fn pool() -> &'static ObjectPool<Slot<String>> {
            &LOCAL
        }
    }
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
        for i in 0..1000 {
            let (tx, rx) = completion::<String, Local>();
            tx.send(i.to_string());
            assert_eq!(rx.await.unwrap(), i.to_string());
            // A value sent and never received is dropped with the slot (no leak, no double drop).
            let (tx, rx) = completion::<String, Local>();
            tx.send("unread".to_string());
            drop(rx);
            // Dropped unsent: the receiver sees it.
            let (tx, rx) = completion::<String, Local>();
            drop(tx);
            assert!(rx.await.is_err());
        }
    });
    assert_eq!(LOCAL.created(), 1, "one slot in use at a time: the same one every time");
}

/// A slot pool whose per-thread cache is a `thread_local!` of its own, as the client's is.
struct CachedSlots;
static CACHED_SLOTS: ObjectPool<Slot<Vec<u8>>> = slot_pool();
thread_local! {
    static CACHED: SlotCache<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
impl SlotPool<Vec<u8>> for CachedSlots {
    fn pool() -> &'static ObjectPool<Slot<Vec<u8>>> {
        &CACHED_SLOTS
    }
    fn with_cache<R>(f: impl FnOnce(&mut Vec<Box<Slot<Vec<u8>>>>) -> R) -> Option<R> {
        local_slot_cache(&CACHED, f)
    }
}

#[test]
fn a_slot_pool_with_a_thread_local_cache_reuses_its_slots_and_crosses_threads() {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
        for i in 0..1000u32 {
            let (tx, rx) = completion::<Vec<u8>, CachedSlots>();
            tx.send(i.to_le_bytes().to_vec());
            assert_eq!(rx.await.unwrap(), i.to_le_bytes());
        }
    });
    assert_eq!(CACHED_SLOTS.created(), 1, "one slot in use at a time: the same one every time");
    // Sent on other threads (a slot given back there stays in that thread's cache, freed when
    // the thread ends), received here: every value arrives once.
    let got: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u8)
            .map(|t| {
                let (tx, rx) = completion::<Vec<u8>, CachedSlots>();
                s.spawn(move || tx.send(vec![t]));
                rx
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        handles.into_iter().map(|rx| rt.block_on(rx).unwrap()).collect()
    });
    assert_eq!(got, [vec![0], vec![1], vec![2], vec![3]]);
}

#[test]
fn buffer_pool_keeps_no_more_than_its_bound() {
    const BOUND: usize = 1 << 20;
    let mut pool = BufferPool::new(BOUND, 4);
    std::thread::scope(|s| {
        for t in 0..4usize {
            let pool = &pool;
            s.spawn(move || {
                let mut held = Vec::new();
                for r in 0..2_000usize {
                    let n = 1 + (r * 7919 + t * 104_729) % 100_000;
                    let b = pool.get(n);
                    assert!(b.capacity() >= n);
                    held.push(b);
                    if held.len() == 64 {
                        held.drain(..).for_each(|b| pool.put(b));
                    }
                }
                held.drain(..).for_each(|b| pool.put(b));
            });
        }
    });
    let stats = pool.stats();
    assert!(stats.kept_bytes <= BOUND, "kept {} bytes with a bound of {BOUND}", stats.kept_bytes);
    assert!(stats.kept_bytes > BOUND / 2, "the pool should fill up to near its bound ({})", stats.kept_bytes);
    let held = pool.held_bytes();
    assert!(held <= BOUND, "holds {held} bytes with a bound of {BOUND}");
    assert_eq!(held, stats.kept_bytes, "the count matches what is held");
}

#[test]
fn buffer_pool_recycles_within_classes_and_bypasses_outside() {
    let pool = BufferPool::new(1 << 20, 4);
    let b = pool.get(1000);
    assert_eq!(b.capacity(), class_size(4), "1000 bytes come from the 1 KiB class");
    let addr = b.as_ptr();
    pool.put(b);
    let again = pool.get(700);
    assert_eq!(again.as_ptr(), addr, "the same buffer comes back for the same class");
    pool.put(again);

    // Outside the classes: never kept.
    let big = pool.get(MAX_CLASS + 1);
    pool.put(big);
    assert_eq!(pool.stats().kept_bytes, class_size(4));

    // A buffer whose bytes are still shared is not handed out until they are dropped.
    let mut b = pool.get(1000);
    b.extend_from_slice(&[7u8; 100]);
    let frame: Bytes = b.split_to(100).freeze();
    let addr = frame.as_ptr();
    pool.put(b);
    let other = pool.get(1000);
    assert_ne!(other.as_ptr(), addr, "a buffer with a live slice must not be reused");
    assert!(frame.iter().all(|&x| x == 7), "the live slice is untouched");
    drop(frame);
    let reused = pool.get(1000);
    assert_eq!(reused.as_ptr(), addr, "once the slice is gone the buffer is reused");
}
