//! The controller: a Volley [`Server`] that serves the registry protocol (service
//! `volley.registry`) over a [`Store`], expires leases, and relays calls in relayed mode.
//!
//! Run it embedded (the default: [`embedded`](super::embedded) starts one on
//! [`DEFAULT_REGISTRY`](crate::discovery::DEFAULT_REGISTRY) the first time something in the process needs
//! it) or standalone (`volley controller --listen ADDR`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::bounds::{HeldWatches, RelaysInFlight, json_len};
use super::client_ids::{self, Holders};
use super::relay::Relay;
use super::store::{MemoryStore, Store, StoreError, StoreLimits, StoreStatus, status};
use crate::balance::Balance;
use crate::client::ClientConfig;
use crate::discovery::wire::*;
use crate::error::{Error, Status};
use crate::metrics::scrape::{InstanceRow, RegistryCounters, RegistryScrape, RegistrySource, ServiceRow};
use crate::metrics::stats::Snapshot;
use crate::proto::Code;
use crate::server::Server;
use crate::transport::Address;
use futures_util::future::BoxFuture;

/// Controller settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[derive(derive_setters::Setters)]
pub struct ControllerConfig {
    /// How often lapsed leases are looked for (lease expiry is this precise).
    pub expiry_tick: Duration,
    /// Bounds on the lease time a server may ask for.
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// Longest a watch may be held before it is answered unchanged.
    pub max_watch: Duration,
    /// After a start over a store that is not durable, how long the controller reports that
    /// it is *settling* (servers are registering again). Should be at least the lease time
    /// servers use, so every live server has renewed — and found its lease gone — by then.
    pub settle: Duration,
    /// Balancing policy of relayed calls.
    pub relay_balance: Balance,
    /// Connections from the relay to instances (timeouts; the client id is allocated).
    pub relay_client: ClientConfig,
    /// When set, `register`, `renew` and `deregister` are refused (`Code::Unauthenticated`)
    /// unless they carry this credential, so no one without it can register an instance under
    /// a service name or remove someone else's. Separate from the call tokens.
    #[setters(strip_option, into)]
    pub registration_credential: Option<String>,
    /// Tokens a connection to the controller must present (as any Volley server's
    /// [`ServerBuilder::token`](crate::ServerBuilder::token)). Empty: none.
    pub tokens: Vec<Vec<u8>>,
    /// Where to serve the admin endpoint (as [`ServerBuilder::admin`](crate::ServerBuilder::admin)):
    /// its status page lists the services, their instances and leases. `None`: no endpoint.
    #[setters(strip_option, into)]
    pub admin: Option<String>,
    /// Most watches held at once, over all connections. A watch beyond it (or beyond
    /// `max_watches_per_connection`) is answered at once with the service's current state, as
    /// if its timeout had passed; the client polls again after a pause. Default 16,384.
    pub max_watches: usize,
    /// Most watches one connection may have held at once. Default 1,024 (a client holds one
    /// per service it calls).
    pub max_watches_per_connection: usize,
    /// Most relayed calls in flight at once; a relayed call beyond it is refused
    /// (`Code::Overloaded`). Default 16,384.
    pub max_relays: usize,
    /// The server's bound on queued requests for every other method (registrations,
    /// renewals, look-ups). Held watches and relayed calls have their own bounds above and do
    /// not count against it, so they can never leave a lease renewal without room. Default
    /// 50,000 (a server's default).
    pub max_queued: usize,
    /// Most bytes of one instance's registration, as JSON (its addresses, host id and
    /// metadata). Default 64 KiB.
    pub max_instance_bytes: usize,
    /// Most instances one lease may hold, and the bytes the instances of one service may take
    /// (so that a `resolve` reply always fits in a frame). Applies to the [`MemoryStore`] the
    /// controller makes ([`Controller::new`]); a store given to
    /// [`with_store`](Controller::with_store) keeps its own.
    pub store_limits: StoreLimits,
    /// Most bytes of a `list` reply's services, as JSON; services beyond it (the last by name)
    /// are left out and counted in its `omitted`. Default 8 MiB (the frame limit is 16 MiB).
    pub max_list_bytes: usize,
    /// How long a service with no instance left is still known (`resolve` says `known`, `list`
    /// names it) before the controller forgets it. Default 60 s.
    pub forget_after: Duration,
    /// Most requests one connection's turn takes before the server serves its other
    /// connections (the server's [`max_batch`](crate::ServerBuilder::max_batch)). Registry
    /// calls are small and answered at once, so a short turn costs little, and a caller's
    /// look-up waits behind at most this many requests of each other busy connection (a flood
    /// of watches answered at once included). Default 64 (a server's default is 1,000).
    pub max_turn: usize,
    /// An adaptive bound on the requests handled at once (as
    /// [`ServerBuilder::concurrency_limit`](crate::ServerBuilder::concurrency_limit)); held
    /// watches are outside it. `None` (the default): no limit.
    pub concurrency_limit: Option<crate::ConcurrencyLimit>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            expiry_tick: Duration::from_millis(100),
            min_ttl: Duration::from_millis(50),
            max_ttl: Duration::from_secs(300),
            max_watch: Duration::from_secs(60),
            settle: crate::discovery::DEFAULT_TTL,
            relay_balance: Balance::LeastOutstanding,
            relay_client: ClientConfig::default(),
            registration_credential: None,
            tokens: Vec::new(),
            admin: None,
            max_watches: 16_384,
            max_watches_per_connection: 1_024,
            max_relays: 16_384,
            max_queued: 50_000,
            max_instance_bytes: 64 << 10,
            store_limits: StoreLimits::default(),
            max_list_bytes: 8 << 20,
            forget_after: Duration::from_secs(60),
            max_turn: 64,
            concurrency_limit: None,
        }
    }
}

