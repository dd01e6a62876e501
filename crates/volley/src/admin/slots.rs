//! The admin endpoint's bound on connections served at once. A connection still sending its
//! request head can be closed to make room for a newcomer, oldest first; one past its head is
//! being answered (bounded by the answer's write timeout) and keeps its place.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// Places for `max` connections.
pub(super) struct Slots {
    max: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Connections still sending their head, by arrival (the first is the oldest), with the
    /// token that closes them.
    heads: BTreeMap<u64, CancellationToken>,
    /// Connections past their head.
    answering: usize,
    /// Connections closed to make room, since the start.
    evicted: u64,
}

/// One connection's place; given back when dropped.
pub(super) struct Slot {
    slots: Arc<Slots>,
    seq: u64,
    /// Cancelled when a newer connection takes this one's place.
    pub(super) evicted: CancellationToken,
}

impl Slots {
    pub(super) fn new(max: usize) -> Slots {
        Slots { max: max.max(1), state: Mutex::default() }
    }

    /// A place for a new connection: a free one, or that of the oldest connection still sending
    /// its head (which is closed); `None` if every place is held by a connection being answered.
    pub(super) fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut st = self.state.lock();
        if st.heads.len() + st.answering >= self.max {
            let (_, oldest) = st.heads.pop_first()?;
            oldest.cancel();
            st.evicted += 1;
            if st.evicted.is_power_of_two() {
                tracing::warn!(
                    bound = self.max,
                    evicted = st.evicted,
                    "admin connections that do not send their request head fill the endpoint; closing the oldest"
                );
            }
        }
        let seq = st.next;
        st.next += 1;
        let evicted = CancellationToken::new();
        st.heads.insert(seq, evicted.clone());
        Some(Slot { slots: self.clone(), seq, evicted })
    }

    #[cfg(test)]
    fn counts(&self) -> (usize, usize, u64) {
        let st = self.state.lock();
        (st.heads.len(), st.answering, st.evicted)
    }
}

impl Slot {
    /// The connection's head has arrived (or it failed): it is no longer evicted for others.
    pub(super) fn headed(&self) {
        let mut st = self.slots.state.lock();
        if st.heads.remove(&self.seq).is_some() {
            st.answering += 1;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.slots.state.lock();
        if st.heads.remove(&self.seq).is_none() && !self.evicted.is_cancelled() {
            st.answering -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_head_makes_room_and_answered_connections_keep_theirs() {
        let slots = Arc::new(Slots::new(3));
        let a = slots.take().unwrap();
        let b = slots.take().unwrap();
        let c = slots.take().unwrap();
        a.headed();
        // Full: the oldest still sending its head (b) makes room; a is being answered.
        let d = slots.take().unwrap();
        assert!(b.evicted.is_cancelled() && !a.evicted.is_cancelled() && !c.evicted.is_cancelled());
        assert_eq!(slots.counts(), (2, 1, 1));
        drop(b);
        assert_eq!(slots.counts(), (2, 1, 1), "an evicted slot was given back when evicted");
        // Every place answering: a newcomer is refused.
        c.headed();
        d.headed();
        assert!(slots.take().is_none());
        drop((a, c, d));
        assert_eq!(slots.counts(), (0, 0, 1));
        assert!(slots.take().is_some());
    }
}
