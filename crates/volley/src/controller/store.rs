//! Where the controller keeps its state: the [`Store`] trait, and [`MemoryStore`], the
//! in-memory backend used by the embedded and the standalone controller.
//!
//! The trait is asynchronous and object-safe so that a backend over a remote store (the
//! `volley-etcd` crate's, over etcd) plugs in without touching the controller: leases, instances by service with a
//! revision per change, a change signal for watches, and the client-id allocator.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::RangeInclusive;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::bounds::json_len;
use super::shrink::Shrink;
use crate::discovery::wire::{Instance, InstanceSpec, ListedInstance, ServiceListing};
use crate::error::Status;
use crate::proto::Code;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The lease lapsed or was never granted (or the store restarted).
    #[error("unknown lease {0}")]
    UnknownLease(u64),
    /// Every client id of the store's range is allocated.
    #[error("client ids exhausted: all {0} ids are allocated")]
    ClientIdsExhausted(u64),
    /// A registration the store refuses (empty service name, weight 0 ...).
    #[error("invalid registration: {0}")]
    Invalid(String),
    /// A registration over one of the store's size bounds (instances per lease, bytes per
    /// service); the message names the bound.
    #[error("registration too large: {0}")]
    TooLarge(String),
    /// The backend failed (for remote backends).
    #[error("store backend failed: {0}")]
    Backend(String),
}

/// What a renewal found: the lease time, and whether the lease still holds its instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// The lease's time, counted again from now.
    pub ttl: Duration,
    /// Whether every instance registered under the lease is still its own. False when a
    /// registration of the same service and address under another lease replaced one (and may
    /// since have lapsed with that lease, taking the instance with it): the server must
    /// register again, or its instance stays missing while it renews a lease that holds
    /// nothing.
    pub intact: bool,
}

/// The instances of one service at one revision, as the store holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceState {
    /// Store revision of the service's last change (0: never changed).
    pub revision: u64,
    /// Whether an instance of the service ever registered.
    pub known: bool,
    pub instances: Vec<Instance>,
}

/// The controller's state. Every mutation that changes what a service resolves to bumps the
/// store revision and publishes it on [`subscribe`](Store::subscribe).
pub trait Store: Send + Sync + 'static {
    /// A new lease that lapses `ttl` from now unless renewed.
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<u64, StoreError>>;
    /// Adds instances under `lease`; returns their ids. There is one instance per (service,
    /// address): an instance with the same service and address under another lease is replaced
    /// (a server that restarted before its old lease lapsed), and that lease is no longer
    /// [`intact`](Renewal::intact). A lease that lapses or is revoked removes only the instances
    /// it still holds.
    fn register<'a>(
        &'a self,
        lease: u64,
        specs: &'a [InstanceSpec],
    ) -> BoxFuture<'a, Result<Vec<u64>, StoreError>>;
    /// Extends `lease` by its ttl; says whether it still holds every instance registered under
    /// it.
    fn renew(&self, lease: u64) -> BoxFuture<'_, Result<Renewal, StoreError>>;
    /// Removes `lease` and its instances; returns how many instances went.
    fn revoke(&self, lease: u64) -> BoxFuture<'_, Result<usize, StoreError>>;
    /// Removes every lease whose time ran out, with its instances; returns how many instances
    /// went. Backends whose store expires leases itself return `Ok(0)`.
    fn expire(&self) -> BoxFuture<'_, Result<usize, StoreError>>;
    /// Forgets every service that has had no instance for `linger` or longer: `resolve` says
    /// it is unknown again and `list` leaves it out, so names registered once (or by a flood of
    /// short leases) do not stay forever. Returns the names forgotten. Backends that keep no
    /// empty services return none.
    fn forget(&self, linger: Duration) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let _ = linger;
        ready(Ok(Vec::new()))
    }
    fn resolve<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<ServiceState, StoreError>>;
    fn list(&self) -> BoxFuture<'_, Result<Vec<ServiceListing>, StoreError>>;
    /// A client id no other live client of this store holds.
    fn alloc_client_id(&self) -> BoxFuture<'_, Result<u32, StoreError>>;
    /// Gives an id back; returns whether it was allocated.
    fn release_client_id(&self, id: u32) -> BoxFuture<'_, Result<bool, StoreError>>;
    /// Marks `id` as held (a client that got it from an earlier life of the store), so it is
    /// not handed out again.
    fn claim_client_id(&self, id: u32) -> BoxFuture<'_, Result<(), StoreError>>;
    /// The store revision, updated on every change. Watches wait on it.
    fn subscribe(&self) -> watch::Receiver<u64>;
    /// Whether the state outlives the controller process. A controller over a store that is
    /// not durable tells clients it is *settling* for one lease time after it starts, while
    /// servers register again.
    fn durable(&self) -> bool {
        false
    }
    /// The epoch of this store's revisions, if it is shared: every controller over one etcd
    /// prefix reports the same one, so a client that moves between them keeps its place.
    /// `None`: each controller picks a random epoch when it starts.
    fn epoch(&self) -> Option<u64> {
        None
    }
    /// How the backend is doing (a remote store may be unreachable while the controller keeps
    /// answering from its last good state).
    fn status(&self) -> StoreStatus {
        StoreStatus::default()
    }
}

