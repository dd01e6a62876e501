//! [`Registry`]: a connection to a controller, with the registry protocol as typed calls, and
//! counters of every message exchanged with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::wire::*;
use crate::client::{CallOptions, Client, ClientConfig};
use crate::codec::Wire;
use crate::error::Error;
use crate::method::Method;
use crate::stats::Snapshot;

/// Extra time a registry call gets beyond what the controller may hold it for (long polls,
/// relayed calls), so the controller's answer, not our deadline, ends it.
const MARGIN: Duration = Duration::from_secs(5);

/// A connection to a controller. Cheap to clone; clones share the connection and counters.
///
/// On first contact the registry hands out a client id (unique among its clients); the
/// connection that asked is then replaced by one whose request ids carry that id, so every
/// request this client sends after first contact — to the controller or, through a
/// [`ServiceClient`](super::ServiceClient), to any instance — has an id unique across the
/// registry's clients. The id is given back when the last clone is dropped.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    address: String,
    /// Sent with register, renew and deregister (empty: none).
    credential: parking_lot::RwLock<String>,
    client: Client,
    client_id: u32,
    sequence: Arc<AtomicU32>,
    /// Transport counters of the first-contact connection.
    bootstrap_transport: Snapshot,
    lookups: AtomicU64,
    watches: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

/// What a [`Registry`] connection has done, readable at runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RegistryStats {
    /// `resolve` calls: look-ups of a service's instances.
    pub lookups: u64,
    /// `watch` long polls issued.
    pub watches: u64,
    /// Requests sent to the controller (every registry call, relayed calls included).
    pub messages_sent: u64,
    /// Replies (or error replies) received from the controller.
    pub messages_received: u64,
    /// Transport counters of the connection, first contact included (frames, messages,
    /// bytes; zero over `inproc://`, where nothing is encoded).
    pub transport: Snapshot,
}

impl RegistryStats {
    /// Messages sent to and received from the controller.
    pub fn messages(&self) -> u64 {
        self.messages_sent + self.messages_received
    }
}

impl Registry {
    /// Connects to the controller at `addr`. For [`DEFAULT_REGISTRY`](super::DEFAULT_REGISTRY)
    /// the embedded controller is started if nothing serves it yet.
    pub async fn connect(addr: &str) -> Result<Registry, Error> {
        Registry::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with explicit connection settings (timeouts, limits). `client_id` and
    /// `shared_sequence` are replaced by the ones the registry allocates.
    pub async fn connect_with(addr: &str, config: ClientConfig) -> Result<Registry, Error> {
        if addr == super::DEFAULT_REGISTRY {
            super::ensure_embedded().await?;
        }
        // First contact: ask for a client id over a connection whose own id is process-local.
        let bootstrap = Client::connect_with(addr, config.clone()).await?;
        let client_id = bootstrap.call(&ALLOC_CLIENT_ID, ()).await?;
        let bootstrap_transport = bootstrap.counters();
        drop(bootstrap);
        let sequence = Arc::new(AtomicU32::new(0));
        let cfg =
            ClientConfig { client_id: Some(client_id), shared_sequence: Some(sequence.clone()), ..config };
        let client = Client::connect_with(addr, cfg).await?;
        Ok(Registry {
            inner: Arc::new(Inner {
                address: addr.to_string(),
                credential: Default::default(),
                client,
                client_id,
                sequence,
                bootstrap_transport,
                lookups: AtomicU64::new(0),
                watches: AtomicU64::new(0),
                // The first-contact exchange counts.
                sent: AtomicU64::new(1),
                received: AtomicU64::new(1),
            }),
        })
    }

    /// The registration credential presented when registering, renewing and deregistering
    /// instances through this connection (see
    /// [`ControllerConfig::registration_credential`](super::ControllerConfig)). Applies to the
    /// clones of this `Registry` too.
    pub fn set_registration_credential(&self, credential: impl Into<String>) {
        *self.inner.credential.write() = credential.into();
    }

    fn credential(&self) -> String {
        self.inner.credential.read().clone()
    }

    /// The client id the registry allocated to this client.
    pub fn client_id(&self) -> u32 {
        self.inner.client_id
    }

    pub fn address(&self) -> &str {
        &self.inner.address
    }

    pub fn stats(&self) -> RegistryStats {
        let i = &self.inner;
        RegistryStats {
            lookups: i.lookups.load(Relaxed),
            watches: i.watches.load(Relaxed),
            messages_sent: i.sent.load(Relaxed),
            messages_received: i.received.load(Relaxed),
            transport: {
                let mut t = i.bootstrap_transport;
                super::pool::add_snapshot(&mut t, &i.client.counters());
                t
            },
        }
    }

    /// Settings for connections that act for this client (to instances): same id, same
    /// sequence, so request ids stay unique across all of them.
    pub(crate) fn client_config(&self, base: &ClientConfig) -> ClientConfig {
        ClientConfig {
            client_id: Some(self.inner.client_id),
            shared_sequence: Some(self.inner.sequence.clone()),
            ..base.clone()
        }
    }

    async fn call<Req: Wire, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        timeout: Option<Duration>,
    ) -> Result<Resp, Error> {
        self.inner.sent.fetch_add(1, Relaxed);
        let opts = CallOptions { timeout, idempotent: false };
        let call = self.inner.client.call_with(m, req, opts);
        // The deadline covers reconnecting too (a call's own deadline starts once connected).
        let r = match timeout {
            Some(t) => tokio::time::timeout(t, call).await.unwrap_or(Err(Error::Timeout(t))),
            None => call.await,
        };
        if matches!(r, Ok(_) | Err(Error::Remote(_))) {
            self.inner.received.fetch_add(1, Relaxed);
        }
        r
    }

