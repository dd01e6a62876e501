//! The pending table: request id -> the caller's one-shot completion and its deadline.
//!
//! One waiter per request, woken once: the reader removes a whole batch of completions under
//! one lock, then completes them outside it; the connection's sweeper removes the ones whose
//! deadline passed; a connection that fails completes every waiter with the same error. Each
//! path removes the waiter from the table before completing it, so a request ends exactly once.
//!
//! The table also holds the deadline the sweeper sleeps towards, so that an insert and a sweep
//! decide under the same lock whether the sweeper must be woken: a caller can never read a
//! target the sweeper is about to replace and miss the wake-up.
//!
//! The waiters sit in an [`IdTable`], direct-mapped by the id's low bits (the sequence): a
//! reply finds its waiter by an index and one comparison of the whole id, so a late reply to
//! a call that timed out finds nobody, even when a newer call holds the same slot. The sweeper
//! scans the whole table, once per sweep (about once per timeout period under steady load).

use std::cell::RefCell;
use std::time::Duration;

use super::clock::Instant;
use bytes::Bytes;
use parking_lot::Mutex;

use super::id_table::IdTable;
use crate::error::Error;
use crate::pool::object::{
    Completer, Completion, ObjectPool, Slot, SlotCache, SlotPool, local_slot_cache, slot_pool,
};
use crate::proto::BatchItems;

/// A reply as the reader hands it to the waiter, still encoded: the caller decodes it, off
/// the IO task.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The payload of a reply to a single request.
    One(Bytes),
    /// The items of a reply to a batch request.
    Batch(BatchItems),
}

/// What a waiter receives: the reply, or the error that ended the call.
pub(crate) type Outcome = Result<Reply, Error>;
pub(crate) type Waiter = Completer<Outcome, OutcomeSlots>;
/// The caller's side of a waiter.
pub(crate) type Waiting = Completion<Outcome, OutcomeSlots>;

/// Completion slots come from an object pool, so a call allocates nothing for its waiter (a
/// tokio oneshot would allocate an `Arc` per call).
pub(crate) struct OutcomeSlots;

static SLOTS: ObjectPool<Slot<Outcome>> = slot_pool();

thread_local! {
    static CACHE: SlotCache<Outcome> = const { RefCell::new(Vec::new()) };
}

impl SlotPool<Outcome> for OutcomeSlots {
    #[inline]
    fn pool() -> &'static ObjectPool<Slot<Outcome>> {
        &SLOTS
    }

    #[inline(always)]
    fn with_cache<R>(f: impl FnOnce(&mut Vec<Box<Slot<Outcome>>>) -> R) -> Option<R> {
        local_slot_cache(&CACHE, f)
    }
}

/// A waiter and its caller's side, from the pool.
pub(crate) fn waiter() -> (Waiter, Waiting) {
    crate::pool::object::completion()
}

struct Entry {
    waiter: Waiter,
    deadline: Instant,
    timeout: Duration,
}

#[derive(Default)]
pub(crate) struct Pending {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: IdTable<Entry>,
    /// Set once the connection has failed; later inserts get this error.
    failed: Option<Error>,
    /// The deadline the sweeper sleeps towards (`None`: it sleeps until woken).
    sweep_at: Option<Instant>,
}

/// What [`Pending::insert`] did: the id the waiter got, and whether its deadline is earlier
/// than the one the sweeper sleeps towards (the caller must wake the sweeper).
pub(crate) struct Inserted {
    pub id: u64,
    pub wake_sweeper: bool,
}

impl Pending {
    /// Registers a waiter for `id`, due to time out at `deadline`. `next_id` supplies another
    /// id if `id` is still in use (possible only after the 32-bit sequence wrapped around with
    /// a call that old still pending).
    pub fn insert(
        &self,
        mut id: u64,
        waiter: Waiter,
        deadline: Instant,
        timeout: Duration,
        mut next_id: impl FnMut() -> u64,
    ) -> Result<Inserted, Error> {
        let mut st = self.state.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let mut entry = Entry { waiter, deadline, timeout };
        while let Err(back) = st.entries.insert(id, entry) {
            entry = back;
            id = next_id();
        }
        // Under a steady load with one default timeout, deadlines arrive in order and this is
        // false: the sweeper is woken about once per timeout period, not once per call.
        let wake_sweeper = st.sweep_at.is_none_or(|at| deadline < at);
        if wake_sweeper {
            st.sweep_at = Some(deadline);
        }
        Ok(Inserted { id, wake_sweeper })
    }