/// Counters of a controller, readable at runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ControllerStats {
    /// The registry server's connections (all clients and servers together).
    pub server: Snapshot,
    /// The relay's connections to instances.
    pub relay: Snapshot,
    pub resolves: u64,
    pub watches: u64,
    pub relayed_calls: u64,
    pub relay_failovers: u64,
    /// Of the relay's failovers, calls its instance never ran (going away), sent again.
    pub relay_resent_unrun: u64,
    /// The store's backend: reachable or not, outages, errors, re-reads.
    pub store: StoreStatus,
    /// Client ids held by open connections to this controller (each is given back when the
    /// last connection holding it closes).
    pub client_ids_held: u64,
    /// Lease renewals accepted.
    pub lease_renewals: u64,
    /// Instances removed because their lease lapsed unrenewed.
    pub expired_instances: u64,
    /// Watches answered with a change (a new revision or epoch), not a timeout.
    pub watch_events: u64,
    /// Watches held now.
    pub watches_held: u64,
    /// Watches answered at once because `max_watches` or `max_watches_per_connection` were
    /// held.
    pub watches_not_held: u64,
    /// Relayed calls refused because `max_relays` were in flight.
    pub relays_refused: u64,
    /// Services forgotten after having no instance for `forget_after`.
    pub services_forgotten: u64,
}

/// A running controller. Cheap to clone.
#[derive(Clone)]
pub struct Controller {
    server: Server,
    state: Arc<State>,
}

struct State {
    store: Arc<dyn Store>,
    epoch: u64,
    started: Instant,
    config: ControllerConfig,
    stop: CancellationToken,
    expiry_started: AtomicBool,
    resolves: AtomicU64,
    watches: AtomicU64,
    renewals: AtomicU64,
    expired: AtomicU64,
    watch_events: AtomicU64,
    held: HeldWatches,
    not_held: AtomicU64,
    relays: RelaysInFlight,
    relays_refused: AtomicU64,
    forgotten: AtomicU64,
    /// Which connections hold which client ids (an id is given back when they close).
    holders: Arc<Holders>,
    relay: Relay,
}

impl Controller {
    /// A controller over a fresh [`MemoryStore`]. Call [`listen`](Self::listen) to serve.
    pub fn new(config: ControllerConfig) -> Controller {
        Controller::with_store(Arc::new(MemoryStore::new().with_limits(config.store_limits)), config)
    }

