//! [`Registry`]: a connection to a controller — or to the first answering one of a list of
//! controllers over one shared store — with the registry protocol as typed calls, failover
//! between the controllers, and counters of every message exchanged with them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backoff::ReconnectGate;
use crate::client::{CallOptions, Client, ClientConfig};
use crate::codec::Wire;
use crate::discovery::DEFAULT_REGISTRY;
use crate::discovery::wire::*;
use crate::error::Error;
use crate::method::Method;
use crate::metrics::stats::Snapshot;

/// Extra time a registry call gets beyond what the controller may hold it for (long polls,
/// relayed calls), so the controller's answer, not our deadline, ends it.
const MARGIN: Duration = Duration::from_secs(5);

/// A connection to a controller. Cheap to clone; clones share the connection and counters.
///
/// On first contact the registry hands out a client id (unique among its clients); the
/// connection that asked is then replaced by one whose request ids carry that id, so every
/// request this client sends after first contact — to the controller or, through a
/// [`ServiceClient`](crate::ServiceClient), to any instance — has an id unique across the
/// registry's clients. The id is given back when the last clone is dropped.
///
/// **Several controllers.** The address may be a comma-separated list
/// (`tcp://a:7400,tcp://b:7400`): controllers that share one store (etcd, see
/// `docs/ETCD.md`) and so behave as one registry. Calls go to one controller at a time — the
/// first of the list that answers — and move to the next one when it cannot be reached or its
/// connection fails (a relayed call that may already have been sent moves only if it is
/// idempotent). Controllers with separate in-memory stores can be listed too; they do not
/// share state, but servers register again with, and clients re-read from, whichever one
/// answers.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    /// The address as given (one controller, or a comma-separated list).
    address: String,
    /// Sent with register, renew and deregister (empty: none).
    credential: parking_lot::RwLock<String>,
    /// The controllers, in order of preference.
    controllers: Vec<String>,
    config: ClientConfig,
    /// A connection per controller, made on first use (reconnecting on demand after that).
    clients: Mutex<Vec<Option<Client>>>,
    /// Paces the connection attempts to each controller while it is unreachable.
    gates: Vec<ReconnectGate>,
    /// Connection attempts to controllers after first contact (failed ones included).
    reconnects: AtomicU64,
    /// Index of the controller calls go to now.
    current: AtomicUsize,
    failovers: AtomicU64,
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
#[non_exhaustive]
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
    /// Times calls moved to another controller of the list because the one in use could not
    /// be reached.
    pub failovers: u64,
    /// Connection attempts to controllers after first contact, failed ones included. While a
    /// controller is unreachable they are paced (at most 20 a second); calls in between fail
    /// at once with a connection error.
    pub reconnects: u64,
}

impl RegistryStats {
    /// Messages sent to and received from the controller.
    pub fn messages(&self) -> u64 {
        self.messages_sent + self.messages_received
    }
}

