//! The pending table: request id -> the caller's one-shot completion.
//!
//! One waiter per request, woken once: the reader removes a whole batch of completions under
//! one lock, then completes them outside it. A connection that fails completes every waiter
//! with the same error at once.

use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use crate::error::Error;

/// What a waiter receives: the raw reply payload (decoded by the caller, off the IO task), or
/// the error that ended the call.
pub(crate) type Outcome = Result<Bytes, Error>;
pub(crate) type Waiter = oneshot::Sender<Outcome>;

#[derive(Default)]
pub(crate) struct Pending {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    waiters: FxHashMap<u64, Waiter>,
    /// Set once the connection has failed; later inserts get this error.
    failed: Option<Error>,
}

impl Pending {
    /// Registers a waiter for `id`. `next_id` supplies another id if `id` is still in use
    /// (possible only after the 32-bit sequence wrapped around with a call that old still
    /// pending).
    pub fn insert(
        &self,
        mut id: u64,
        waiter: Waiter,
        mut next_id: impl FnMut() -> u64,
    ) -> Result<u64, Error> {
        let mut st = self.state.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        while st.waiters.contains_key(&id) {
            id = next_id();
        }
        st.waiters.insert(id, waiter);
        Ok(id)
    }

    /// Removes the waiter for `id`, if it is still there.
    pub fn remove(&self, id: u64) -> Option<Waiter> {
        self.state.lock().waiters.remove(&id)
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
            match st.waiters.remove(&id) {
                Some(w) => out.push((w, r)),
                None => late += 1,
            }
        }
        late
    }

    /// Fails every waiter with `err` and refuses new ones.
    pub fn fail_all(&self, err: Error) {
        let waiters = {
            let mut st = self.state.lock();
            if st.failed.is_none() {
                st.failed = Some(err.clone());
            }
            std::mem::take(&mut st.waiters)
        };
        for (_, w) in waiters {
            let _ = w.send(Err(err.clone()));
        }
    }

    pub fn len(&self) -> usize {
        self.state.lock().waiters.len()
    }
}
