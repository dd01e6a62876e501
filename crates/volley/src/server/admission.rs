//! Which connections the server takes on: a bound on connections still opening (TLS handshake,
//! then the client's preamble) and a bound on connections served.
//!
//! The two are apart because a connection costs an attacker nothing until it has opened: ten
//! thousand TCP connects that never send a byte would otherwise fill the served bound and lock
//! every real client out. Opening connections have a bound of their own, and when it is full
//! the **oldest** one is dropped to make room for the newcomer. A per-address cap would not do:
//! attackers and real clients may share an address (a NAT, a proxy, one host). Evicting the
//! oldest means an attacker must open connections faster than a real client's handshake takes
//! (over a thousand per millisecond at the default bound) to keep anyone out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// Connection bookkeeping of one server.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    opening: Mutex<Opening>,
    /// Connections being served now (past their opening).
    served: AtomicUsize,
    /// Connections taken on, and refused over the bound, since the start.
    accepted: AtomicU64,
    refused: AtomicU64,
}

#[derive(Debug, Default)]
struct Opening {
    next: u64,
    /// Each opening connection's cancel token, by arrival: the first entry is the oldest.
    pending: BTreeMap<u64, CancellationToken>,
    /// Opening connections dropped to make room, since the server started.
    evicted: u64,
}

/// An opening connection's place in the bound; gives it back when dropped.
pub(crate) struct OpeningTicket {
    admission: Arc<Admission>,
    seq: u64,
    /// Cancelled when a newer connection needs the place.
    pub(crate) evicted: CancellationToken,
}

/// A served connection's place in the bound; gives it back when dropped.
pub(crate) struct Served(Arc<Admission>);

impl Admission {
    /// Takes a place among the opening connections, evicting the oldest if all `max` are taken.
    pub(crate) fn opening(self: &Arc<Self>, max: usize) -> OpeningTicket {
        let evicted = CancellationToken::new();
        let mut op = self.opening.lock();
        while op.pending.len() >= max.max(1) {
            let Some((_, oldest)) = op.pending.pop_first() else { break };
            oldest.cancel();
            op.evicted += 1;
            // Logged at the 1st, 2nd, 4th, 8th ... eviction: visible, and quiet under a flood.
            if op.evicted.is_power_of_two() {
                tracing::warn!(
                    bound = max,
                    evicted = op.evicted,
                    "connections that do not finish opening fill the handshake bound; closing the oldest"
                );
            }
        }
        let seq = op.next;
        op.next += 1;
        op.pending.insert(seq, evicted.clone());
        OpeningTicket { admission: self.clone(), seq, evicted }
    }

    /// Counts a connection as served, unless `max` are served already.
    pub(crate) fn serve(self: &Arc<Self>, max: Option<usize>) -> Option<Served> {
        let n = self.served.fetch_add(1, Ordering::AcqRel);
        if max.is_some_and(|max| n >= max) {
            self.served.fetch_sub(1, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Some(Served(self.clone()))
    }

    /// Connections served and connections refused since the start.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.accepted.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed))
    }

    /// Connections served now.
    pub(crate) fn served(&self) -> usize {
        self.served.load(Ordering::Acquire)
    }

    /// Connections opening now, and how many were evicted so far.
    pub(crate) fn opening_counts(&self) -> (usize, u64) {
        let op = self.opening.lock();
        (op.pending.len(), op.evicted)
    }

    pub(crate) fn counts(&self) -> crate::metrics::ConnectionCounts {
        let (opening, evicted) = self.opening_counts();
        crate::metrics::ConnectionCounts { served: self.served(), opening, opening_evicted: evicted }
    }
}

impl Drop for OpeningTicket {
    fn drop(&mut self) {
        self.admission.opening.lock().pending.remove(&self.seq);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.0.served.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_opening_bound_evicts_the_oldest_and_keeps_the_newest() {
        let a = Arc::new(Admission::default());
        let t: Vec<_> = (0..3).map(|_| a.opening(3)).collect();
        assert!(t.iter().all(|t| !t.evicted.is_cancelled()));
        let newest = a.opening(3);
        assert!(t[0].evicted.is_cancelled(), "the oldest makes room");
        assert!(!t[1].evicted.is_cancelled() && !t[2].evicted.is_cancelled());
        assert!(!newest.evicted.is_cancelled());
        assert_eq!(a.opening_counts(), (3, 1));
        drop(t);
        assert_eq!(a.opening_counts(), (1, 1), "dropped tickets give their place back");
    }

    #[test]
    fn the_served_bound_refuses_over_the_limit_and_frees_on_drop() {
        let a = Arc::new(Admission::default());
        let s1 = a.serve(Some(2)).unwrap();
        let _s2 = a.serve(Some(2)).unwrap();
        assert!(a.serve(Some(2)).is_none());
        assert_eq!(a.served(), 2);
        drop(s1);
        assert!(a.serve(Some(2)).is_some());
        assert!(a.serve(None).is_some(), "no limit");
    }
}
