//! A bound, shared by every connection of a server, on the memory held for frames being
//! received and for replies queued to peers that do not read them: without it, each
//! connection that sends most of a large frame and stops holds that frame's buffer until its
//! read timeout, each that sends requests and reads no replies holds its queue of replies, and
//! a few thousand of them hold gigabytes. (Replies are taken from the budget by the server's
//! connections, see `server/reply_room.rs`.)
//!
//! Only buffers larger than a connection's ordinary read buffer (64 KiB) are counted: those are
//! the room for one large frame, which a peer chooses by announcing the frame's length. A reader
//! that needs such a buffer takes its size from the budget first, and waits while the budget
//! is spent (its peer's bytes stay in the kernel meanwhile: back-pressure); the bytes go back
//! when the buffer does. The wait is first come, first served (a tokio semaphore), so large
//! frames are not starved by smaller ones arriving later.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget of one server.
#[derive(Debug)]
pub(crate) struct ReceiveBudget {
    bytes: usize,
    free: Arc<Semaphore>,
}

/// Bytes taken from a budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    permit: OwnedSemaphorePermit,
}

/// Why a reader could not have room for a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The frame needs more than the whole budget.
    TooLarge { needed: usize, budget: usize },
    /// The budget stayed spent (by other connections' frames) for this long.
    Spent { needed: usize, budget: usize, waited: Duration },
    /// A connection's unsent replies (its peer reads none) found no room in the budget for
    /// this long.
    Replies { unsent: usize, budget: usize, waited: Duration },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLarge { needed, budget } => write!(
                f,
                "a frame needing {needed} bytes exceeds the server's budget of {budget} bytes for frames \
                 being received"
            ),
            Refused::Spent { needed, budget, waited } => write!(
                f,
                "the server's budget of {budget} bytes for frames being received stayed spent for \
                 {waited:?}; a frame needing {needed} bytes could not be taken"
            ),
            Refused::Replies { unsent, budget, waited } => write!(
                f,
                "the peer does not read its replies: {unsent} bytes of them unsent found no room in \
                 the server's budget of {budget} bytes for {waited:?}"
            ),
        }
    }
}

impl ReceiveBudget {
    /// A budget of `bytes` (capped at what a semaphore can count).
    pub(crate) fn new(bytes: usize) -> Arc<ReceiveBudget> {
        let bytes = bytes.min(Semaphore::MAX_PERMITS);
        Arc::new(ReceiveBudget { bytes, free: Arc::new(Semaphore::new(bytes)) })
    }

    /// The budget's size.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> usize {
        self.bytes - self.free.available_permits().min(self.bytes)
    }

    /// Takes `n` bytes, waiting up to `patience` (`None`: as long as it takes) for them.
    pub(crate) async fn take(&self, n: usize, patience: Option<Duration>) -> Result<Held, Refused> {
        let budget = self.bytes;
        let Ok(count) = u32::try_from(n) else { return Err(Refused::TooLarge { needed: n, budget }) };
        if n > budget {
            return Err(Refused::TooLarge { needed: n, budget });
        }
        let take = self.free.clone().acquire_many_owned(count);
        let permit = match patience {
            None => take.await,
            Some(p) => match tokio::time::timeout(p, take).await {
                Ok(r) => r,
                Err(_) => return Err(Refused::Spent { needed: n, budget, waited: p }),
            },
        };
        let permit = permit.expect("the budget's semaphore is never closed");
        Ok(Held { permit })
    }

    /// Takes `n` bytes if they are free now.
    pub(crate) fn try_take(&self, n: usize) -> Option<Held> {
        let count = u32::try_from(n).ok()?;
        self.free.clone().try_acquire_many_owned(count).ok().map(|permit| Held { permit })
    }
}

impl Held {
    /// The bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Holds `other`'s bytes too.
    pub(crate) fn merge(&mut self, other: Held) {
        self.permit.merge(other.permit);
    }

    /// Takes `n` of the bytes held into a `Held` of their own (`None` if fewer are held).
    pub(crate) fn split(&mut self, n: usize) -> Option<Held> {
        self.permit.split(n).map(|permit| Held { permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn takes_wait_while_the_budget_is_spent_and_give_back_on_drop() {
        let b = ReceiveBudget::new(100);
        let first = b.take(60, None).await.unwrap();
        assert_eq!(b.held(), 60);
        let second = b.take(40, None).await.unwrap();
        assert_eq!(b.held(), 100);
        // Spent: a third waits, and gives up after its patience.
        let refused = b.take(10, Some(Duration::from_secs(5))).await.unwrap_err();
        assert!(matches!(refused, Refused::Spent { needed: 10, budget: 100, .. }), "{refused:?}");
        assert!(refused.to_string().contains("budget of 100 bytes"), "{refused}");
        // A waiter is served as soon as bytes come back.
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.take(50, Some(Duration::from_secs(5))).await.map(drop) }
        });
        tokio::task::yield_now().await;
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        drop(second);
        assert_eq!(b.held(), 0);
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_whole_budget_is_refused_at_once() {
        let b = ReceiveBudget::new(100);
        let refused = b.take(101, None).await.unwrap_err();
        assert_eq!(refused, Refused::TooLarge { needed: 101, budget: 100 });
        assert_eq!(b.held(), 0);
    }
}