    /// Removes the waiter for `id`, if it is still there.
    pub fn remove(&self, id: u64) -> bool {
        self.state.lock().entries.remove(id).is_some()
    }

    /// Takes the waiters of a batch of replies under one lock; ids nobody waits for any more
    /// (late replies to timed-out calls) are counted and dropped.
    pub fn take_batch<T>(
        &self,
        replies: impl Iterator<Item = (u64, T)>,
        out: &mut Vec<(Waiter, T)>,
    ) -> usize {
        let mut st = self.state.lock();
        let mut late = 0;
        for (id, r) in replies {
            match st.entries.remove(id) {
                Some(e) => out.push((e.waiter, r)),
                None => late += 1,
            }
        }
        late
    }

    /// Fails every waiter whose deadline is at or before `now` with [`Error::Timeout`], appends
    /// their ids to `expired`, and returns the earliest deadline still pending: the sweeper
    /// sleeps towards it, and a later insert with an earlier deadline is told to wake it.
    pub fn expire(&self, now: Instant, expired: &mut Vec<u64>) -> Option<Instant> {
        let mut due = Vec::new();
        let earliest = {
            let mut st = self.state.lock();
            st.entries.take_where(|e| e.deadline <= now, &mut due);
            let earliest = st.entries.values().map(|e| e.deadline).min();
            st.sweep_at = earliest;
            earliest
        };
        for (id, e) in due {
            expired.push(id);
            e.waiter.send(Err(Error::Timeout(e.timeout)));
        }
        earliest
    }

    /// Fails the waiters of `ids` (those still waiting) with `err`.
    pub fn fail_ids(&self, ids: Vec<u64>, err: &Error) {
        if ids.is_empty() {
            return;
        }
        let entries: Vec<Entry> = {
            let mut st = self.state.lock();
            ids.into_iter().filter_map(|id| st.entries.remove(id)).collect()
        };
        for e in entries {
            e.waiter.send(Err(err.clone()));
        }
    }

    /// Fails every waiter with `err` and refuses new ones.
    pub fn fail_all(&self, err: Error) {
        let entries = {
            let mut st = self.state.lock();
            if st.failed.is_none() {
                st.failed = Some(err.clone());
            }
            st.entries.drain()
        };
        for (_, e) in entries {
            e.waiter.send(Err(err.clone()));
        }
    }

    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use coarsetime::Duration as Ticks;

    use super::*;

    fn insert(p: &Pending, id: u64, deadline: Instant) -> Inserted {
        let (tx, _rx) = waiter();
        p.insert(id, tx, deadline, Duration::from_millis(1), || unreachable!()).unwrap()
    }

    /// The sweeper is woken exactly when a call brings a deadline earlier than the one it
    /// sleeps towards, including right after a sweep that emptied the table (the case a
    /// target kept outside the lock could miss).
    #[test]
    fn inserts_wake_the_sweeper_only_for_an_earlier_deadline() {
        let p = Pending::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Ticks::from_millis(ms);
        assert!(insert(&p, 1, at(100)).wake_sweeper, "first deadline: the sweeper sleeps without one");
        assert!(!insert(&p, 2, at(150)).wake_sweeper);
        assert!(insert(&p, 3, at(50)).wake_sweeper);
        assert!(!insert(&p, 4, at(60)).wake_sweeper, "the sweeper already wakes by 50");

        let mut expired = Vec::new();
        assert_eq!(p.expire(at(70), &mut expired), Some(at(100)));
        expired.sort();
        assert_eq!(expired, [3, 4]);
        assert!(insert(&p, 5, at(90)).wake_sweeper, "earlier than the 100 the sweep chose");
        assert!(!insert(&p, 6, at(95)).wake_sweeper);

        expired.clear();
        assert_eq!(p.expire(at(200), &mut expired), None);
        assert_eq!(expired.len(), 4);
        assert!(insert(&p, 7, at(1000)).wake_sweeper, "after an emptying sweep any deadline wakes");
    }