impl Registry {
    /// Connects to the controller at `addr`. For [`DEFAULT_REGISTRY`]
    /// the embedded controller is started if nothing serves it yet.
    pub async fn connect(addr: &str) -> Result<Registry, Error> {
        Registry::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with explicit connection settings (timeouts, limits). `client_id` and
    /// `shared_sequence` are replaced by the ones the registry allocates. `addr` may list
    /// several controllers, separated by commas; the first that answers is used.
    pub async fn connect_with(addr: &str, config: ClientConfig) -> Result<Registry, Error> {
        let controllers: Vec<String> =
            addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect();
        if controllers.is_empty() {
            return Err(Error::InvalidAddress {
                addr: addr.to_string(),
                reason: "no controller address".into(),
            });
        }
        if controllers.iter().any(|a| a == DEFAULT_REGISTRY) {
            crate::controller::embedded().await?;
        }
        // First contact: ask for a client id over a connection whose own id is process-local,
        // from the first controller that answers.
        let mut first = None;
        let mut last_err = None;
        for (i, a) in controllers.iter().enumerate() {
            let attempt = async {
                let bootstrap = Client::connect_with(a, config.clone()).await?;
                let id = bootstrap.call(&ALLOC_CLIENT_ID, ()).await?;
                Ok::<_, Error>((id, bootstrap))
            };
            match attempt.await {
                Ok((id, bootstrap)) => {
                    first = Some((i, id, bootstrap));
                    break;
                }
                Err(e) => {
                    if controllers.len() > 1 {
                        tracing::warn!(controller = %a, error = %e, "registry controller unavailable; trying the next one");
                    }
                    last_err = Some(e);
                }
            }
        }
        let Some((index, client_id, bootstrap)) = first else {
            return Err(last_err.expect("at least one controller was tried"));
        };
        let sequence = Arc::new(AtomicU32::new(0));
        let cfg =
            ClientConfig { client_id: Some(client_id), shared_sequence: Some(sequence.clone()), ..config };
        let client = Client::connect_with(&controllers[index], cfg.clone()).await?;
        // The controller holds the id for the connection that asked for it: the new connection
        // claims it before that one closes, so it is never free in between.
        claim(&client, client_id).await;
        let bootstrap_transport = bootstrap.counters();
        drop(bootstrap);
        let mut clients = vec![None; controllers.len()];
        let gates = controllers.iter().map(|_| ReconnectGate::default()).collect();
        clients[index] = Some(client);
        Ok(Registry {
            inner: Arc::new(Inner {
                address: addr.to_string(),
                credential: Default::default(),
                controllers,
                config: cfg,
                gates,
                reconnects: AtomicU64::new(0),
                clients: Mutex::new(clients),
                current: AtomicUsize::new(index),
                failovers: AtomicU64::new(0),
                client_id,
                sequence,
                bootstrap_transport,
                lookups: AtomicU64::new(0),
                watches: AtomicU64::new(0),
                // First contact counts: the id asked for, and claimed on the new connection.
                sent: AtomicU64::new(2),
                received: AtomicU64::new(2),
            }),
        })
    }

    /// The registration credential presented when registering, renewing and deregistering
    /// instances through this connection (see
    /// [`ControllerConfig::registration_credential`](crate::controller::ControllerConfig)). Applies to the
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

    /// The registry address as given (one controller, or a comma-separated list).
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The controllers this client may use, in order of preference.
    pub fn controllers(&self) -> &[String] {
        &self.inner.controllers
    }

    /// The controller calls go to now.
    pub fn current_controller(&self) -> &str {
        &self.inner.controllers[self.inner.current.load(Relaxed)]
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
                for c in i.clients.lock().iter().flatten() {
                    t.add(&c.counters());
                }
                t
            },
            failovers: i.failovers.load(Relaxed),
            reconnects: i.reconnects.load(Relaxed),
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

    /// The connection to controller `i`, connected: made now if there is none or it was lost,
    /// at the gate's pace (a controller that is down is not dialled by every call). After a
    /// reconnect the client's id is claimed on the new connection, so the controller — a
    /// restarted one included — holds it for this client again.
    async fn connected(&self, i: usize) -> Result<Client, Error> {
        let existing = self.inner.clients.lock()[i].clone();
        if let Some(c) = existing.as_ref().filter(|c| c.is_connected()) {
            return Ok(c.clone());
        }
        let gate = &self.inner.gates[i];
        let _one_attempt = gate.attempt.lock().await;
        let existing = self.inner.clients.lock()[i].clone();
        if let Some(c) = existing.as_ref().filter(|c| c.is_connected()) {
            return Ok(c.clone());
        }
        let addr = &self.inner.controllers[i];
        gate.begin().map_err(|wait| {
            Error::Connection(format!("registry controller {addr} unreachable; next attempt in {wait:?}"))
        })?;
        self.inner.reconnects.fetch_add(1, Relaxed);
        let client = match existing {
            Some(c) => c.connect_now().await.map(|()| c),
            None => Client::connect_with(addr, self.inner.config.clone()).await,
        }?;
        gate.succeeded();
        tracing::debug!(controller = %addr, "connected to the registry controller");
        self.inner.sent.fetch_add(1, Relaxed);
        if claim(&client, self.inner.client_id).await {
            self.inner.received.fetch_add(1, Relaxed);
        }
        Ok(self.inner.clients.lock()[i].get_or_insert(client).clone())
    }

    /// Completes when the connection to the controller in use closes (at once if it is down):
    /// a server's keeper renews as soon as it can reach a controller again.
    pub(crate) async fn connection_lost(&self) {
        let current = self.inner.current.load(Relaxed);
        let client = self.inner.clients.lock()[current].clone();
        if let Some(c) = client {
            c.disconnected().await;
        }
    }

    /// How long until the controller in use may be dialled again (zero: now).
    pub(crate) fn reconnect_wait(&self) -> Duration {
        self.inner.gates[self.inner.current.load(Relaxed)].wait()
    }

    /// Calls the controller in use; if it cannot be reached, or its connection fails or the
    /// call times out and `repeatable` allows sending the request again, the next controller of
    /// the list (each is tried once per call).
    async fn call<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        timeout: Option<Duration>,
        repeatable: bool,
    ) -> Result<Resp, Error> {
        let n = self.inner.controllers.len();
        if n == 1 {
            // One controller: nothing to fail over to, and no clone of the request.
            let client = self.connected(0).await?;
            return self.call_one(&client, m, req, timeout).await;
        }
        let start = self.inner.current.load(Relaxed);
        let mut last_err = None;
        for k in 0..n {
            let i = (start + k) % n;
            if k > 0 {
                let (from, to) = (&self.inner.controllers[(i + n - 1) % n], &self.inner.controllers[i]);
                tracing::warn!(from = %from, to = %to, error = %last_err.as_ref().expect("set"), "registry controller unreachable; failing over");
                self.inner.failovers.fetch_add(1, Relaxed);
            }
            // Connected before anything is sent: a failure here sent nothing, so any call may
            // move on.
            let client = match self.connected(i).await {
                Ok(c) => c,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let r = self.call_one(&client, m, req.clone(), timeout).await;
            match r {
                Err(e @ (Error::Connection(_) | Error::Closed | Error::Timeout(_))) if repeatable => {
                    last_err = Some(e);
                    continue;
                }
                // A controller going away never ran the call: any call moves on.
                Err(e @ Error::NotRun(_)) => {
                    last_err = Some(e);
                    continue;
                }
                _ => {}
            }
            if k > 0 {
                self.inner.current.store(i, Relaxed);
            }
            return r;
        }
        Err(last_err.expect("every controller was tried"))
    }

    async fn call_one<Req: Wire, Resp: Wire>(
        &self,
        client: &Client,
        m: &Method<Req, Resp>,
        req: Req,
        timeout: Option<Duration>,
    ) -> Result<Resp, Error> {
        self.inner.sent.fetch_add(1, Relaxed);
        let opts = CallOptions { timeout, idempotent: false, deadline: None };
        let call = client.call_with(m, req, opts);
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
        self.call(&RESOLVE, service.to_string(), None, true).await
    }

    /// One long poll (see [`WATCH`]).
    pub async fn watch(&self, req: WatchRequest) -> Result<Resolved, Error> {
        self.inner.watches.fetch_add(1, Relaxed);
        let t = Duration::from_millis(req.timeout_ms) + MARGIN;
        self.call(&WATCH, req, Some(t), true).await
    }

    /// Every service and instance.
    pub async fn list(&self) -> Result<Listing, Error> {
        self.call(&LIST, (), None, true).await
    }

    /// What the controller requires of its callers (a registration credential, a token).
    /// Controllers older than this call answer with `UnknownMethod`.
    pub async fn info(&self) -> Result<ControllerInfo, Error> {
        self.call(&INFO, (), None, true).await
    }

    /// A fresh client id (for clients that connect to servers without a `Registry` of their
    /// own).
    pub async fn alloc_client_id(&self) -> Result<u32, Error> {
        self.call(&ALLOC_CLIENT_ID, (), None, true).await
    }

    pub(crate) async fn register_raw(
        &self,
        mut req: RegisterRequest,
        timeout: Duration,
    ) -> Result<Registered, Error> {
        if req.credential.is_empty() {
            req.credential = self.credential();
        }
        self.call(&REGISTER, req, Some(timeout), true).await.map_err(unauthenticated)
    }

    pub(crate) async fn renew(&self, lease: u64, timeout: Duration) -> Result<Renewed, Error> {
        let req = LeaseRequest { lease, credential: self.credential() };
        self.call(&RENEW, req, Some(timeout), true).await.map_err(unauthenticated)
    }

    pub(crate) async fn deregister(&self, lease: u64, timeout: Duration) -> Result<u32, Error> {
        let req = LeaseRequest { lease, credential: self.credential() };
        self.call(&DEREGISTER, req, Some(timeout), true).await.map_err(unauthenticated)
    }

    /// Relayed mode: the controller forwards the call and relays the outcome.
    pub(crate) async fn relay(&self, req: RelayRequest, timeout: Duration) -> Result<RelayReply, Error> {
        let repeatable = req.idempotent;
        self.call(&RELAY, req, Some(timeout + MARGIN), repeatable).await
    }
}

/// Holds `id` for this client on `client`'s connection; returns whether the controller
/// answered. A controller older than this call answers `UnknownMethod`, which is fine: it
/// never released ids on its own.
async fn claim(client: &Client, id: u32) -> bool {
    let opts = CallOptions::default().timeout(Duration::from_secs(5));
    match client.call_with(&CLAIM_CLIENT_ID, id, opts).await {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(id, error = %e, "the controller did not take the client id's claim");
            matches!(e, Error::Remote(_))
        }
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
            let current = self.current.load(Relaxed);
            let Some(client) = self.clients.lock()[current].clone() else { return };
            let id = self.client_id;
            rt.spawn(async move {
                let opts = CallOptions::default().timeout(Duration::from_secs(1));
                let _ = client.call_with(&RELEASE_CLIENT_ID, id, opts).await;
            });
        }
    }
}