    /// A controller over the given store.
    pub fn with_store(store: Arc<dyn Store>, config: ControllerConfig) -> Controller {
        let rev = store.subscribe();
        let state = Arc::new(State {
            epoch: store.epoch().unwrap_or_else(|| fastrand::u64(1..)),
            started: Instant::now(),
            stop: CancellationToken::new(),
            expiry_started: AtomicBool::new(false),
            resolves: AtomicU64::new(0),
            watches: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            watch_events: AtomicU64::new(0),
            held: HeldWatches::new(config.max_watches, config.max_watches_per_connection),
            not_held: AtomicU64::new(0),
            relays: RelaysInFlight::new(config.max_relays),
            relays_refused: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            holders: Arc::default(),
            relay: Relay::new(config.relay_balance, config.relay_client.clone(), rev),
            store,
            config,
        });
        let server = build_server(&state);
        server.show_registry(Arc::new(Arc::downgrade(&state)));
        Controller { server, state }
    }

    /// Starts serving on `addr` (any Volley address); returns the address bound.
    pub async fn listen(&self, addr: &str) -> Result<Address, Error> {
        let bound = self.server.listen(addr).await?;
        if !self.state.expiry_started.swap(true, Relaxed) {
            let st = self.state.clone();
            self.server.spawn_tracked(async move { st.expire_loop().await });
        }
        Ok(bound)
    }

    /// Stops: answers pending watches at once, finishes what is in flight, closes. Servers keep
    /// their registrations in their own memory and register again with the next controller.
    pub async fn shutdown(&self) {
        self.state.stop.cancel();
        self.server.shutdown().await;
        self.state.relay.clear();
    }

    /// Whether the controller is serving (not shut down).
    pub fn is_serving(&self) -> bool {
        !self.state.stop.is_cancelled()
    }

    /// Changes whenever a controller starts over a store that is not durable; the same for
    /// every controller over one shared store.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    pub fn addresses(&self) -> Vec<Address> {
        self.server.addresses()
    }

    /// The address of the admin endpoint, once the first `listen` started it.
    pub fn admin_address(&self) -> Option<std::net::SocketAddr> {
        self.server.admin_address()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.state.store
    }

    pub fn stats(&self) -> ControllerStats {
        self.state.stats(self.server.counters())
    }
}

impl State {
    fn stats(&self, server: Snapshot) -> ControllerStats {
        let relay = &self.relay;
        ControllerStats {
            server,
            relay: relay.transport(),
            resolves: self.resolves.load(Relaxed),
            watches: self.watches.load(Relaxed),
            relayed_calls: relay.calls(),
            relay_failovers: relay.failovers(),
            relay_resent_unrun: relay.resent_unrun(),
            store: self.store.status(),
            client_ids_held: self.holders.held() as u64,
            lease_renewals: self.renewals.load(Relaxed),
            expired_instances: self.expired.load(Relaxed),
            watch_events: self.watch_events.load(Relaxed),
            watches_held: self.held.held() as u64,
            watches_not_held: self.not_held.load(Relaxed),
            relays_refused: self.relays_refused.load(Relaxed),
            services_forgotten: self.forgotten.load(Relaxed),
        }
    }
}

/// The registry as the admin endpoint shows it, held weakly: the endpoint belongs to the
/// server, which must not keep the controller's state alive.
impl RegistrySource for std::sync::Weak<State> {
    fn registry(&self, server: Snapshot) -> BoxFuture<'_, Option<RegistryScrape>> {
        Box::pin(async move {
            let st = self.upgrade()?;
            let services = st.store.list().await.unwrap_or_default();
            let stats = st.stats(server);
            Some(RegistryScrape {
                services: services.into_iter().map(row).collect(),
                stats: serde_json::to_value(stats).unwrap_or_default(),
                counters: RegistryCounters {
                    lease_renewals: stats.lease_renewals,
                    expired_instances: stats.expired_instances,
                    watch_events: stats.watch_events,
                    resolves: stats.resolves,
                    relayed_calls: stats.relayed_calls,
                    client_ids_held: stats.client_ids_held,
                },
            })
        })
    }
}

