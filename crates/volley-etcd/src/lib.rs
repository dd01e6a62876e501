//! The Volley registry on etcd: [`EtcdStore`], a [`volley::controller::Store`] whose state lives
//! in an etcd cluster, so that several controllers over one etcd act as one registry and the
//! registry survives the loss of a machine.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use volley::controller::{Controller, ControllerConfig};
//! use volley_etcd::{EtcdConfig, EtcdStore};
//!
//! let store = EtcdStore::connect(EtcdConfig::parse("etcd://10.0.0.1:2379,10.0.0.2:2379")?).await?;
//! let controller = Controller::with_store(Arc::new(store), ControllerConfig::default());
//! controller.listen("tcp://0.0.0.0:7400").await?;
//! # Ok(()) }
//! ```
//!
//! How Volley's registry maps onto etcd (`docs/ETCD.md` has the operator's view):
//!
//! - **Leases** are etcd leases. A server's renewal is one etcd lease keep-alive; when a server
//!   stops renewing, etcd revokes the lease and deletes its keys.
//! - **Instances** are keys `PREFIX/instances/SERVICE/ADDRESS` attached to their lease, with
//!   the instance as JSON; `PREFIX/services/SERVICE` (no lease) marks a service as known. A
//!   registration is one transaction. It also writes a *claim* `PREFIX/claims/LEASE/SERVICE/ADDRESS`
//!   per instance, attached to the same lease: a registration of the same address under another
//!   lease moves the instance key to that lease but leaves the claim, so a renewal that finds a
//!   claim without its instance key tells the server it lost the instance (and must register
//!   again) — one lease time-to-live request per renewal.
//! - **Changes** reach every controller through one etcd watch on the instance and service keys, which feeds an
//!   in-memory copy of the state; look-ups and the controller's long polls are answered from
//!   it. The revision Volley reports is etcd's cluster-wide revision, and the epoch is derived
//!   from the cluster id and prefix, so every controller reports the same revisions and a
//!   client can move between them.
//! - **Compaction**: a watch that cannot resume because its revision was compacted reads the
//!   whole prefix again (a *re-list*) and continues from there.
//! - **etcd unreachable**: the copy is kept and served (clients keep calling what they know);
//!   writes (registrations, renewals, client ids) fail. The store logs the outage and counts it
//!   ([`StoreStatus`]); when etcd answers again the watch resumes, or re-lists, and the copy
//!   converges.
//! - **Several etcd endpoints**: requests and the watch go to one endpoint at a time and move
//!   to the next one when it cannot be reached (or has no leader).
//! - **Client ids** come from a counter key `PREFIX/client-ids/next`, advanced by a
//!   compare-and-swap transaction in blocks: an id is never handed out twice, by any
//!   controller, across restarts. Ids are not reused (released ids are not given back), which
//!   leaves room for about four billion clients over the life of a prefix.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use volley::controller::{Renewal, ServiceState, Store, StoreError, StoreStatus};
use volley::discovery::wire::{ListedInstance, ServiceListing};
use volley::discovery::{Instance, InstanceSpec};

/// The etcd v3 API messages and gRPC clients (generated from `proto/etcd.proto`, the part of
/// etcd's API this crate uses).
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("etcdserverpb");
}

use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::watch_client::WatchClient;

/// Settings of an [`EtcdStore`].
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// etcd client endpoints, `HOST:PORT` (or `http://HOST:PORT`).
    pub endpoints: Vec<String>,
    /// Every key lives under this prefix: registries with different prefixes share an etcd
    /// without seeing each other.
    pub prefix: String,
    /// Deadline of one etcd request.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Client ids reserved from etcd per transaction. Larger blocks mean fewer transactions
    /// when many clients connect; the unused rest of a block is lost when a controller stops.
    pub id_block: u32,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["127.0.0.1:2379".into()],
            prefix: "/volley".into(),
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(2),
            id_block: 16,
        }
    }
}

impl EtcdConfig {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (the `--store` of
    /// `volley controller`). The prefix defaults to `/volley`.
    pub fn parse(url: &str) -> Result<EtcdConfig, String> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("{url:?}: an etcd store is etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"))?;
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
            None => (rest, "/volley".to_string()),
        };
        let endpoints: Vec<String> =
            hosts.split(',').map(str::trim).filter(|h| !h.is_empty()).map(str::to_string).collect();
        if endpoints.is_empty() || endpoints.iter().any(|h| !h.contains(':')) {
            return Err(format!("{url:?}: every etcd endpoint needs HOST:PORT"));
        }
        if prefix.is_empty() {
            return Err(format!("{url:?}: the key prefix must not be empty"));
        }
        Ok(EtcdConfig { endpoints, prefix, ..EtcdConfig::default() })
    }
}

