//! Room for the replies a connection has queued that its peer has not taken yet.
//!
//! A peer that sends requests and reads no replies makes the server hold the replies. Each
//! connection bounds its own: past [`MAX_UNSENT`] it stops reading requests until its peer
//! catches up. Beyond a small allowance ([`FREE`], what a peer that reads has queued between
//! two writes), a connection's unsent replies are also counted in the server's budget for
//! memory held for peers — the one that bounds frames being received — so that all peers that
//! do not read hold no more than the budget together, however many they are. A connection
//! whose replies find no room there stops reading too, and is closed with a go-away
//! (`Overloaded`) if none comes within the read timeout. A peer that reads its replies keeps
//! its queue under the allowance and never waits on the budget.
//!
//! The connection takes from the budget before it reads more requests; a small task gives
//! the bytes back as the peer takes replies (started while the connection holds any, so a
//! connection whose peer caught up and went quiet keeps nothing of the budget).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::transport::budget::{Held, ReceiveBudget, Refused};
use crate::transport::outbox::Outbox;

/// Unsent reply bytes above which a connection stops reading requests until its peer catches
/// up.
pub(crate) const MAX_UNSENT: usize = 16 << 20;

/// Unsent reply bytes a connection holds without taking from the budget.
pub(crate) const FREE: usize = 1 << 20;

/// Bytes are taken from the budget in steps of this size, so a queue that moves a little
/// around the allowance does not touch the budget at every turn.
const STEP: usize = 256 << 10;

/// One connection's share of the budget for its unsent replies.
pub(crate) struct ReplyRoom {
    budget: Arc<ReceiveBudget>,
    /// How long a connection may wait for room before it is closed (`None`: as long as it
    /// takes).
    patience: Option<Duration>,
    outbox: Arc<Outbox>,
    inner: Arc<Inner>,
}

struct Inner {
    /// Bytes held, read without the lock on the connection's every turn.
    bytes: AtomicUsize,
    held: Mutex<Holding>,
}

#[derive(Default)]
struct Holding {
    held: Option<Held>,
    /// The task that gives bytes back runs.
    keeper: bool,
}

/// What the budget must hold for `unsent` bytes.
fn needed(unsent: usize) -> usize {
    unsent.saturating_sub(FREE).div_ceil(STEP) * STEP
}

impl ReplyRoom {
    pub(crate) fn new(budget: Arc<ReceiveBudget>, patience: Option<Duration>, outbox: Arc<Outbox>) -> Self {
        let inner = Arc::new(Inner { bytes: AtomicUsize::new(0), held: Mutex::new(Holding::default()) });
        ReplyRoom { budget, patience, outbox, inner }
    }

    /// Waits until the connection may read more requests: its unsent replies under
    /// [`MAX_UNSENT`], and those over the allowance held in the budget. Refused when the
    /// budget has no room for them within the patience (or could never have).
    pub(crate) async fn wait(&self) -> Result<(), Refused> {
        // Nearly every turn: a peer that reads, nothing held. One lock, as the bound alone took.
        let Some(unsent) = self.outbox.unsent() else { return Ok(()) };
        if unsent <= FREE && self.inner.bytes.load(Relaxed) == 0 {
            return Ok(());
        }
        let started = Instant::now();
        loop {
            let drained = self.outbox.drained();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let Some(unsent) = self.outbox.unsent() else { return Ok(()) };
            if unsent >= MAX_UNSENT {
                drained.await;
                continue;
            }
            let more = needed(unsent).saturating_sub(self.inner.bytes.load(Relaxed));
            if more == 0 {
                return Ok(());
            }
            let waited = started.elapsed();
            let refused = |waited| Refused::Replies { unsent, budget: self.budget.bytes(), waited };
            if let Some(held) = self.budget.try_take(more) {
                self.add(held);
                return Ok(());
            }
            let patience = match self.patience {
                Some(p) if waited >= p => return Err(refused(waited)),
                Some(p) => Some(p - waited),
                None => None,
            };
            tokio::select! {
                // The peer took replies: look again.
                () = drained => {}
                taken = self.budget.take(more, patience) => match taken {
                    Ok(held) => {
                        self.add(held);
                        return Ok(());
                    }
                    // Never room (more than the whole budget), or not in time.
                    Err(_) => return Err(refused(started.elapsed())),
                },
            }
        }
    }

    /// Adds bytes taken from the budget; starts the task that gives them back as the peer
    /// takes its replies, unless it runs.
    fn add(&self, taken: Held) {
        let mut h = self.inner.held.lock();
        self.inner.bytes.fetch_add(taken.bytes(), Relaxed);
        match &mut h.held {
            Some(held) => held.merge(taken),
            none => *none = Some(taken),
        }
        if !h.keeper {
            h.keeper = true;
            let (inner, outbox) = (self.inner.clone(), self.outbox.clone());
            tokio::spawn(async move { inner.give_back(&outbox).await });
        }
    }
}

impl Inner {
    /// Gives back what the connection's unsent replies no longer need, after each write,
    /// until it holds nothing (or the connection's writer has ended: its replies are gone).
    async fn give_back(&self, outbox: &Outbox) {
        loop {
            let drained = outbox.drained();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let need = outbox.unsent().map_or(0, needed);
            {
                let mut h = self.held.lock();
                let held = h.held.as_ref().map_or(0, Held::bytes);
                if held > need {
                    let back = match need {
                        0 => h.held.take(),
                        _ => h.held.as_mut().and_then(|held| held.split(held.bytes() - need)),
                    };
                    self.bytes.fetch_sub(back.as_ref().map_or(0, Held::bytes), Relaxed);
                    drop(back);
                }
                if h.held.is_none() {
                    h.keeper = false;
                    return;
                }
            }
            drained.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_what_is_over_the_allowance_in_steps() {
        assert_eq!(needed(0), 0);
        assert_eq!(needed(FREE), 0);
        assert_eq!(needed(FREE + 1), STEP);
        assert_eq!(needed(FREE + STEP), STEP);
        assert_eq!(needed(FREE + STEP + 1), 2 * STEP);
    }
}