/// A service as the admin endpoint lists it.
fn row(s: ServiceListing) -> ServiceRow {
    let instances = s
        .instances
        .into_iter()
        .map(|li| {
            let i = li.instance;
            InstanceRow {
                id: i.id,
                lease: i.lease,
                service: i.service,
                address: i.address,
                weight: i.weight,
                metadata: i.metadata,
                lease_ttl_ms: li.lease_ttl_ms,
                expires_in_ms: li.expires_in_ms,
            }
        })
        .collect();
    ServiceRow { name: s.name, revision: s.revision, instances }
}

fn build_server(st: &Arc<State>) -> Server {
    macro_rules! with_state {
        ($f:expr) => {{
            let st = st.clone();
            move |req| {
                let st = st.clone();
                async move { $f(st, req).await }
            }
        }};
    }
    // Held watches and relays have bounds of their own; the rest keeps `max_queued` whatever
    // they hold.
    let c = &st.config;
    let mut builder = Server::builder()
        .max_queued(c.max_queued.saturating_add(c.max_watches).saturating_add(c.max_relays))
        .max_batch(c.max_turn.max(1));
    for t in &st.config.tokens {
        builder = builder.token(t);
    }
    if let Some(addr) = &st.config.admin {
        builder = builder.admin(addr.clone());
    }
    if let Some(limit) = c.concurrency_limit {
        builder = builder.concurrency_limit(limit);
    }
    builder
        .handle(&REGISTER, with_state!(register))
        .handle(&RENEW, with_state!(renew))
        .handle(&DEREGISTER, with_state!(deregister))
        .handle(&RESOLVE, with_state!(resolve))
        // Each watch on its own: one that is answered at once must not wait for the held ones
        // that arrived with it.
        .handle_each(&WATCH, with_state!(watch_service))
        .handle(&ALLOC_CLIENT_ID, with_state!(alloc_client_id))
        .handle(&RELEASE_CLIENT_ID, with_state!(release_client_id))
        .handle(&CLAIM_CLIENT_ID, with_state!(claim_client_id))
        .handle(&INFO, with_state!(info))
        .handle(&LIST, with_state!(list))
        .handle(&RELAY, with_state!(relay))
        .build()
}

/// Services forgotten from which the controller hands freed memory back to the system at
/// once, mid-flood: a flood of short-lived names (hundreds of thousands) otherwise leaves the
/// process at its peak size for good.
const GIVE_BACK_AFTER: usize = 1_024;

/// Fewer services forgotten are handed back once a sweep forgets none (the flood, or the
/// trickle, is over), at most this often: a trim walks the whole heap.
const GIVE_BACK_EVERY: Duration = Duration::from_secs(1);

/// When the expiry loop hands freed memory back: after every `GIVE_BACK_AFTER` services
/// forgotten, and after the last sweep of a wave of them (the memory of the wave's tail would
/// otherwise stay until the next wave).
#[derive(Debug, Default)]
struct GiveBack {
    forgotten: usize,
    last: Option<Instant>,
}

impl GiveBack {
    /// A sweep forgot `n` services at `now`; returns whether to hand memory back now.
    fn swept(&mut self, n: usize, now: Instant) -> bool {
        self.forgotten += n;
        let due = self.forgotten >= GIVE_BACK_AFTER
            || (n == 0
                && self.forgotten > 0
                && self.last.is_none_or(|t| now.saturating_duration_since(t) >= GIVE_BACK_EVERY));
        if due {
            self.forgotten = 0;
            self.last = Some(now);
        }
        due
    }
}