/// The health of a [`Store`]'s backend, readable at runtime (part of
/// [`ControllerStats`](super::ControllerStats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreStatus {
    /// Whether the backend answers now. While it does not, the controller answers look-ups
    /// and watches from the last state it read, and registrations fail.
    pub reachable: bool,
    /// Times the backend became unreachable.
    pub outages: u64,
    /// Backend operations that failed.
    pub errors: u64,
    /// Times the whole state was read again (after a start, a reconnect that could not resume,
    /// or a compacted watch revision).
    pub relists: u64,
}

impl Default for StoreStatus {
    fn default() -> Self {
        StoreStatus { reachable: true, outages: 0, errors: 0, relists: 0 }
    }
}

/// The in-memory store: everything lives in this process and is lost when it exits.
///
/// Client ids are handed out in order from a range, starting at a random point (so a
/// restarted controller is unlikely to hand out ids that clients of its previous life still
/// hold; clients also re-claim their ids with their watches). Past the end of the range the
/// allocator wraps to its start and skips ids still allocated; when all are allocated it
/// fails with [`StoreError::ClientIdsExhausted`]. Ids of clients that vanish without
/// releasing stay allocated until the store is dropped.
pub struct MemoryStore {
    state: Mutex<Mem>,
    revision: watch::Sender<u64>,
    limits: StoreLimits,
}

/// The sizes a [`MemoryStore`] refuses registrations beyond ([`StoreError::TooLarge`]), so
/// that one registrant cannot make a service's list too large to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLimits {
    /// Most instances one lease may hold. Default 256.
    pub max_instances_per_lease: usize,
    /// Most bytes the instances of one service may take, as the JSON a `resolve` reply
    /// carries them in. Default 8 MiB: a `resolve` reply then stays well within the 16 MiB
    /// frame limit.
    pub max_service_bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { max_instances_per_lease: 256, max_service_bytes: 8 << 20 }
    }
}

struct Mem {
    revision: u64,
    next_lease: u64,
    next_instance: u64,
    leases: HashMap<u64, Lease>,
    services: BTreeMap<String, Svc>,
    ids: ClientIds,
}

struct Lease {
    ttl: Duration,
    deadline: Instant,
    /// (service, instance id) of each instance under the lease.
    instances: Vec<(String, u64)>,
    /// Another lease's registration replaced one of this lease's instances.
    lost: bool,
}

#[derive(Default)]
struct Svc {
    revision: u64,
    instances: BTreeMap<u64, Instance>,
    /// The instances' size as JSON.
    bytes: usize,
    /// Since when the service has had no instance (`None`: it has some).
    empty_since: Option<Instant>,
}

impl Svc {
    fn insert(&mut self, id: u64, instance: Instance) {
        self.bytes += json_len(&instance);
        if let Some(old) = self.instances.insert(id, instance) {
            self.bytes -= json_len(&old);
        }
        self.empty_since = None;
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(old) = self.instances.remove(&id) else { return false };
        self.bytes -= json_len(&old);
        if self.instances.is_empty() {
            self.empty_since = Some(Instant::now());
        }
        true
    }
}

struct ClientIds {
    range: RangeInclusive<u32>,
    next: u32,
    allocated: HashSet<u32>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// Client ids come from `1..=u32::MAX`, starting at a random point.
    pub fn new() -> MemoryStore {
        let range = 1..=u32::MAX;
        let start = fastrand::u32(range.clone());
        MemoryStore::build(range, start)
    }