    /// The instances of `service` now (one look-up).
    pub async fn resolve(&self, service: &str) -> Result<Resolved, Error> {
        self.inner.lookups.fetch_add(1, Relaxed);
        self.call(&RESOLVE, service.to_string(), None).await
    }

    /// One long poll (see [`WATCH`]).
    pub async fn watch(&self, req: WatchRequest) -> Result<Resolved, Error> {
        self.inner.watches.fetch_add(1, Relaxed);
        let t = Duration::from_millis(req.timeout_ms) + MARGIN;
        self.call(&WATCH, req, Some(t)).await
    }

    /// Every service and instance.
    pub async fn list(&self) -> Result<Listing, Error> {
        self.call(&LIST, (), None).await
    }

    /// A fresh client id (for clients that connect to servers without a `Registry` of their
    /// own).
    pub async fn alloc_client_id(&self) -> Result<u32, Error> {
        self.call(&ALLOC_CLIENT_ID, (), None).await
    }

    pub(crate) async fn register_raw(
        &self,
        mut req: RegisterRequest,
        timeout: Duration,
    ) -> Result<Registered, Error> {
        if req.credential.is_empty() {
            req.credential = self.credential();
        }
        self.call(&REGISTER, req, Some(timeout)).await.map_err(unauthenticated)
    }

    pub(crate) async fn renew(&self, lease: u64, timeout: Duration) -> Result<Renewed, Error> {
        let req = LeaseRequest { lease, credential: self.credential() };
        self.call(&RENEW, req, Some(timeout)).await.map_err(unauthenticated)
    }

    pub(crate) async fn deregister(&self, lease: u64, timeout: Duration) -> Result<u32, Error> {
        let req = LeaseRequest { lease, credential: self.credential() };
        self.call(&DEREGISTER, req, Some(timeout)).await.map_err(unauthenticated)
    }

    /// Relayed mode: the controller forwards the call and relays the outcome.
    pub(crate) async fn relay(&self, req: RelayRequest, timeout: Duration) -> Result<RelayReply, Error> {
        self.call(&RELAY, req, Some(timeout + MARGIN)).await
    }
}

/// The controller's refusal of a missing or wrong registration credential, as the typed error.
fn unauthenticated(e: Error) -> Error {
    match e {
        Error::Remote(s) if s.code == crate::proto::Code::Unauthenticated => {
            Error::Unauthenticated(s.message)
        }
        other => other,
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Give the id back, best effort: a client that vanishes keeps its id reserved.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (client, id) = (self.client.clone(), self.client_id);
            rt.spawn(async move {
                let opts = CallOptions::default().timeout(Duration::from_secs(1));
                let _ = client.call_with(&RELEASE_CLIENT_ID, id, opts).await;
            });
        }
    }
}