/// A [`Store`] over etcd. See the crate documentation for how the registry maps onto etcd.
///
/// Dropping it stops its watch.
pub struct EtcdStore {
    shared: Arc<Shared>,
    /// Dropped with the store: ends the watch task.
    _stop: watch::Sender<()>,
}

struct Shared {
    config: EtcdConfig,
    /// One channel per etcd endpoint (each connects on first use and reconnects on demand).
    channels: Vec<Channel>,
    /// The endpoint requests go to now; moves on when it is unreachable.
    current: AtomicUsize,
    epoch: u64,
    keys: Keys,
    cache: Mutex<Cache>,
    revision: watch::Sender<u64>,
    ids: tokio::sync::Mutex<IdBlock>,
    reachable: AtomicBool,
    outages: AtomicU64,
    errors: AtomicU64,
    relists: AtomicU64,
    /// Test hook: while true the watch is closed (so that a test can compact past it).
    paused: watch::Sender<bool>,
}

struct Keys {
    instances: String,
    services: String,
    claims: String,
    client_ids: String,
}

impl Keys {
    fn new(prefix: &str) -> Keys {
        Keys {
            instances: format!("{prefix}/instances/"),
            services: format!("{prefix}/services/"),
            claims: format!("{prefix}/claims/"),
            client_ids: format!("{prefix}/client-ids/next"),
        }
    }

    fn instance(&self, service: &str, address: &str) -> String {
        format!("{}{}/{}", self.instances, encode_service(service), address)
    }

    /// The claim of `lease` on an instance key: where the key should be while the lease holds
    /// it.
    fn claim(&self, lease: u64, service: &str, address: &str) -> String {
        format!("{}{lease:016x}/{}/{}", self.claims, encode_service(service), address)
    }

    /// Whether every instance `lease` claims is still attached to it, from the keys etcd lists
    /// under the lease.
    fn holds_its_claims(&self, lease: u64, attached: &[Vec<u8>]) -> bool {
        let mine = format!("{}{lease:016x}/", self.claims);
        let attached: BTreeSet<&[u8]> = attached.iter().map(Vec::as_slice).collect();
        attached.iter().filter_map(|k| k.strip_prefix(mine.as_bytes())).all(|rest| {
            let mut instance = self.instances.as_bytes().to_vec();
            instance.extend_from_slice(rest);
            attached.contains(instance.as_slice())
        })
    }

    fn service(&self, service: &str) -> String {
        format!("{}{}", self.services, encode_service(service))
    }

    /// The key range the copy mirrors: `instances/` and `services/` (adjacent in key order),
    /// not the client-id counter, whose every move would otherwise wake every long poll.
    fn state_start(&self) -> Vec<u8> {
        self.instances.clone().into_bytes()
    }

    fn state_end(&self) -> Vec<u8> {
        prefix_end(&self.services)
    }
}