    /// Client ids come from `range`, starting at its first id (tests of wrap-around and
    /// exhaustion; deployments that split the id space between registries).
    pub fn with_client_id_range(range: RangeInclusive<u32>) -> MemoryStore {
        assert!(!range.is_empty() && *range.start() > 0, "client id range must be non-empty and exclude 0");
        let start = *range.start();
        MemoryStore::build(range, start)
    }

    /// The same store with other size bounds.
    pub fn with_limits(mut self, limits: StoreLimits) -> MemoryStore {
        self.limits = limits;
        self
    }

    fn build(range: RangeInclusive<u32>, start: u32) -> MemoryStore {
        MemoryStore {
            limits: StoreLimits::default(),
            state: Mutex::new(Mem {
                revision: 0,
                // Lease and instance ids start at a random point: a server still holding a lease
                // id from an earlier life of the store must find it unknown (and register again),
                // not renew — or revoke — a lease this store granted to someone else.
                next_lease: fastrand::u64(1..1 << 62),
                next_instance: fastrand::u64(1..1 << 62),
                leases: HashMap::new(),
                services: BTreeMap::new(),
                ids: ClientIds { range, next: start, allocated: HashSet::new() },
            }),
            revision: watch::channel(0).0,
        }
    }

    /// Runs `f` on the state; publishes the revision if `f` changed it.
    fn with<R>(&self, f: impl FnOnce(&mut Mem) -> R) -> R {
        let mut st = self.state.lock();
        let before = st.revision;
        let r = f(&mut st);
        let after = st.revision;
        drop(st);
        if after != before {
            self.revision.send_replace(after);
        }
        r
    }
}

impl Mem {
    fn bump(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    /// Removes instances; bumps the revision once if any went.
    fn remove_instances(&mut self, list: &[(String, u64)]) -> usize {
        let mut removed = Vec::new();
        for (service, id) in list {
            if let Some(svc) = self.services.get_mut(service)
                && svc.remove(*id)
            {
                removed.push(service.clone());
            }
        }
        if !removed.is_empty() {
            let rev = self.bump();
            for s in &removed {
                self.services.get_mut(s).expect("just seen").revision = rev;
            }
        }
        removed.len()
    }
}

impl Mem {
    /// Refuses a registration of `specs` under `lease` that would pass `limits`: the lease's
    /// instance count, or a service's bytes (counting what the registration replaces).
    fn check_size(
        &self,
        lease: &Lease,
        specs: &[InstanceSpec],
        limits: StoreLimits,
    ) -> Result<(), StoreError> {
        let held = lease.instances.len();
        // New to the lease: neither registered under it already nor repeated in `specs`.
        let under_lease = |s: &InstanceSpec| {
            lease.instances.iter().any(|(service, id)| {
                *service == s.service
                    && self
                        .services
                        .get(service)
                        .and_then(|svc| svc.instances.get(id))
                        .is_some_and(|i| i.address == s.address)
            })
        };
        let new = specs
            .iter()
            .enumerate()
            .filter(|&(k, s)| {
                !specs[..k].iter().any(|p| p.service == s.service && p.address == s.address)
                    && !under_lease(s)
            })
            .count();
        if held + new > limits.max_instances_per_lease {
            return Err(StoreError::TooLarge(format!(
                "{} instances under one lease (it holds {held}, this adds {new}); at most {} per lease",
                held + new,
                limits.max_instances_per_lease
            )));
        }
        let mut added: BTreeMap<&str, usize> = BTreeMap::new();
        for (k, s) in specs.iter().enumerate() {
            // Repeated specs are one instance; the last one's size is the larger estimate's.
            if specs[k + 1..].iter().any(|p| p.service == s.service && p.address == s.address) {
                continue;
            }
            let size = json_len(&s.instance(u64::MAX, u64::MAX));
            *added.entry(&s.service).or_default() += size;
            // What the registration replaces (the same address) leaves the service.
            if let Some(svc) = self.services.get(&s.service) {
                for i in svc.instances.values().filter(|i| i.address == s.address) {
                    let e = added.get_mut(s.service.as_str()).expect("just added");
                    *e = e.saturating_sub(json_len(i));
                }
            }
        }
        for (service, add) in added {
            let now = self.services.get(service).map_or(0, |s| s.bytes);
            if now + add > limits.max_service_bytes {
                return Err(StoreError::TooLarge(format!(
                    "the instances of service {service:?} would take {} bytes (they take {now}); at most {} per service",
                    now + add,
                    limits.max_service_bytes
                )));
            }
        }
        Ok(())
    }
}

impl ClientIds {
    fn alloc(&mut self) -> Result<u32, StoreError> {
        let size = *self.range.end() as u64 - *self.range.start() as u64 + 1;
        if self.allocated.len() as u64 >= size {
            return Err(StoreError::ClientIdsExhausted(size));
        }
        loop {
            let id = self.next;
            self.next = if id == *self.range.end() { *self.range.start() } else { id + 1 };
            if self.allocated.insert(id) {
                return Ok(id);
            }
        }
    }
}

fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

impl Store for MemoryStore {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<u64, StoreError>> {
        ready(Ok(self.with(|st| {
            let id = st.next_lease;
            st.next_lease += 1;
            let deadline = Instant::now() + ttl;
            st.leases.insert(id, Lease { ttl, deadline, instances: Vec::new(), lost: false });
            id
        })))
    }