/// Returns the allocator's free memory to the system. glibc keeps freed memory of the main
/// heap for reuse: after 320,000 lapsed names were forgotten the controller stayed at 73 MiB
/// (8 MiB idle) until `malloc_trim`, which took it to 17 MiB. Other allocators return it by
/// themselves.
fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl State {
    fn settling(&self) -> bool {
        !self.store.durable() && self.started.elapsed() < self.config.settle
    }

    async fn resolved(&self, service: &str) -> Result<Resolved, Status> {
        let s = self.store.resolve(service).await.map_err(status)?;
        Ok(Resolved {
            service: service.to_string(),
            epoch: self.epoch,
            revision: s.revision,
            known: s.known,
            settling: self.settling(),
            instances: s.instances,
        })
    }

    async fn expire_loop(&self) {
        let mut give_back = GiveBack::default();
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(self.config.expiry_tick) => {}
            }
            match self.store.expire().await {
                Ok(n) => _ = self.expired.fetch_add(n as u64, Relaxed),
                Err(e) => tracing::warn!(error = %e, "lease expiry failed"),
            }
            let gone = match self.store.forget(self.config.forget_after).await {
                Ok(gone) => gone,
                Err(e) => {
                    tracing::warn!(error = %e, "forgetting empty services failed");
                    Vec::new()
                }
            };
            if !gone.is_empty() {
                tracing::debug!(services = gone.len(), "forgot services with no instance left");
                self.forgotten.fetch_add(gone.len() as u64, Relaxed);
                self.relay.forget(&gone);
            }
            if give_back.swept(gone.len(), Instant::now()) {
                give_back_memory();
            }
        }
    }

    /// Reserves `id` in the store (a client from an earlier life of the controller keeps its id)
    /// and holds it for `connection`.
    async fn claim(&self, id: u32, connection: Option<crate::server::ConnectionScope>) {
        let _ = self.store.claim_client_id(id).await;
        client_ids::hold(&self.holders, &self.store, &self.stop, id, connection);
    }

    fn ttl(&self, ttl_ms: u64) -> Duration {
        Duration::from_millis(ttl_ms).clamp(self.config.min_ttl, self.config.max_ttl)
    }
}

/// Refuses a registry change without the registration credential (when one is configured).
/// Runs before the handler's first await, so the peer's address is known for the log.
fn check_credential(
    st: &State,
    presented: &str,
    what: &str,
    detail: &dyn std::fmt::Debug,
) -> Result<(), Status> {
    use subtle::ConstantTimeEq;
    let Some(expected) = &st.config.registration_credential else { return Ok(()) };
    if bool::from(expected.as_bytes().ct_eq(presented.as_bytes())) {
        return Ok(());
    }
    let peer = crate::server::current_peer();
    let peer = peer.as_deref().unwrap_or("unknown peer");
    let why =
        if presented.is_empty() { "no registration credential" } else { "wrong registration credential" };
    tracing::warn!(%peer, what, ?detail, "refused: {why}");
    Err(Status::new(Code::Unauthenticated, format!("{what} refused: {why}")))
}

async fn register(st: Arc<State>, r: RegisterRequest) -> Result<Registered, Status> {
    let instances: Vec<_> = r.instances.iter().map(|i| format!("{}@{}", i.service, i.address)).collect();
    check_credential(&st, &r.credential, "register", &instances)?;
    check_size(&st, &r)?;
    let (lease, ttl) = if r.lease == 0 {
        let ttl = st.ttl(r.ttl_ms);
        (st.store.grant(ttl).await.map_err(status)?, ttl)
    } else {
        (r.lease, st.store.renew(r.lease).await.map_err(status)?.ttl)
    };
    match st.store.register(lease, &r.instances).await {
        Ok(instance_ids) => {
            tracing::info!(lease, instances = ?r.instances.iter().map(|i| format!("{}@{}", i.service, i.address)).collect::<Vec<_>>(), "registered");
            Ok(Registered { lease, ttl_ms: ttl.as_millis() as u64, instance_ids, epoch: st.epoch })
        }
        Err(e) => {
            if r.lease == 0 {
                let _ = st.store.revoke(lease).await;
            }
            Err(status(e))
        }
    }
}

