//! Everything the admin endpoint shows, read at one moment: one struct, so that `/metrics`
//! and `/vars.json` of the same moment agree.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::histogram;
use super::method::{MethodMetrics, MethodSnapshot};
use super::stats::Snapshot;

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
    /// Server streams: opened, items sent, how they ended.
    pub streams: StreamCounts,
    /// Bytes held now in buffers of large frames being received, and their bound
    /// (`ServerConfig::receive_budget`).
    pub receive_held: u64,
    pub receive_budget: u64,
    /// The adaptive concurrency limit now and the requests admitted under it, if the server
    /// has one.
    pub concurrency: Option<(u64, u64)>,
}

/// Requests answered `DeadlineExceeded` because their caller's time budget ran out.
#[derive(Clone, Copy, serde::Serialize)]
pub(crate) struct Expiries {
    /// Before their handler ran: it never ran for them.
    pub before_handler: u64,
    /// While their handler ran: its work was dropped.
    pub in_handler: u64,
}

/// A server's connections at one moment (see [`Server::connections`](crate::Server::connections)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionCounts {
    /// Connections being served (past their handshake and preamble).
    pub served: usize,
    /// Connections still opening: in their TLS handshake, or before the client's preamble.
    pub opening: usize,
    /// Opening connections closed so far to make room for newer ones (the handshake bound was
    /// full).
    pub opening_evicted: u64,
}

/// A layer built on a server that has more to show (the registry of a controller): it hands
/// its section to the admin endpoint through this, so that metrics/ names nothing above it.
pub(crate) trait RegistrySource: Send + Sync + 'static {
    /// The registry now (`None` once it is gone); `server` is the server's transport counters.
    fn registry(&self, server: Snapshot) -> BoxFuture<'_, Option<RegistryScrape>>;
}

/// A controller's registry, as the controller hands it over.
pub(crate) struct RegistryScrape {
    pub services: Vec<ServiceRow>,
    /// The controller's counters (`ControllerStats`) as `/vars.json` shows them.
    pub stats: serde_json::Value,
    /// The counters `/metrics` exports.
    pub counters: RegistryCounters,
}

/// A service as the registry lists it.
pub(crate) struct ServiceRow {
    pub name: String,
    pub revision: u64,
    pub instances: Vec<InstanceRow>,
}

/// An instance as the registry lists it, with its lease.
pub(crate) struct InstanceRow {
    pub id: u64,
    pub lease: u64,
    pub service: String,
    pub address: String,
    pub weight: u32,
    pub metadata: std::collections::BTreeMap<String, String>,
    pub lease_ttl_ms: u64,
    /// Milliseconds until the lease lapses unless renewed.
    pub expires_in_ms: u64,
}

/// The registry's counters that `/metrics` exports.
#[derive(Clone, Copy, Default)]
pub(crate) struct RegistryCounters {
    pub lease_renewals: u64,
    pub expired_instances: u64,
    pub watch_events: u64,
    pub resolves: u64,
    pub relayed_calls: u64,
    pub client_ids_held: u64,
}

/// Everything at one moment.
pub(crate) struct Scrape {
    pub uptime: Duration,
    pub server: ServerScrape,
    /// The methods this process called as a client (every client together).
    pub client: Vec<Named>,
    pub registry: Option<RegistryScrape>,
    /// Which process this is (the status page's header).
    pub identity: super::identity::Identity,
}

impl Scrape {
    /// The client methods of the process, read now.
    pub(crate) fn client_methods() -> Vec<Named> {
        super::client::methods().into_iter().map(Named::of).collect()
    }
}

/// A server's streams so far ([`Server::stream_stats`](crate::Server::stream_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamCounts {
    /// Streams opened.
    pub opened: u64,
    /// Items sent, over all streams.
    pub items: u64,
    /// Streams ended, by reason: `done` (the producer finished), `error` (the handler's error,
    /// a panic, a request that did not decode), `cancelled` (by the client, or its connection
    /// closed), `deadline`, `shutdown`.
    pub ended: [(&'static str, u64); 5],
}

impl StreamCounts {
    /// Streams ended for `reason` (one of the names in [`ended`](Self::ended); 0 for others).
    pub fn ended(&self, reason: &str) -> u64 {
        self.ended.iter().find(|(r, _)| *r == reason).map_or(0, |(_, n)| *n)
    }

    /// Streams open now.
    pub fn open(&self) -> u64 {
        self.opened.saturating_sub(self.ended.iter().map(|(_, n)| n).sum())
    }
}