    #[test]
    fn expired_waiters_get_a_timeout_and_leave_the_table() {
        let p = Pending::default();
        let now = Instant::now();
        let (tx, mut rx) = waiter();
        p.insert(9, tx, now, Duration::from_millis(5), || unreachable!()).unwrap();
        let mut expired = Vec::new();
        assert_eq!(p.expire(now, &mut expired), None);
        assert_eq!(expired, [9]);
        assert_eq!(p.len(), 0);
        let waker = std::task::Waker::noop();
        let got = std::pin::Pin::new(&mut rx).poll(&mut std::task::Context::from_waker(waker));
        assert!(
            matches!(got, std::task::Poll::Ready(Ok(Err(Error::Timeout(d)))) if d == Duration::from_millis(5))
        );
    }
}

#[cfg(test)]
mod table_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn far() -> Instant {
        Instant::now() + coarsetime::Duration::from_secs(3600)
    }

    /// What a waiter got, without waiting: `None` while it has nothing.
    fn outcome(rx: &mut Waiting) -> Option<Outcome> {
        match std::pin::Pin::new(rx).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(r) => Some(r.expect("the waiter was dropped unsent")),
            Poll::Pending => None,
        }
    }

    fn reply(p: &Pending, id: u64, text: &'static str) -> usize {
        let mut done = Vec::new();
        let late = p.take_batch(std::iter::once((id, Ok(Reply::One(Bytes::from(text))))), &mut done);
        for (w, r) in done {
            w.send(r);
        }
        late
    }

    fn payload(o: Option<Outcome>) -> Option<Bytes> {
        match o {
            Some(Ok(Reply::One(b))) => Some(b),
            _ => None,
        }
    }

    /// A late reply to a timed-out call is dropped, even once a newer call holds its slot
    /// (ids 64 apart share a slot of the table's first 64), and the newer call gets its own
    /// reply.
    #[test]
    fn a_late_reply_is_dropped_not_given_to_the_slot_s_new_call() {
        let p = Pending::default();
        let now = Instant::now();
        let (old_id, new_id) = (1 << 32 | 3, 1 << 32 | (3 + 64));
        let (tx, mut old) = waiter();
        p.insert(old_id, tx, now, Duration::from_millis(1), || unreachable!()).unwrap();
        let mut expired = Vec::new();
        p.expire(now, &mut expired);
        assert_eq!(expired, [old_id]);
        assert!(matches!(outcome(&mut old), Some(Err(Error::Timeout(_)))));

        let (tx, mut new) = waiter();
        assert_eq!(
            p.insert(new_id, tx, far(), Duration::from_secs(1), || unreachable!()).unwrap().id,
            new_id
        );
        assert_eq!(reply(&p, old_id, "late"), 1, "the late reply is counted and dropped");
        assert!(outcome(&mut new).is_none(), "the new call got the old call's reply");
        assert_eq!(reply(&p, new_id, "mine"), 0);
        assert_eq!(payload(outcome(&mut new)).as_deref(), Some(&b"mine"[..]));
        assert_eq!(p.len(), 0);
    }

    /// After the sequence wrapped, an id still pending from the turn before is skipped: the
    /// call takes the next id, and each reply reaches its own call.
    #[test]
    fn a_wrapped_sequence_skips_an_id_still_pending() {
        let p = Pending::default();
        let (tx, mut first) = waiter();
        p.insert(5, tx, far(), Duration::from_secs(1), || unreachable!()).unwrap();
        let (tx, mut second) = waiter();
        let mut seq = 5;
        let id = p
            .insert(5, tx, far(), Duration::from_secs(1), || {
                seq += 1;
                seq
            })
            .unwrap()
            .id;
        assert_eq!(id, 6);
        assert_eq!(reply(&p, 6, "second"), 0);
        assert_eq!(reply(&p, 5, "first"), 0);
        assert_eq!(payload(outcome(&mut first)).as_deref(), Some(&b"first"[..]));
        assert_eq!(payload(outcome(&mut second)).as_deref(), Some(&b"second"[..]));
        assert_eq!(p.len(), 0);
    }

    /// Clients that share a sequence take every id from it (a table only refuses an id still
    /// pending, never makes one up), so their ids never coincide, across the sequence's wrap
    /// and with calls left pending in every table.
    #[test]
    fn clients_sharing_a_sequence_never_use_the_same_id() {
        let seq = Arc::new(AtomicU32::new(u32::MAX - 500)); // wraps during the test
        let tables: Vec<Arc<Pending>> = (0..3).map(|_| Arc::default()).collect();
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let (seq, table) = (seq.clone(), tables[t % 3].clone());
                std::thread::spawn(move || {
                    let next = || (9u64 << 32) | seq.fetch_add(1, Ordering::Relaxed) as u64;
                    let mut ids = Vec::new();
                    for n in 0..2000 {
                        let (tx, _rx) = waiter();
                        let id = table.insert(next(), tx, far(), Duration::from_secs(1), next).unwrap().id;
                        ids.push(id);
                        // Keep every 7th call pending: later ids of the same slot collide.
                        if n % 7 != 0 {
                            assert!(table.remove(id));
                        }
                    }
                    ids
                })
            })
            .collect();
        let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "an id was used twice");
    }

    /// A failed connection ends every waiter once, with its error, refuses new ones, and drops
    /// replies that arrive after.
    #[test]
    fn fail_all_ends_every_waiter_and_refuses_new_ones() {
        let p = Pending::default();
        let mut rxs = Vec::new();
        for id in 0..100 {
            let (tx, rx) = waiter();
            p.insert(id * 64, tx, far(), Duration::from_secs(1), || unreachable!()).unwrap();
            rxs.push(rx);
        }
        p.fail_all(Error::Connection("gone".into()));
        assert_eq!(p.len(), 0);
        for rx in &mut rxs {
            assert!(matches!(outcome(rx), Some(Err(Error::Connection(m))) if m == "gone"));
        }
        let (tx, _rx) = waiter();
        let r = p.insert(7, tx, far(), Duration::from_secs(1), || unreachable!());
        assert!(matches!(r, Err(Error::Connection(m)) if m == "gone"));
        assert_eq!(reply(&p, 64, "late"), 1);
    }

    /// The sweep ends exactly the calls whose deadline passed, wherever they sit in the
    /// table, and returns the earliest deadline left.
    #[test]
    fn expire_ends_the_due_calls_and_finds_the_earliest_left() {
        let p = Pending::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + coarsetime::Duration::from_millis(ms);
        let mut rxs = Vec::new();
        // Ids 64 apart share a slot while the table is small: some sit in its overflow.
        for k in 0..40u64 {
            let (tx, rx) = waiter();
            p.insert(k * 64, tx, at(10 * (k + 1)), Duration::from_millis(5), || unreachable!()).unwrap();
            rxs.push(rx);
        }
        let mut expired = Vec::new();
        assert_eq!(p.expire(at(200), &mut expired), Some(at(210)));
        expired.sort();
        assert_eq!(expired, (0..20u64).map(|k| k * 64).collect::<Vec<_>>());
        for (k, rx) in rxs.iter_mut().enumerate() {
            let got = outcome(rx);
            if k < 20 {
                assert!(matches!(got, Some(Err(Error::Timeout(_)))), "call {k}");
            } else {
                assert!(got.is_none(), "call {k} ended early");
            }
        }
        assert_eq!(p.len(), 20);
        assert_eq!(reply(&p, 0, "late"), 1, "the reply to an expired call is dropped");
    }
}