/// Refuses what no store should take: more instances than a lease may hold, or an instance
/// larger than `max_instance_bytes` (checked before anything is granted).
fn check_size(st: &State, r: &RegisterRequest) -> Result<(), Status> {
    let max = st.config.store_limits.max_instances_per_lease;
    if r.instances.len() > max {
        return Err(Status::new(
            Code::TooLarge,
            format!(
                "register refused: {} instances in one registration (at most {max} per lease)",
                r.instances.len()
            ),
        ));
    }
    for i in &r.instances {
        i.check().map_err(|why| Status::new(Code::BadRequest, format!("register refused: {why}")))?;
        let bytes = json_len(i);
        if bytes > st.config.max_instance_bytes {
            let metadata: usize = i.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
            let service: String = i.service.chars().take(64).collect();
            return Err(Status::new(
                Code::TooLarge,
                format!(
                    "register refused: an instance of {service:?} of {bytes} bytes (metadata {metadata} bytes); at most {} bytes per instance",
                    st.config.max_instance_bytes
                ),
            ));
        }
    }
    Ok(())
}

async fn renew(st: Arc<State>, r: LeaseRequest) -> Result<Renewed, Status> {
    check_credential(&st, &r.credential, "renew", &r.lease)?;
    let lease = r.lease;
    match st.store.renew(lease).await {
        Ok(r) if r.intact => {
            st.renewals.fetch_add(1, Relaxed);
            Ok(Renewed { known: true, ttl_ms: r.ttl.as_millis() as u64 })
        }
        // Another registration took one of the lease's instances (and may have lapsed with
        // it): `known = false` makes the server register again at once — a reply every server,
        // old or new, already acts on. The lease itself lapses unrenewed, holding nothing.
        Ok(_) => {
            tracing::info!(
                lease,
                "an instance of this lease was registered under another lease; asking its server to register again"
            );
            Ok(Renewed { known: false, ttl_ms: 0 })
        }
        Err(StoreError::UnknownLease(_)) => Ok(Renewed { known: false, ttl_ms: 0 }),
        Err(e) => Err(status(e)),
    }
}

async fn deregister(st: Arc<State>, r: LeaseRequest) -> Result<u32, Status> {
    check_credential(&st, &r.credential, "deregister", &r.lease)?;
    let lease = r.lease;
    match st.store.revoke(lease).await {
        Ok(n) => {
            tracing::info!(lease, instances = n, "deregistered");
            Ok(n as u32)
        }
        Err(StoreError::UnknownLease(_)) => Ok(0),
        Err(e) => Err(status(e)),
    }
}

async fn resolve(st: Arc<State>, service: String) -> Result<Resolved, Status> {
    st.resolves.fetch_add(1, Relaxed);
    st.resolved(&service).await
}

/// The long poll: answers as soon as the service changes after the caller's revision (or at
/// once if the caller's revision is from another epoch), else at the timeout. While settling,
/// it answers no later than the moment settling ends, so clients learn the settled list.
///
/// Watches are held up to `max_watches` in all and `max_watches_per_connection` per
/// connection; beyond either, the watch is answered at once with the current state (and the
/// client polls again after a pause), so held watches never crowd out other calls.
async fn watch_service(st: Arc<State>, w: WatchRequest) -> Result<Resolved, Status> {
    st.watches.fetch_add(1, Relaxed);
    let connection = crate::server::current_connection();
    let connection_id = connection.as_ref().map(|c| c.id);
    if w.client_id != 0 {
        st.claim(w.client_id, connection).await;
    }
    // Subscribe before reading, so a change between the read and the wait is not missed.
    let mut changes: watch::Receiver<u64> = st.store.subscribe();
    let mut deadline = Instant::now() + Duration::from_millis(w.timeout_ms).min(st.config.max_watch);
    if st.settling() {
        deadline = deadline.min(st.started + st.config.settle);
    }
    let mut slot = None;
    loop {
        let r = st.resolved(&w.service).await?;
        if w.epoch != st.epoch || r.revision > w.from_revision {
            st.watch_events.fetch_add(1, Relaxed);
            return Ok(r);
        }
        if slot.is_none() {
            slot = st.held.hold(connection_id);
            if slot.is_none() {
                st.not_held.fetch_add(1, Relaxed);
                return Ok(r);
            }
        }
        tokio::select! {
            biased;
            _ = st.stop.cancelled() => return Ok(r),
            changed = changes.changed() => if changed.is_err() { return Ok(r) },
            _ = tokio::time::sleep_until(deadline) => return st.resolved(&w.service).await,
        }
    }
}