/// Service names go into keys with `%` and `/` escaped, so the service is the path segment
/// after `instances/` whatever characters it has.
fn encode_service(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

fn decode_service(s: &str) -> String {
    s.replace("%2F", "/").replace("%25", "%")
}

/// The end of the key range of every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The last state read from etcd.
#[derive(Default)]
struct Cache {
    /// The etcd revision this copy reflects.
    revision: u64,
    services: BTreeMap<String, Svc>,
}

#[derive(Default, Clone, PartialEq)]
struct Svc {
    /// etcd revision of the service's last change seen.
    revision: u64,
    known: bool,
    /// By key.
    instances: BTreeMap<String, Instance>,
}

impl Cache {
    /// Applies one key's new value (`Some`) or deletion (`None`) at `revision`.
    fn apply(&mut self, keys: &Keys, key: &str, value: Option<&[u8]>, revision: u64) {
        if let Some(rest) = key.strip_prefix(&keys.instances) {
            let Some((svc, _addr)) = rest.split_once('/') else { return };
            let service = decode_service(svc);
            match value {
                Some(v) => match serde_json::from_slice::<Instance>(v) {
                    Ok(i) => {
                        let s = self.services.entry(service).or_default();
                        s.known = true;
                        s.instances.insert(key.to_string(), i);
                        s.revision = s.revision.max(revision);
                    }
                    Err(e) => tracing::warn!(key, error = %e, "ignored an instance key that does not parse"),
                },
                None => {
                    if let Some(s) = self.services.get_mut(&service)
                        && s.instances.remove(key).is_some()
                    {
                        s.revision = s.revision.max(revision);
                    }
                }
            }
        } else if let Some(svc) = key.strip_prefix(&keys.services)
            && value.is_some()
        {
            let s = self.services.entry(decode_service(svc)).or_default();
            if !s.known {
                s.known = true;
                s.revision = s.revision.max(revision);
            }
        }
    }
}

struct IdBlock {
    next: u64,
    end: u64,
}

/// How one etcd request failed.
fn backend(what: &str, e: tonic::Status) -> StoreError {
    StoreError::Backend(format!("etcd {what}: {}: {}", e.code(), e.message()))
}

fn lease_not_found(e: &tonic::Status) -> bool {
    e.message().contains("lease not found")
}

/// Whether a request failed because the endpoint could not be reached or had no leader, so
/// another endpoint may answer.
fn unreachable(e: &tonic::Status) -> bool {
    matches!(e.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown)
}

impl EtcdStore {
    /// Connects to etcd and reads the registry's state (so look-ups answer at once). Fails if
    /// no endpoint answers within the request timeout. A watch task keeps the state current
    /// from then on.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, StoreError> {
        let endpoints: Vec<Endpoint> = config
            .endpoints
            .iter()
            .map(|e| {
                let url = if e.contains("://") { e.clone() } else { format!("http://{e}") };
                Endpoint::from_shared(url)
                    .map(|ep| {
                        ep.connect_timeout(config.connect_timeout)
                            .tcp_nodelay(true)
                            // A silent etcd (machine gone, network cut) is noticed within about
                            // ten seconds; a stopped one at once (its connections close).
                            .http2_keep_alive_interval(Duration::from_secs(5))
                            .keep_alive_timeout(Duration::from_secs(5))
                            .keep_alive_while_idle(true)
                    })
                    .map_err(|e| StoreError::Invalid(format!("etcd endpoint {e}")))
            })
            .collect::<Result<_, _>>()?;
        // Our own failover rather than tonic's balancer: a balancer may keep sending to a member
        // that is down; here a request that finds its endpoint unreachable moves to the next.
        let channels: Vec<Channel> = endpoints.iter().map(Endpoint::connect_lazy).collect();
        let keys = Keys::new(&config.prefix);
        let (stop, stop_rx) = watch::channel(());
        let mut shared = Shared {
            channels,
            current: AtomicUsize::new(0),
            epoch: 0,
            keys,
            cache: Mutex::new(Cache::default()),
            revision: watch::channel(0).0,
            ids: tokio::sync::Mutex::new(IdBlock { next: 0, end: 0 }),
            reachable: AtomicBool::new(true),
            outages: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            relists: AtomicU64::new(0),
            paused: watch::channel(false).0,
            config,
        };
        let (cluster_id, _) = shared.relist().await?;
        shared.epoch = epoch_of(cluster_id, &shared.config.prefix);
        let shared = Arc::new(shared);
        tokio::spawn(watch_task(shared.clone(), stop_rx));
        tracing::info!(endpoints = ?shared.config.endpoints, prefix = %shared.config.prefix, revision = *shared.revision.borrow(), "registry store on etcd");
        Ok(EtcdStore { shared, _stop: stop })
    }

    /// The settings the store was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    /// The gRPC channel to the etcd endpoint in use (for tools and tests that need another
    /// etcd call).
    pub fn channel(&self) -> Channel {
        self.shared.channel().1
    }

    /// Test hook: closes the watch (`true`) or opens it again, resuming from the revision it
    /// had reached (`false`). Lets a test compact etcd past a watch's revision.
    #[doc(hidden)]
    pub fn pause_watch(&self, paused: bool) {
        self.shared.paused.send_replace(paused);
    }
}

/// A non-zero epoch shared by every store over the same cluster and prefix.
fn epoch_of(cluster_id: u64, prefix: &str) -> u64 {
    // FNV-1a over the prefix, mixed with the cluster id: stable across processes and builds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in prefix.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ cluster_id.rotate_left(17)).max(1)
}

impl Shared {
    /// The endpoint in use and its channel.
    fn channel(&self) -> (usize, Channel) {
        let i = self.current.load(Relaxed) % self.channels.len();
        (i, self.channels[i].clone())
    }

    /// Endpoint `i` did not answer: the next one is used (unless another request moved on
    /// already).
    fn endpoint_failed(&self, i: usize, e: &tonic::Status) {
        let n = self.channels.len();
        if n > 1 && self.current.compare_exchange(i, (i + 1) % n, Relaxed, Relaxed).is_ok() {
            tracing::info!(from = %self.config.endpoints[i], to = %self.config.endpoints[(i + 1) % n], error = %e, "etcd endpoint unreachable; using the next one");
        }
    }