    fn register<'a>(
        &'a self,
        lease: u64,
        specs: &'a [InstanceSpec],
    ) -> BoxFuture<'a, Result<Vec<u64>, StoreError>> {
        if let Some(why) = specs.iter().find_map(|s| s.check().err()) {
            return ready(Err(StoreError::Invalid(why)));
        }
        let limits = self.limits;
        ready(self.with(|st| {
            let Some(l) = st.leases.get(&lease) else {
                return Err(StoreError::UnknownLease(lease));
            };
            st.check_size(l, specs, limits)?;
            // One instance per (service, address). Under another lease, it is a server that
            // restarted before its old lease lapsed (or someone claiming its address): the new
            // registration replaces it, and the old lease learns at its next renewal that it
            // lost it. Under this lease, it is the same server registering it again.
            let mut replaced: Vec<(String, u64)> = Vec::new();
            let mut owners: Vec<u64> = Vec::new();
            for s in specs {
                if let Some(svc) = st.services.get(&s.service) {
                    for i in svc.instances.values().filter(|i| i.address == s.address) {
                        replaced.push((i.service.clone(), i.id));
                        owners.push(i.lease);
                    }
                }
            }
            st.remove_instances(&replaced);
            for owner in owners {
                if let Some(l) = st.leases.get_mut(&owner) {
                    l.instances.retain(|x| !replaced.contains(x));
                    l.lost |= owner != lease;
                }
            }
            let rev = st.bump();
            let mut ids: Vec<u64> = Vec::with_capacity(specs.len());
            for (k, s) in specs.iter().enumerate() {
                // A spec repeated in one request is one instance: it keeps the first one's id.
                if let Some(j) =
                    specs[..k].iter().position(|p| p.service == s.service && p.address == s.address)
                {
                    ids.push(ids[j]);
                    continue;
                }
                let id = st.next_instance;
                st.next_instance += 1;
                let instance = s.instance(id, lease);
                let svc = st.services.entry(s.service.clone()).or_default();
                svc.insert(id, instance);
                svc.revision = rev;
                st.leases.get_mut(&lease).expect("checked").instances.push((s.service.clone(), id));
                ids.push(id);
            }
            Ok(ids)
        }))
    }

    fn renew(&self, lease: u64) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        ready(self.with(|st| match st.leases.get_mut(&lease) {
            Some(l) => {
                l.deadline = Instant::now() + l.ttl;
                Ok(Renewal { ttl: l.ttl, intact: !l.lost })
            }
            None => Err(StoreError::UnknownLease(lease)),
        }))
    }

    fn revoke(&self, lease: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        ready(self.with(|st| match st.leases.remove(&lease) {
            Some(l) => {
                st.leases.shrink_if_sparse();
                Ok(st.remove_instances(&l.instances))
            }
            None => Err(StoreError::UnknownLease(lease)),
        }))
    }

    fn expire(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        let now = Instant::now();
        ready(Ok(self.with(|st| {
            let lapsed: Vec<u64> =
                st.leases.iter().filter(|(_, l)| l.deadline <= now).map(|(&id, _)| id).collect();
            let mut gone = Vec::new();
            for id in lapsed {
                let l = st.leases.remove(&id).expect("listed");
                tracing::info!(lease = id, instances = l.instances.len(), "lease lapsed");
                gone.extend(l.instances);
            }
            st.leases.shrink_if_sparse();
            st.remove_instances(&gone)
        })))
    }

    fn forget(&self, linger: Duration) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let now = Instant::now();
        let mut st = self.state.lock();
        let mut gone = Vec::new();
        st.services.retain(|name, svc| {
            let keep = svc.empty_since.is_none_or(|t| now.saturating_duration_since(t) < linger);
            if !keep {
                gone.push(name.clone());
            }
            keep
        });
        ready(Ok(gone))
    }

    fn resolve<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<ServiceState, StoreError>> {
        let st = self.state.lock();
        let state = match st.services.get(service) {
            Some(svc) => ServiceState {
                revision: svc.revision,
                known: true,
                instances: svc.instances.values().cloned().collect(),
            },
            None => ServiceState::default(),
        };
        ready(Ok(state))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ServiceListing>, StoreError>> {
        let now = Instant::now();
        let st = self.state.lock();
        let services = st
            .services
            .iter()
            .map(|(name, svc)| ServiceListing {
                name: name.clone(),
                revision: svc.revision,
                instances: svc
                    .instances
                    .values()
                    .map(|i| {
                        let lease = st.leases.get(&i.lease);
                        ListedInstance {
                            instance: i.clone(),
                            lease_ttl_ms: lease.map_or(0, |l| l.ttl.as_millis() as u64),
                            expires_in_ms: lease
                                .map_or(0, |l| l.deadline.saturating_duration_since(now).as_millis() as u64),
                        }
                    })
                    .collect(),
            })
            .collect();
        ready(Ok(services))
    }

    fn alloc_client_id(&self) -> BoxFuture<'_, Result<u32, StoreError>> {
        ready(self.state.lock().ids.alloc())
    }

    fn release_client_id(&self, id: u32) -> BoxFuture<'_, Result<bool, StoreError>> {
        let mut st = self.state.lock();
        let released = st.ids.allocated.remove(&id);
        st.ids.allocated.shrink_if_sparse();
        ready(Ok(released))
    }

    fn claim_client_id(&self, id: u32) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut st = self.state.lock();
        if st.ids.range.contains(&id) {
            st.ids.allocated.insert(id);
        }
        ready(Ok(()))
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }
}

