//! Per-connection bounds on what is in flight, so that a burst of callers waits for room instead
//! of queueing without limit.
//!
//! Items (a single call is one, a chunk of a batch counts its items) are bounded exactly: a call
//! holds its items until it ends. Bytes are bounded softly: a call waits while more than
//! `max_bytes` of requests are unanswered, then adds its own size, so the bound can be passed by
//! the calls admitted at the same moment — at most `max_items` messages.
//!
//! The items are a counter, not tokio's `Semaphore`: a semaphore's release takes its waiters'
//! lock every time, about 85 instructions of a 4,100-instruction call (scripts/callcost.py,
//! tcp-256). Here a call that finds room takes and gives back its items with one atomic
//! operation each; only calls that wait, and ends that find calls waiting, touch the `Notify`.
//! While calls wait, new calls wait with them rather than take room on the fast path. Items
//! given back wake one waiting call (the longest waiting), which passes the wake-up on when it
//! got in and room is left; bytes that fall under their bound wake every waiting call. Unlike
//! the semaphore's queue, a woken call that needs more items than there are goes back to
//! waiting, and one that needs fewer may get in first.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use tokio::sync::Notify;

use crate::error::Error;

/// Flow-control settings of a connection (see [`ClientConfig`](super::ClientConfig)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlowLimits {
    pub max_items: usize,
    pub max_bytes: usize,
}

pub(crate) struct FlowControl {
    items: AtomicUsize,
    max_items: usize,
    bytes: AtomicUsize,
    max_bytes: usize,
    /// Calls waiting in [`admit`](Self::admit).
    waiting: AtomicUsize,
    /// Wakes the waiting calls when items or bytes are given back.
    room: Notify,
}

/// Items a call holds until it ends.
pub(crate) struct Items<'a> {
    flow: &'a FlowControl,
    n: usize,
}

impl Drop for Items<'_> {
    fn drop(&mut self) {
        self.flow.items.fetch_sub(self.n, SeqCst);
        if self.flow.waiting.load(SeqCst) > 0 {
            self.flow.room.notify_one();
        }
    }
}

/// Bytes of one unanswered request; given back when the call ends.
pub(crate) struct InFlightBytes<'a> {
    flow: &'a FlowControl,
    n: usize,
}

impl<'a> InFlightBytes<'a> {
    pub(crate) fn add(flow: &'a FlowControl, n: usize) -> Self {
        flow.bytes.fetch_add(n, SeqCst);
        InFlightBytes { flow, n }
    }
}

impl Drop for InFlightBytes<'_> {
    fn drop(&mut self) {
        let before = self.flow.bytes.fetch_sub(self.n, SeqCst);
        if before > self.flow.max_bytes
            && before - self.n <= self.flow.max_bytes
            && self.flow.waiting.load(SeqCst) > 0
        {
            self.flow.room.notify_waiters();
        }
    }
}

