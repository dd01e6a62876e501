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

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use coarsetime::Instant;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::pool::object::{Completer, Completion, ObjectPool, Slot, SlotPool, slot_pool};
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

/// Completion slots come from an object pool (they used to be a tokio oneshot: an `Arc`
/// allocated per call).
pub(crate) struct OutcomeSlots;

static SLOTS: LazyLock<ObjectPool<Slot<Outcome>>> = LazyLock::new(slot_pool);

impl SlotPool<Outcome> for OutcomeSlots {
    #[inline]
    fn pool() -> &'static ObjectPool<Slot<Outcome>> {
        &SLOTS
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
    entries: FxHashMap<u64, Entry>,
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
        while st.entries.contains_key(&id) {
            id = next_id();
        }
        st.entries.insert(id, Entry { waiter, deadline, timeout });
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
        self.state.lock().entries.remove(&id).is_some()
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
            match st.entries.remove(&id) {
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
        let (due, earliest) = {
            let mut st = self.state.lock();
            let due: Vec<(u64, Entry)> = st.entries.extract_if(|_, e| e.deadline <= now).collect();
            let earliest = st.entries.values().map(|e| e.deadline).min();
            st.sweep_at = earliest;
            (due, earliest)
        };
        for (id, e) in due {
            expired.push(id);
            e.waiter.send(Err(Error::Timeout(e.timeout)));
        }
        earliest
    }

    /// Fails every waiter with `err` and refuses new ones.
    pub fn fail_all(&self, err: Error) {
        let entries = {
            let mut st = self.state.lock();
            if st.failed.is_none() {
                st.failed = Some(err.clone());
            }
            std::mem::take(&mut st.entries)
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