    /// Runs one etcd request under the request timeout, on the endpoint in use and — if it
    /// cannot be reached — on the next ones; counts failures. Every request this store makes
    /// may be sent twice: a compare-and-swap that did land makes its retry fail, and is then
    /// read again; a lease granted twice lapses unused.
    async fn request<T, Fut>(&self, what: &str, f: impl Fn(Channel) -> Fut) -> Result<T, tonic::Status>
    where
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut r = Err(tonic::Status::unavailable("no etcd endpoint"));
        for _ in 0..self.channels.len() {
            let (i, channel) = self.channel();
            r = match tokio::time::timeout(self.config.request_timeout, f(channel)).await {
                Ok(r) => r,
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {:?}",
                    self.config.request_timeout
                ))),
            };
            match &r {
                Err(e) if unreachable(e) => self.endpoint_failed(i, e),
                _ => break,
            }
        }
        if let Err(e) = &r
            && !lease_not_found(e)
        {
            self.errors.fetch_add(1, Relaxed);
            tracing::debug!(request = what, error = %e, "etcd request failed");
        }
        r
    }

    async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse, tonic::Status> {
        self.request("range", |ch| {
            let req = req.clone();
            async move { Ok(KvClient::new(ch).range(req).await?.into_inner()) }
        })
        .await
    }

    async fn txn(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse, tonic::Status> {
        self.request("txn", |ch| {
            let req = req.clone();
            async move { Ok(KvClient::new(ch).txn(req).await?.into_inner()) }
        })
        .await
    }

    async fn lease_grant(&self, ttl: i64) -> Result<pb::LeaseGrantResponse, tonic::Status> {
        self.request("lease grant", |ch| async move {
            Ok(LeaseClient::new(ch).lease_grant(pb::LeaseGrantRequest { ttl, id: 0 }).await?.into_inner())
        })
        .await
    }

    async fn lease_revoke(&self, id: i64) -> Result<pb::LeaseRevokeResponse, tonic::Status> {
        self.request("lease revoke", |ch| async move {
            Ok(LeaseClient::new(ch).lease_revoke(pb::LeaseRevokeRequest { id }).await?.into_inner())
        })
        .await
    }

    async fn lease_ttl(&self, id: i64, keys: bool) -> Result<pb::LeaseTimeToLiveResponse, tonic::Status> {
        self.request("lease ttl", |ch| async move {
            let req = pb::LeaseTimeToLiveRequest { id, keys };
            Ok(LeaseClient::new(ch).lease_time_to_live(req).await?.into_inner())
        })
        .await
    }

    /// One keep-alive, on a stream of its own (an HTTP/2 stream on the endpoint's connection).
    async fn keep_alive(&self, id: i64) -> Result<pb::LeaseKeepAliveResponse, tonic::Status> {
        self.request("lease keep-alive", |ch| async move {
            let once = tokio_stream::iter([pb::LeaseKeepAliveRequest { id }]);
            let mut stream = LeaseClient::new(ch).lease_keep_alive(once).await?.into_inner();
            stream.message().await?.ok_or_else(|| tonic::Status::unavailable("keep-alive stream ended"))
        })
        .await
    }

    fn set_reachable(&self, ok: bool, why: &str) {
        let was = self.reachable.swap(ok, Relaxed);
        if was && !ok {
            self.outages.fetch_add(1, Relaxed);
            tracing::warn!(endpoints = ?self.config.endpoints, error = why, "etcd unreachable: serving look-ups and watches from the last good state; registrations fail until it is back");
        } else if !was && ok {
            tracing::warn!(endpoints = ?self.config.endpoints, "etcd reachable again; the registry state converges");
        }
    }

    /// Reads every key under the prefix and replaces the copy with it. Returns the cluster id
    /// and the revision read at.
    async fn relist(&self) -> Result<(u64, u64), StoreError> {
        let req = pb::RangeRequest {
            key: self.keys.state_start(),
            range_end: self.keys.state_end(),
            ..Default::default()
        };
        let resp = self.range(req).await.map_err(|e| backend("range", e))?;
        let header = resp.header.unwrap_or_default();
        let at = header.revision as u64;
        let mut fresh = Cache { revision: at, services: BTreeMap::new() };
        for kv in &resp.kvs {
            let key = String::from_utf8_lossy(&kv.key);
            fresh.apply(&self.keys, &key, Some(&kv.value), kv.mod_revision as u64);
        }
        {
            let mut cache = self.cache.lock();
            let first = cache.revision == 0;
            // A service whose instances differ from the copy changed at some revision up to
            // `at` that the copy missed (a deletion leaves no revision behind): it gets `at`, so
            // watches on it answer. Unchanged services keep their revision.
            for (name, svc) in fresh.services.iter_mut() {
                match cache.services.get(name) {
                    Some(old) if old.instances == svc.instances => svc.revision = old.revision,
                    Some(_) => svc.revision = at,
                    None if !first => svc.revision = at,
                    None => {}
                }
            }
            for (name, old) in cache.services.iter() {
                if !fresh.services.contains_key(name) {
                    // Gone entirely (keys deleted by hand): known, now empty.
                    let svc = Svc { revision: at, known: old.known, instances: BTreeMap::new() };
                    fresh.services.insert(name.clone(), svc);
                }
            }
            fresh.revision = fresh.revision.max(cache.revision);
            *cache = fresh;
        }
        self.relists.fetch_add(1, Relaxed);
        self.publish();
        Ok((header.cluster_id, at))
    }

    fn publish(&self) {
        let rev = self.cache.lock().revision;
        self.revision.send_if_modified(|r| {
            if *r < rev {
                *r = rev;
                true
            } else {
                false
            }
        });
    }

    /// Waits (briefly) until the copy has seen `revision`: a controller that just wrote to etcd
    /// answers its own next look-up with what it wrote.
    async fn caught_up(&self, revision: u64) {
        let mut rx = self.revision.subscribe();
        let wait = rx.wait_for(|r| *r >= revision);
        if tokio::time::timeout(self.config.request_timeout, wait).await.is_err() {
            tracing::debug!(revision, "the watch has not delivered our own write yet");
        }
    }

    async fn reserve_ids(&self, block: &mut IdBlock) -> Result<(), StoreError> {
        const LIMIT: u64 = u32::MAX as u64 + 1;
        let key = self.keys.client_ids.clone().into_bytes();
        loop {
            let req = pb::RangeRequest { key: key.clone(), ..Default::default() };
            let resp = self.range(req).await.map_err(|e| backend("range", e))?;
            let (start, compare) = match resp.kvs.first() {
                Some(kv) => {
                    let next: u64 =
                        std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse().ok()).ok_or_else(
                            || StoreError::Backend(format!("{} holds no number", self.keys.client_ids)),
                        )?;
                    let cmp = pb::Compare {
                        result: pb::compare::CompareResult::Equal as i32,
                        target: pb::compare::CompareTarget::Mod as i32,
                        key: key.clone(),
                        target_union: Some(pb::compare::TargetUnion::ModRevision(kv.mod_revision)),
                        ..Default::default()
                    };
                    (next, cmp)
                }
                None => {
                    let cmp = pb::Compare {
                        result: pb::compare::CompareResult::Equal as i32,
                        target: pb::compare::CompareTarget::Create as i32,
                        key: key.clone(),
                        target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
                        ..Default::default()
                    };
                    (1, cmp)
                }
            };
            if start >= LIMIT {
                return Err(StoreError::ClientIdsExhausted(LIMIT - 1));
            }
            let end = (start + self.config.id_block.max(1) as u64).min(LIMIT);
            let put = pb::PutRequest {
                key: key.clone(),
                value: end.to_string().into_bytes(),
                ..Default::default()
            };
            let txn = pb::TxnRequest {
                compare: vec![compare],
                success: vec![pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(put)) }],
                failure: vec![],
            };
            let resp = self.txn(txn).await.map_err(|e| backend("txn", e))?;
            if resp.succeeded {
                *block = IdBlock { next: start, end };
                return Ok(());
            }
            // Another controller moved the counter between our read and our write: read again.
            tracing::trace!("client id counter moved; retrying");
        }
    }
}