/// Counts a call in `admit` for as long as it waits (also when its future is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl FlowControl {
    pub(crate) fn new(l: FlowLimits) -> Self {
        FlowControl {
            items: AtomicUsize::new(0),
            max_items: l.max_items,
            bytes: AtomicUsize::new(0),
            max_bytes: l.max_bytes,
            waiting: AtomicUsize::new(0),
            room: Notify::new(),
        }
    }

    /// Room for `n` more items now, if there is some and no call waits for room (`None`: wait
    /// for it with `admit`).
    #[inline]
    pub(crate) fn try_admit(&self, n: usize) -> Result<Option<Items<'_>>, Error> {
        self.check(n)?;
        if self.waiting.load(SeqCst) > 0 {
            return Ok(None);
        }
        Ok(self.take(n).filter(|_| self.bytes.load(SeqCst) <= self.max_bytes))
    }

    /// Waits until `n` more items and some bytes may be in flight.
    pub(crate) async fn admit(&self, n: usize) -> Result<Items<'_>, Error> {
        self.check(n)?;
        self.waiting.fetch_add(1, SeqCst);
        let waiting = Waiting(&self.waiting);
        let mut items = None;
        loop {
            // Registered before the checks: whoever gives room back after them sees this call
            // counted and wakes it (a `Notified` dropped with a wake-up passes it on).
            let mut room = std::pin::pin!(self.room.notified());
            room.as_mut().enable();
            items = items.or_else(|| self.take(n));
            if items.is_some() && self.bytes.load(SeqCst) <= self.max_bytes {
                break;
            }
            room.await;
        }
        drop(waiting);
        if self.waiting.load(SeqCst) > 0 && self.items.load(SeqCst) < self.max_items {
            self.room.notify_one();
        }
        Ok(items.expect("admitted"))
    }

    /// Whether no request is unanswered (bytes are held from a request's queueing to its
    /// call's end, and every request has some).
    pub(crate) fn idle(&self) -> bool {
        self.bytes.load(Relaxed) == 0
    }

    /// Items admitted and not yet given back.
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        self.items.load(Relaxed)
    }

    fn check(&self, n: usize) -> Result<(), Error> {
        if n > self.max_items {
            return Err(Error::Usage(format!(
                "a call of {n} items exceeds the connection's in-flight bound of {} (use smaller chunks)",
                self.max_items
            )));
        }
        Ok(())
    }

    #[inline]
    fn take(&self, n: usize) -> Option<Items<'_>> {
        let mut held = self.items.load(SeqCst);
        loop {
            if held + n > self.max_items {
                return None;
            }
            match self.items.compare_exchange_weak(held, held + n, SeqCst, SeqCst) {
                Ok(_) => return Some(Items { flow: self, n }),
                Err(now) => held = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn flow(max_items: usize, max_bytes: usize) -> Arc<FlowControl> {
        Arc::new(FlowControl::new(FlowLimits { max_items, max_bytes }))
    }

    #[test]
    fn room_is_taken_and_given_back() {
        let f = flow(3, 1 << 20);
        let a = f.try_admit(2).unwrap().expect("room for 2");
        assert!(f.try_admit(2).unwrap().is_none(), "only 1 left");
        let b = f.try_admit(1).unwrap().expect("room for 1");
        drop(a);
        assert!(f.try_admit(2).unwrap().is_some());
        drop(b);
        assert!(matches!(f.try_admit(4), Err(Error::Usage(_))), "more than the bound is a usage error");
    }

    #[tokio::test]
    async fn a_waiting_call_is_admitted_when_room_is_given_back_and_new_calls_leave_the_fast_path() {
        let f = flow(2, 1 << 20);
        let held = f.try_admit(2).unwrap().unwrap();
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.admit(2).await.map(|i| i.n) });
        while f.waiting.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        drop(held);
        // Room is back, but a call waits: a new call queues behind it.
        assert!(f.try_admit(1).unwrap().is_none());
        let n = tokio::time::timeout(Duration::from_secs(30), waiter).await.unwrap().unwrap().unwrap();
        assert_eq!(n, 2);
        assert_eq!(f.waiting.load(SeqCst), 0);
        assert!(f.try_admit(2).unwrap().is_some(), "the waiter's items were given back when it ended");
    }

    /// One end gives back room for several waiting calls: its one wake-up is passed on until
    /// every one that fits is in.
    #[tokio::test]
    async fn room_for_many_given_back_at_once_admits_them_all() {
        let f = flow(4, 1 << 20);
        let held = f.try_admit(4).unwrap().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..4 {
            let (f, tx) = (f.clone(), tx.clone());
            tokio::spawn(async move {
                let items = f.admit(1).await.unwrap();
                tx.send(()).unwrap();
                std::future::pending::<()>().await; // holds its item
                drop(items);
            });
        }
        while f.waiting.load(SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
        drop(held);
        for i in 0..4 {
            let got = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await;
            assert!(got.is_ok(), "only {i} of 4 waiting calls were admitted");
        }
        assert_eq!(f.items.load(SeqCst), 4);
    }

    #[tokio::test]
    async fn a_call_over_the_byte_bound_waits_until_bytes_are_given_back() {
        let f = flow(10, 100);
        let bytes = InFlightBytes::add(&f, 150);
        assert!(f.try_admit(1).unwrap().is_none(), "over the byte bound");
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.admit(1).await.is_ok() });
        while f.waiting.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        drop(bytes);
        assert!(tokio::time::timeout(Duration::from_secs(30), waiter).await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn a_wait_given_up_counts_no_more() {
        let f = flow(1, 1 << 20);
        let held = f.try_admit(1).unwrap().unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(10), f.admit(1)).await;
        assert!(waited.is_err(), "no room while the item is held");
        assert_eq!(f.waiting.load(SeqCst), 0);
        drop(held);
        assert!(f.try_admit(1).unwrap().is_some(), "new calls take the fast path again");
    }

    /// Many callers on two threads, of one to three items each, under a bound of 8: never more
    /// than 8 items held at once, and every call is admitted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bound_holds_under_contention_and_every_call_gets_in() {
        const MAX: usize = 8;
        let f = flow(MAX, usize::MAX);
        let held = Arc::new(AtomicUsize::new(0));
        let admitted = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let (f, held, admitted) = (f.clone(), held.clone(), admitted.clone());
                tokio::spawn(async move {
                    for i in 0..200 {
                        let n = 1 + (t + i) % 3;
                        let items = match f.try_admit(n).unwrap() {
                            Some(items) => items,
                            None => f.admit(n).await.unwrap(),
                        };
                        let now = held.fetch_add(n, SeqCst) + n;
                        assert!(now <= MAX, "{now} items held at once, bound {MAX}");
                        if i % 4 == 0 {
                            tokio::task::yield_now().await;
                        }
                        held.fetch_sub(n, SeqCst);
                        drop(items);
                        admitted.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(120), t).await.expect("no call waits forever").unwrap();
        }
        assert_eq!(admitted.load(SeqCst), 64 * 200);
        assert_eq!(f.items.load(SeqCst), 0);
        assert_eq!(f.waiting.load(SeqCst), 0);
    }
}
