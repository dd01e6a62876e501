//! Counters shared by the instance pools of one owner (a service client, the controller's
//! relay), kept apart from the pools so an endpoint can count into them without knowing pools.

use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;

use crate::metrics::stats::Snapshot;

/// Counters shared by the pools of one owner.
#[derive(Debug, Default)]
pub(crate) struct PoolStats {
    pub failovers: AtomicU64,
    /// Of the failovers, calls sent again because their server never ran them
    /// (`Error::NotRun`), whatever the method.
    pub resent_unrun: AtomicU64,
    pub instances_dropped: AtomicU64,
    /// Retries the budget refused.
    pub retries_refused: AtomicU64,
    /// Hedges sent, and hedges the budget refused.
    pub hedges: AtomicU64,
    pub hedges_refused: AtomicU64,
    /// Instances taken out as outliers (failing or slow).
    pub outliers_ejected: AtomicU64,
    /// Connections opened through an instance's same-host address, and same-host addresses
    /// that could not be opened (the connection went to the instance's address instead).
    pub local_connections: AtomicU64,
    pub local_failures: AtomicU64,
    /// Transport counters of connections that were closed or replaced.
    retired: Mutex<Snapshot>,
}

impl PoolStats {
    pub fn retire(&self, s: Snapshot) {
        self.retired.lock().add(&s);
    }

    pub fn retired(&self) -> Snapshot {
        *self.retired.lock()
    }
}
