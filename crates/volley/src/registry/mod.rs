//! The registry: a controller that maps service names to instances and hands out client ids,
//! and the clients and servers that use it.
//!
//! - [`Controller`] — a Volley [`Server`](crate::Server) serving the registry protocol
//!   ([`wire`]): leases, instances by service, watches (long polls), client ids, and the relay
//!   of relayed mode, over a [`Store`] ([`MemoryStore`] here; the `volley-etcd` crate has one
//!   over etcd, so that several controllers act as one registry).
//!   Embedded by default ([`DEFAULT_REGISTRY`], started on first use) or standalone
//!   (`volley controller --listen ADDR`).
//! - [`Registry`] — a connection to a controller (or to one of a list, with failover);
//!   [`Registry::register`] puts a server's
//!   instances under a lease that a task renews (and rebuilds after a controller restart) and
//!   revokes when the server shuts down.
//! - [`ServiceClient`] — calls services by name. **Direct mode** (default): resolve once, cache,
//!   follow changes by watch, call instances directly, balance (round-robin,
//!   least-outstanding or peak-EWMA), route keyed calls on a consistent-hash ring, leave out
//!   instances that stop answering and fail idempotent calls over, keep calling from the cache
//!   while the registry is down. Opt-in: retries under a [`RetryBudget`], [`Hedge`]d requests,
//!   [`Outliers`] ejection, and reaching instances on this host ([`host_id`]) through the
//!   shared-memory (or unix) address they advertise beside their tcp one. **Relayed mode**:
//!   every call goes through the controller. Scatter-gather calls every instance.
//!
//! `docs/ARCHITECTURE.md` (Registry) explains the design; `docs/PROTOCOL.md` §16 specifies the
//! methods and messages.

mod attempts;
mod backoff;
mod budget;
mod client_ids;
mod connection;
mod controller;
mod ejection;
mod endpoint;
mod hash;
mod host;
mod instances;
mod latency;
mod merge;
mod policy;
mod pool_stats;
mod registration;
mod service_client;
mod store;
mod watch;
pub mod wire;

use std::time::Duration;

pub use connection::{Registry, RegistryStats};
pub use controller::{Controller, ControllerConfig, ControllerStats};
pub use hash::{HashRing, MAX_RING_WEIGHT, VNODES_PER_WEIGHT, hash_key, key_hash};
pub use host::{HOST_ID_ENV, host_id};
pub use instances::Balance;
pub use merge::merge_sorted;
pub use policy::{Hedge, InstanceStats, Outliers, RetryBudget};
pub use registration::{LeaseConfig, Registration};
pub use service_client::{Gathered, Mode, ServiceClient, ServiceClientStats, ServiceConfig};
pub use store::{MemoryStore, Renewal, ServiceState, Store, StoreError, StoreStatus};
pub use wire::{ControllerInfo, Instance, InstanceSpec, Listing, Resolved};

use crate::error::Error;

/// Where the embedded controller listens: a process needs no other registry when every role
/// lives in it.
pub const DEFAULT_REGISTRY: &str = "inproc://volley-registry";

/// Default lease time. Servers renew every third of it; a crashed server disappears from the
/// registry within it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

static EMBEDDED: tokio::sync::Mutex<Option<Controller>> = tokio::sync::Mutex::const_new(None);

/// The process's embedded controller on [`DEFAULT_REGISTRY`], started if it is not running.
///
/// It runs on the runtime that first needed it. If the application serves
/// [`DEFAULT_REGISTRY`] with a controller of its own, that one is used and this returns
/// `Ok(None)`.
pub async fn embedded() -> Result<Option<Controller>, Error> {
    let mut slot = EMBEDDED.lock().await;
    if let Some(c) = slot.as_ref().filter(|c| c.is_serving()) {
        return Ok(Some(c.clone()));
    }
    let name = DEFAULT_REGISTRY.trim_start_matches("inproc://");
    if crate::transport::inproc::lookup(name).is_some() {
        return Ok(None);
    }
    // No settling: an embedded controller restarts only with its process, and with it every
    // server that could have been registered, so there is nothing to wait for.
    let c = Controller::new(ControllerConfig { settle: Duration::ZERO, ..ControllerConfig::default() });
    c.listen(DEFAULT_REGISTRY).await?;
    tracing::debug!("started the embedded registry on {DEFAULT_REGISTRY}");
    *slot = Some(c.clone());
    Ok(Some(c))
}

pub(crate) async fn ensure_embedded() -> Result<(), Error> {
    embedded().await.map(|_| ())
}
