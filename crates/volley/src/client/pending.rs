//! The pending table: request id -> the caller's one-shot completion and its deadline.
//!
//! One waiter per request, woken once: the reader removes a whole batch of completions under
//! one lock, then completes them outside it; the connection's sweeper removes the ones whose
//! deadline passed; a connection that fails completes every waiter with the same error. Each
//! path removes the waiter from the table before completing it, so a request ends exactly once.

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
    ) -> Result<u64, Error> {
        let mut st = self.state.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        while st.entries.contains_key(&id) {
            id = next_id();
        }
        st.entries.insert(id, Entry { waiter, deadline, timeout });
        Ok(id)
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
    /// their ids to `expired`, and returns the earliest deadline still pending.
    pub fn expire(&self, now: Instant, expired: &mut Vec<u64>) -> Option<Instant> {
        let (due, earliest) = {
            let mut st = self.state.lock();
            let due: Vec<(u64, Entry)> = st.entries.extract_if(|_, e| e.deadline <= now).collect();
            (due, st.entries.values().map(|e| e.deadline).min())
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
