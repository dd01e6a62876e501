//! The requests of one connection whose handler is still running, by id, so that a client's
//! `Cancel` stops the work: the handler's future is dropped once every request it serves has
//! been cancelled (a group of requests run together stops only when all of them are).
//!
//! Only work that outlived its first poll is here: what finishes at once cannot be cancelled
//! and costs nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct Running {
    by_id: Mutex<FxHashMap<u64, Arc<Work>>>,
}

/// One handler's work: cancelled when none of its requests is still wanted.
pub(super) struct Work {
    pub cancelled: CancellationToken,
    wanted: AtomicUsize,
}

impl Running {
    /// Registers the work serving `ids`.
    pub fn start(&self, ids: &[u64]) -> Arc<Work> {
        let work =
            Arc::new(Work { cancelled: CancellationToken::new(), wanted: AtomicUsize::new(ids.len()) });
        let mut by_id = self.by_id.lock();
        ids.iter().for_each(|&id| drop(by_id.insert(id, work.clone())));
        work
    }

    /// The client no longer waits for `id`. Unknown ids (answered already, or never running
    /// as a task) are fine: a cancel may cross its reply.
    pub fn cancel(&self, id: u64) {
        let Some(work) = self.by_id.lock().remove(&id) else { return };
        if work.wanted.fetch_sub(1, Ordering::AcqRel) == 1 {
            work.cancelled.cancel();
        }
    }

    /// The work serving `ids` ended (answered, expired, cancelled or aborted).
    pub fn finish(&self, ids: &[u64]) {
        let mut by_id = self.by_id.lock();
        ids.iter().for_each(|id| drop(by_id.remove(id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_cancelled_when_all_its_requests_are() {
        let running = Running::default();
        let group = running.start(&[1, 2]);
        let single = running.start(&[3]);
        running.cancel(1);
        running.cancel(1); // twice: counted once
        running.cancel(99); // unknown: nothing
        assert!(!group.cancelled.is_cancelled());
        running.cancel(2);
        assert!(group.cancelled.is_cancelled());
        assert!(!single.cancelled.is_cancelled());
        running.finish(&[3]);
        running.cancel(3); // answered already: nothing
        assert!(!single.cancelled.is_cancelled());
    }
}