/// The answer to a registry call that the store refused.
pub(crate) fn status(e: StoreError) -> Status {
    let code = match e {
        StoreError::UnknownLease(_) => Code::Application,
        StoreError::ClientIdsExhausted(_) => Code::Overloaded,
        StoreError::Invalid(_) => Code::BadRequest,
        StoreError::TooLarge(_) => Code::TooLarge,
        StoreError::Backend(_) => Code::Internal,
    };
    Status::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(service: &str, addr: &str) -> InstanceSpec {
        InstanceSpec::new(service, addr)
    }

    #[tokio::test]
    async fn register_resolve_revoke_bump_revisions() {
        let s = MemoryStore::new();
        let rx = s.subscribe();
        assert_eq!(s.resolve("a").await.unwrap(), ServiceState::default());
        let lease = s.grant(Duration::from_secs(10)).await.unwrap();
        let ids = s.register(lease, &[spec("a", "tcp://h:1"), spec("b", "tcp://h:1")]).await.unwrap();
        assert_eq!(ids.len(), 2);
        let a = s.resolve("a").await.unwrap();
        assert!(a.known);
        assert_eq!(a.instances.len(), 1);
        assert_eq!(a.instances[0].lease, lease);
        assert_eq!(*rx.borrow(), a.revision);
        assert_eq!(s.revoke(lease).await.unwrap(), 2);
        let a2 = s.resolve("a").await.unwrap();
        assert!(a2.known && a2.instances.is_empty() && a2.revision > a.revision);
        assert_eq!(s.revoke(lease).await, Err(StoreError::UnknownLease(lease)));
        assert_eq!(s.renew(lease).await, Err(StoreError::UnknownLease(lease)));
    }

    #[tokio::test]
    async fn a_new_registration_at_the_same_address_replaces_the_old_one() {
        let s = MemoryStore::new();
        let old = s.grant(Duration::from_secs(10)).await.unwrap();
        s.register(old, &[spec("a", "tcp://h:1"), spec("a", "tcp://h:2")]).await.unwrap();
        let new = s.grant(Duration::from_secs(10)).await.unwrap();
        s.register(new, &[spec("a", "tcp://h:1")]).await.unwrap();
        let a = s.resolve("a").await.unwrap();
        let mut by_addr: Vec<_> = a.instances.iter().map(|i| (i.address.as_str(), i.lease)).collect();
        by_addr.sort();
        assert_eq!(by_addr, vec![("tcp://h:1", new), ("tcp://h:2", old)]);
        // Revoking the old lease removes only what is still under it.
        assert_eq!(s.revoke(old).await.unwrap(), 1);
        assert_eq!(s.resolve("a").await.unwrap().instances.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_that_lost_an_instance_says_so_and_a_lapse_removes_only_what_it_holds() {
        let s = MemoryStore::new();
        let ttl = Duration::from_secs(10);
        let real = s.grant(ttl).await.unwrap();
        s.register(real, &[spec("a", "tcp://h:1"), spec("b", "tcp://h:1")]).await.unwrap();
        assert_eq!(s.renew(real).await.unwrap(), Renewal { ttl, intact: true });
        // Someone registers the same address under a lease it never renews.
        let stray = s.grant(ttl).await.unwrap();
        s.register(stray, &[spec("a", "tcp://h:1")]).await.unwrap();
        assert_eq!(s.renew(real).await.unwrap(), Renewal { ttl, intact: false }, "lost a@h:1");
        // The server registers again (a new lease), taking its address back.
        let again = s.grant(ttl).await.unwrap();
        s.register(again, &[spec("a", "tcp://h:1"), spec("b", "tcp://h:1")]).await.unwrap();
        assert!(s.renew(again).await.unwrap().intact);
        // The stray lease lapses: it holds nothing any more, so nothing goes.
        tokio::time::advance(ttl + Duration::from_millis(1)).await;
        s.renew(again).await.unwrap();
        assert_eq!(s.expire().await.unwrap(), 0);
        for service in ["a", "b"] {
            let r = s.resolve(service).await.unwrap();
            let held: Vec<_> = r.instances.iter().map(|i| (i.address.as_str(), i.lease)).collect();
            assert_eq!(held, [("tcp://h:1", again)], "{service}");
        }
    }

    #[tokio::test]
    async fn one_instance_per_service_and_address_even_from_one_lease() {
        let s = MemoryStore::new();
        let lease = s.grant(Duration::from_secs(10)).await.unwrap();
        let ids = s.register(lease, &[spec("a", "tcp://h:1"), spec("a", "tcp://h:1")]).await.unwrap();
        assert_eq!(ids[0], ids[1], "a repeated spec is one instance");
        let again = s.register(lease, &[spec("a", "tcp://h:1").weight(3)]).await.unwrap();
        let a = s.resolve("a").await.unwrap();
        assert_eq!(a.instances.len(), 1);
        assert_eq!((a.instances[0].id, a.instances[0].weight), (again[0], 3));
        assert!(s.renew(lease).await.unwrap().intact, "replacing its own instance loses nothing");
        assert_eq!(s.revoke(lease).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_lease_from_an_earlier_store_is_unknown_to_a_new_one() {
        // A restarted controller must not let a server renew a lease it never granted (it
        // could be another server's): the server has to register again.
        let old = MemoryStore::new();
        let stale = old.grant(Duration::from_secs(10)).await.unwrap();
        let new = MemoryStore::new();
        for _ in 0..3 {
            assert_ne!(new.grant(Duration::from_secs(10)).await.unwrap(), stale);
        }
        assert_eq!(new.renew(stale).await, Err(StoreError::UnknownLease(stale)));
        assert_eq!(new.revoke(stale).await, Err(StoreError::UnknownLease(stale)));
    }

    #[tokio::test]
    async fn invalid_registrations_are_refused() {
        let s = MemoryStore::new();
        let lease = s.grant(Duration::from_secs(1)).await.unwrap();
        assert!(matches!(s.register(lease, &[spec("", "tcp://h:1")]).await, Err(StoreError::Invalid(_))));
        assert!(matches!(
            s.register(lease, &[spec("a", "tcp://h:1").weight(0)]).await,
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(s.register(99, &[spec("a", "tcp://h:1")]).await, Err(StoreError::UnknownLease(99)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_with_no_instance_left_is_forgotten_after_the_linger() {
        let s = MemoryStore::new();
        let linger = Duration::from_secs(60);
        let lease = s.grant(Duration::from_secs(10)).await.unwrap();
        s.register(lease, &[spec("a", "tcp://h:1"), spec("b", "tcp://h:1")]).await.unwrap();
        let keep = s.grant(Duration::from_secs(1000)).await.unwrap();
        s.register(keep, &[spec("b", "tcp://h:2")]).await.unwrap();
        s.revoke(lease).await.unwrap();
        let before = s.resolve("a").await.unwrap();
        assert!(before.known && before.instances.is_empty());
        tokio::time::advance(linger - Duration::from_secs(1)).await;
        assert!(s.forget(linger).await.unwrap().is_empty(), "not yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(s.forget(linger).await.unwrap(), ["a"], "b still has an instance");
        assert_eq!(s.resolve("a").await.unwrap(), ServiceState::default());
        assert_eq!(s.list().await.unwrap().iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["b"]);
        // Registered again: known, at a revision above the one it had.
        let again = s.grant(Duration::from_secs(10)).await.unwrap();
        s.register(again, &[spec("a", "tcp://h:1")]).await.unwrap();
        assert!(s.resolve("a").await.unwrap().revision > before.revision);
    }

    #[tokio::test]
    async fn registrations_over_the_size_limits_are_refused_and_change_nothing() {
        let limits = StoreLimits { max_instances_per_lease: 3, max_service_bytes: 1_000 };
        let s = MemoryStore::new().with_limits(limits);
        let lease = s.grant(Duration::from_secs(10)).await.unwrap();
        s.register(lease, &[spec("a", "tcp://h:1"), spec("a", "tcp://h:2")]).await.unwrap();
        // Registering the same two again adds nothing to the lease's count.
        s.register(lease, &[spec("a", "tcp://h:1"), spec("a", "tcp://h:2")]).await.unwrap();
        let rev = s.resolve("a").await.unwrap().revision;
        let e = s.register(lease, &[spec("a", "tcp://h:3"), spec("a", "tcp://h:4")]).await.unwrap_err();
        assert!(matches!(&e, StoreError::TooLarge(m) if m.contains("at most 3 per lease")), "{e}");
        assert_eq!(status(e).code, Code::TooLarge);
        let other = s.grant(Duration::from_secs(10)).await.unwrap();
        let big = spec("a", "tcp://h:9").meta("k", "v".repeat(800));
        let e = s.register(other, &[big]).await.unwrap_err();
        assert!(matches!(&e, StoreError::TooLarge(m) if m.contains("at most 1000 per service")), "{e}");
        let a = s.resolve("a").await.unwrap();
        assert_eq!((a.instances.len(), a.revision), (2, rev), "nothing changed");
        // The bytes counted go down as instances leave.
        s.revoke(lease).await.unwrap();
        s.register(other, &[spec("a", "tcp://h:9").meta("k", "v".repeat(800))]).await.unwrap();
    }

    #[tokio::test]
    async fn client_ids_wrap_around_skip_held_ids_and_report_exhaustion() {
        let s = MemoryStore::with_client_id_range(10..=13);
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(s.alloc_client_id().await.unwrap());
        }
        assert_eq!(got, vec![10, 11, 12, 13]);
        assert_eq!(s.alloc_client_id().await, Err(StoreError::ClientIdsExhausted(4)));
        assert!(s.release_client_id(11).await.unwrap());
        assert!(!s.release_client_id(11).await.unwrap());
        // After the wrap the allocator skips 10 (still held) and finds 11.
        assert_eq!(s.alloc_client_id().await.unwrap(), 11);
        assert_eq!(s.alloc_client_id().await, Err(StoreError::ClientIdsExhausted(4)));
        // A claimed id is not handed out.
        s.release_client_id(12).await.unwrap();
        s.claim_client_id(12).await.unwrap();
        assert_eq!(s.alloc_client_id().await, Err(StoreError::ClientIdsExhausted(4)));
    }
}