/// Keeps the copy current: watches the prefix from the revision the copy reflects. A stream
/// that breaks (etcd unreachable) is opened again from the same revision once etcd answers; a
/// revision that was compacted meanwhile makes it re-list first.
async fn watch_task(shared: Arc<Shared>, mut stop: watch::Receiver<()>) {
    let mut backoff = Duration::from_millis(50);
    let mut paused = shared.paused.subscribe();
    let mut need_relist = false;
    loop {
        if *paused.borrow_and_update() {
            tokio::select! {
                _ = stop.changed() => return,
                _ = paused.wait_for(|p| !*p) => {}
            }
        }
        if need_relist {
            match shared.relist().await {
                Ok((_, at)) => {
                    tracing::info!(revision = at, "re-listed the registry from etcd");
                    need_relist = false;
                }
                Err(e) => {
                    shared.set_reachable(false, &e.to_string());
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let from = shared.cache.lock().revision + 1;
        let outcome = tokio::select! {
            _ = stop.changed() => return,
            _ = paused.wait_for(|p| *p) => continue,
            o = watch_from(&shared, from) => o,
        };
        match outcome {
            WatchEnd::Compacted(at) => {
                tracing::warn!(from, compacted = at, "etcd compacted past the watch revision; re-listing");
                need_relist = true;
                backoff = Duration::from_millis(50);
            }
            WatchEnd::Failed(why) => {
                shared.errors.fetch_add(1, Relaxed);
                shared.set_reachable(false, &why);
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

enum WatchEnd {
    Compacted(i64),
    Failed(String),
}

/// One watch stream, from `from` on, until it ends.
async fn watch_from(shared: &Shared, from: u64) -> WatchEnd {
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: shared.keys.state_start(),
            range_end: shared.keys.state_end(),
            start_revision: from as i64,
            ..Default::default()
        })),
    };
    // The request side stays open (an ended request stream would end the watch).
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::WatchRequest>(1);
    let _ = tx.send(create).await;
    let (endpoint, channel) = shared.channel();
    let mut client = WatchClient::new(channel);
    let opened = tokio::time::timeout(
        shared.config.request_timeout,
        client.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await;
    // A watch that cannot be opened or breaks moves to the next endpoint.
    let failed = |e: tonic::Status| {
        shared.endpoint_failed(endpoint, &e);
        WatchEnd::Failed(format!("watch: {}: {}", e.code(), e.message()))
    };
    let mut stream = match opened {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(e)) => return failed(e),
        Err(_) => return failed(tonic::Status::deadline_exceeded("no answer")),
    };
    loop {
        let msg = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return failed(tonic::Status::unavailable("watch stream ended")),
            Err(e) => return failed(e),
        };
        if msg.compact_revision > 0 {
            return WatchEnd::Compacted(msg.compact_revision);
        }
        if msg.canceled {
            return WatchEnd::Failed(format!("watch canceled: {}", msg.cancel_reason));
        }
        if msg.created {
            shared.set_reachable(true, "");
        }
        if msg.events.is_empty() {
            continue;
        }
        {
            let mut cache = shared.cache.lock();
            for ev in &msg.events {
                let Some(kv) = &ev.kv else { continue };
                let key = String::from_utf8_lossy(&kv.key);
                let rev = kv.mod_revision as u64;
                let value = (ev.r#type == pb::event::EventType::Put as i32).then_some(kv.value.as_slice());
                cache.apply(&shared.keys, &key, value, rev);
                cache.revision = cache.revision.max(rev);
            }
        }
        shared.publish();
    }
}

impl Store for EtcdStore {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            // etcd leases count whole seconds (and etcd raises very short ones to its minimum).
            let secs = ttl.as_millis().div_ceil(1000).max(1) as i64;
            let s = &self.shared;
            let resp = s.lease_grant(secs).await.map_err(|e| backend("lease grant", e))?;
            if !resp.error.is_empty() {
                return Err(StoreError::Backend(format!("etcd lease grant: {}", resp.error)));
            }
            Ok(resp.id as u64)
        })
    }

    fn register<'a>(
        &'a self,
        lease: u64,
        specs: &'a [InstanceSpec],
    ) -> BoxFuture<'a, Result<Vec<u64>, StoreError>> {
        Box::pin(async move {
            if let Some(why) = specs.iter().find_map(|s| s.check().err()) {
                return Err(StoreError::Invalid(why));
            }
            let s = &self.shared;
            // One key per (service, address): a repeated spec keeps the first one's id.
            let mut by_key: HashMap<String, u64> = HashMap::new();
            let mut ops = Vec::new();
            let mut ids = Vec::with_capacity(specs.len());
            let mut services = BTreeSet::new();
            for spec in specs {
                let key = s.keys.instance(&spec.service, &spec.address);
                if let Some(&id) = by_key.get(&key) {
                    ids.push(id);
                    continue;
                }
                let id = fastrand::u64(1..);
                let instance = spec.instance(id, lease);
                let value = serde_json::to_vec(&instance).map_err(|e| StoreError::Invalid(e.to_string()))?;
                let put = pb::PutRequest {
                    key: key.clone().into_bytes(),
                    value,
                    lease: lease as i64,
                    ..Default::default()
                };
                ops.push(pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(put)) });
                let claim = pb::PutRequest {
                    key: s.keys.claim(lease, &spec.service, &spec.address).into_bytes(),
                    lease: lease as i64,
                    ..Default::default()
                };
                ops.push(pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(claim)) });
                by_key.insert(key, id);
                ids.push(id);
                services.insert(spec.service.clone());
            }
            for svc in services {
                let put = pb::PutRequest { key: s.keys.service(&svc).into_bytes(), ..Default::default() };
                ops.push(pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(put)) });
            }
            let txn = pb::TxnRequest { compare: vec![], success: ops, failure: vec![] };
            let resp = match s.txn(txn).await {
                Ok(r) => r,
                Err(e) if lease_not_found(&e) => return Err(StoreError::UnknownLease(lease)),
                Err(e) => return Err(backend("txn", e)),
            };
            s.caught_up(resp.header.unwrap_or_default().revision as u64).await;
            Ok(ids)
        })
    }

    fn renew(&self, lease: u64) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        Box::pin(async move {
            let s = &self.shared;
            let resp = s.keep_alive(lease as i64).await.map_err(|e| backend("lease keep-alive", e))?;
            if resp.ttl <= 0 {
                return Err(StoreError::UnknownLease(lease));
            }
            let ttl = Duration::from_secs(resp.ttl as u64);
            let attached = s.lease_ttl(lease as i64, true).await.map_err(|e| backend("lease ttl", e))?;
            if attached.ttl < 0 {
                return Err(StoreError::UnknownLease(lease));
            }
            Ok(Renewal { ttl, intact: s.keys.holds_its_claims(lease, &attached.keys) })
        })
    }

    fn revoke(&self, lease: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            let s = &self.shared;
            let ttl = s.lease_ttl(lease as i64, true).await.map_err(|e| backend("lease ttl", e))?;
            if ttl.ttl < 0 {
                return Err(StoreError::UnknownLease(lease));
            }
            let instances = ttl.keys.iter().filter(|k| k.starts_with(s.keys.instances.as_bytes())).count();
            let resp = match s.lease_revoke(lease as i64).await {
                Ok(r) => r,
                Err(e) if lease_not_found(&e) => return Err(StoreError::UnknownLease(lease)),
                Err(e) => return Err(backend("lease revoke", e)),
            };
            if instances > 0 {
                s.caught_up(resp.header.unwrap_or_default().revision as u64).await;
            }
            Ok(instances)
        })
    }

    fn expire(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        // etcd expires leases itself; the deletions arrive through the watch.
        Box::pin(std::future::ready(Ok(0)))
    }

    fn resolve<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<ServiceState, StoreError>> {
        let cache = self.shared.cache.lock();
        let state = match cache.services.get(service) {
            Some(s) => ServiceState {
                revision: s.revision,
                known: s.known,
                instances: s.instances.values().cloned().collect(),
            },
            None => ServiceState::default(),
        };
        Box::pin(std::future::ready(Ok(state)))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ServiceListing>, StoreError>> {
        Box::pin(async move {
            let s = &self.shared;
            let services: Vec<(String, Svc)> =
                s.cache.lock().services.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
            let leases: BTreeSet<u64> =
                services.iter().flat_map(|(_, v)| v.instances.values().map(|i| i.lease)).collect();
            // Lease times, best effort: 0 when etcd does not answer.
            let asks = leases.into_iter().map(|id| async move {
                let r = s.lease_ttl(id as i64, false).await.ok();
                (id, r.map_or((0, 0), |r| (r.granted_ttl.max(0) as u64 * 1000, r.ttl.max(0) as u64 * 1000)))
            });
            let times: HashMap<u64, (u64, u64)> =
                futures_util::future::join_all(asks).await.into_iter().collect();
            Ok(services
                .into_iter()
                .map(|(name, svc)| ServiceListing {
                    name,
                    revision: svc.revision,
                    instances: svc
                        .instances
                        .into_values()
                        .map(|instance| {
                            let (ttl, left) = times.get(&instance.lease).copied().unwrap_or((0, 0));
                            ListedInstance { instance, lease_ttl_ms: ttl, expires_in_ms: left }
                        })
                        .collect(),
                })
                .collect())
        })
    }

    fn alloc_client_id(&self) -> BoxFuture<'_, Result<u32, StoreError>> {
        Box::pin(async move {
            let mut block = self.shared.ids.lock().await;
            if block.next >= block.end {
                self.shared.reserve_ids(&mut block).await?;
            }
            let id = block.next;
            block.next += 1;
            Ok(id as u32)
        })
    }

    /// Ids are never reused, so there is nothing to give back.
    fn release_client_id(&self, _id: u32) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Every id below the counter is spent for good, so a client's old id cannot be handed out
    /// again: nothing to do.
    fn claim_client_id(&self, _id: u32) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.revision.subscribe()
    }

    fn durable(&self) -> bool {
        true
    }

    fn epoch(&self) -> Option<u64> {
        Some(self.shared.epoch)
    }

    fn status(&self) -> StoreStatus {
        let s = &self.shared;
        StoreStatus {
            reachable: s.reachable.load(Relaxed),
            outages: s.outages.load(Relaxed),
            errors: s.errors.load(Relaxed),
            relists: s.relists.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_parse() {
        let c = EtcdConfig::parse("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap();
        assert_eq!(c.endpoints, vec!["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(c.prefix, "/volley");
        let c = EtcdConfig::parse("etcd://h:1/team/reg/").unwrap();
        assert_eq!((c.endpoints, c.prefix.as_str()), (vec!["h:1".to_string()], "/team/reg"));
        assert!(EtcdConfig::parse("memory").is_err());
        assert!(EtcdConfig::parse("etcd://").is_err());
        assert!(EtcdConfig::parse("etcd://nohostport").is_err());
    }

    #[test]
    fn service_names_with_slashes_stay_one_key_segment() {
        let keys = Keys::new("/v");
        let k = keys.instance("a/b%c", "tcp://h:1");
        assert_eq!(k, "/v/instances/a%2Fb%25c/tcp://h:1");
        let mut cache = Cache::default();
        let i = InstanceSpec::new("a/b%c", "tcp://h:1").instance(7, 9);
        cache.apply(&keys, &k, Some(&serde_json::to_vec(&i).unwrap()), 5);
        let s = &cache.services["a/b%c"];
        assert_eq!((s.revision, s.known, s.instances.len()), (5, true, 1));
        cache.apply(&keys, &k, None, 8);
        let s = &cache.services["a/b%c"];
        assert_eq!((s.revision, s.known, s.instances.len()), (8, true, 0));
    }

    #[test]
    fn the_mirrored_range_holds_instances_and_services_but_not_the_id_counter() {
        let keys = Keys::new("/v");
        let inside =
            |k: &str| k.as_bytes() >= &keys.state_start()[..] && k.as_bytes() < &keys.state_end()[..];
        assert!(inside(&keys.instance("a", "tcp://h:1")));
        assert!(inside(&keys.service("a")));
        assert!(inside(&keys.service("\u{10ffff}")));
        assert!(!inside(&keys.client_ids));
        assert!(!inside("/v/zzz") && !inside("/w/instances/a/x"));
    }

    #[test]
    fn a_claim_without_its_instance_key_means_the_lease_lost_it() {
        let keys = Keys::new("/v");
        let (lease, other) = (0xabc, 0xdef);
        let claims = [keys.claim(lease, "a/b", "unix:///tmp/x.sock"), keys.claim(lease, "c", "tcp://h:1")];
        let instances = [keys.instance("a/b", "unix:///tmp/x.sock"), keys.instance("c", "tcp://h:1")];
        let bytes = |ks: &[&String]| ks.iter().map(|k| k.as_bytes().to_vec()).collect::<Vec<_>>();
        let all: Vec<&String> = claims.iter().chain(&instances).collect();
        assert!(keys.holds_its_claims(lease, &bytes(&all)));
        // The second instance key moved to another lease.
        assert!(!keys.holds_its_claims(lease, &bytes(&[&claims[0], &claims[1], &instances[0]])));
        // Another lease's claims are not ours; a lease of an older version has none at all.
        assert!(keys.holds_its_claims(other, &bytes(&[&claims[0], &claims[1]])));
        assert!(keys.holds_its_claims(lease, &bytes(&[&instances[0]])));
        // Claims sort outside the mirrored range, so they wake no watch.
        let inside =
            |k: &str| k.as_bytes() >= &keys.state_start()[..] && k.as_bytes() < &keys.state_end()[..];
        assert!(!inside(&claims[0]));
    }

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end("/v/"), b"/v0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn epochs_depend_on_cluster_and_prefix_and_are_never_zero() {
        assert_eq!(epoch_of(1, "/volley"), epoch_of(1, "/volley"));
        assert_ne!(epoch_of(1, "/volley"), epoch_of(2, "/volley"));
        assert_ne!(epoch_of(1, "/volley"), epoch_of(1, "/other"));
        assert_ne!(epoch_of(0, ""), 0);
    }
}