/// The id is held by the connection that asked (read before the first await, while the
/// server still knows whose request this is) until it closes.
async fn alloc_client_id(st: Arc<State>, _: ()) -> Result<u32, Status> {
    let connection = crate::server::current_connection();
    let id = st.store.alloc_client_id().await.map_err(status)?;
    client_ids::hold(&st.holders, &st.store, &st.stop, id, connection);
    Ok(id)
}

/// Only a connection that holds the id (or anyone, for an id no connection holds) gives it
/// back; others are answered `false`.
async fn release_client_id(st: Arc<State>, id: u32) -> Result<bool, Status> {
    let connection = crate::server::current_connection().map(|c| c.id);
    if !st.holders.may_release(id, connection) {
        tracing::warn!(id, "refused to release a client id held by another connection");
        return Ok(false);
    }
    st.holders.forget(id);
    st.store.release_client_id(id).await.map_err(status)
}

async fn claim_client_id(st: Arc<State>, id: u32) -> Result<(), Status> {
    if id == 0 {
        return Err(Status::new(Code::BadRequest, "client id 0 is never allocated"));
    }
    st.claim(id, crate::server::current_connection()).await;
    Ok(())
}

async fn info(st: Arc<State>, _: ()) -> Result<ControllerInfo, Status> {
    Ok(ControllerInfo {
        registration_credential: st.config.registration_credential.is_some(),
        token: !st.config.tokens.is_empty(),
        durable: st.store.durable(),
    })
}

/// Every service, in name order, up to `max_list_bytes` of them (the rest counted in
/// `omitted`), so the reply fits in a frame however many services there are.
async fn list(st: Arc<State>, _: ()) -> Result<Listing, Status> {
    let mut services = st.store.list().await.map_err(status)?;
    let mut bytes = 0;
    let fit = services
        .iter()
        .position(|s| {
            bytes += json_len(s) + 1;
            bytes > st.config.max_list_bytes
        })
        .unwrap_or(services.len());
    let omitted = (services.len() - fit) as u64;
    services.truncate(fit);
    Ok(Listing {
        epoch: st.epoch,
        revision: *st.store.subscribe().borrow(),
        settling: st.settling(),
        services,
        omitted,
    })
}

/// Forwards a relayed call, unless it is addressed to the registry service itself (a relay
/// to a controller's own relay would nest without end, each level holding a call) or
/// `max_relays` calls are in flight.
async fn relay(st: Arc<State>, r: RelayRequest) -> Result<RelayReply, Status> {
    if r.service == SERVICE {
        return Err(Status::new(
            Code::BadRequest,
            format!("relay refused: the service {SERVICE} is not relayed (call the registry directly)"),
        ));
    }
    let Some(_slot) = st.relays.start() else {
        st.relays_refused.fetch_add(1, Relaxed);
        return Err(Status::new(
            Code::Overloaded,
            format!("relay refused: the controller is relaying its bound of {} calls", st.relays.max()),
        ));
    };
    Ok(st.relay.forward(&*st.store, st.epoch, r).await.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_given_back_mid_flood_and_after_the_last_sweep_of_a_wave() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut g = GiveBack::default();
        assert!(!g.swept(0, at(0)), "nothing forgotten, nothing to give back");
        assert!(!g.swept(1_000, at(100)), "mid-wave, under the count");
        assert!(g.swept(100, at(200)), "the count reached");
        assert!(!g.swept(500, at(300)));
        assert!(g.swept(0, at(1_300)), "the wave's tail, once a sweep forgets none");
        assert!(!g.swept(0, at(1_400)), "nothing new since");
        assert!(!g.swept(3, at(1_500)));
        assert!(!g.swept(0, at(1_600)), "a trickle is handed back at most once a second");
        assert!(g.swept(0, at(2_300)));
    }
}
