//! Everything the admin endpoint shows, read at one moment: one struct, so that `/metrics`
//! and `/vars.json` of the same moment agree.

use std::sync::Arc;
use std::time::Duration;

use super::histogram;
use super::method::{MethodMetrics, MethodSnapshot};
use crate::registry::ControllerStats;
use crate::registry::wire::ServiceListing;
use crate::server::ConnectionCounts;
use crate::stats::Snapshot;

/// One method's metrics, named.
#[derive(Clone)]
pub(crate) struct Named {
    pub service: Arc<str>,
    pub method: Arc<str>,
    pub snap: MethodSnapshot,
}

impl Named {
    pub(crate) fn of(m: &MethodMetrics) -> Named {
        Named { service: m.service.as_ref().into(), method: m.method.as_ref().into(), snap: m.snapshot() }
    }
}

/// A server's own metrics.
pub(crate) struct ServerScrape {
    /// Whether per-method metrics are kept (`ServerConfig::metrics`).
    pub per_method: bool,
    pub methods: Vec<Named>,
    pub connections: ConnectionCounts,
    pub accepted: u64,
    pub refused: u64,
    pub transport: Snapshot,
    pub per_frame_read: histogram::Snapshot,
    pub per_frame_written: histogram::Snapshot,
    /// Reader wake-ups per batch of messages read (see `stats::Shapes`).
    pub wakeups_per_batch: histogram::Snapshot,
    /// Requests answered `Overloaded` because the server's queue bound was full.
    pub overload_refusals: u64,
    /// Requests answered `DeadlineExceeded`.
    pub expiries: Expiries,
    /// Requests whose running handler was stopped because their client cancelled them.
    pub cancelled: u64,
    /// Requests held now by handlers that did not finish on their first poll (what
    /// `ServerConfig::max_queued` bounds).
    pub queued: u64,
}

/// Requests answered `DeadlineExceeded` because their caller's time budget ran out.
#[derive(Clone, Copy, serde::Serialize)]
pub(crate) struct Expiries {
    /// Before their handler ran: it never ran for them.
    pub before_handler: u64,
    /// While their handler ran: its work was dropped.
    pub in_handler: u64,
}

/// A controller's registry.
pub(crate) struct RegistryScrape {
    pub services: Vec<ServiceListing>,
    pub stats: ControllerStats,
}

/// Everything at one moment.
pub(crate) struct Scrape {
    pub uptime: Duration,
    pub server: ServerScrape,
    /// The methods this process called as a client (every client together).
    pub client: Vec<Named>,
    pub registry: Option<RegistryScrape>,
    /// Which process this is (the status page's header).
    pub identity: crate::admin::identity::Identity,
}

impl Scrape {
    /// The client methods of the process, read now.
    pub(crate) fn client_methods() -> Vec<Named> {
        super::client::methods().into_iter().map(Named::of).collect()
    }
}
