//! [`ServiceClient`]: calls services by name through a registry, in direct or relayed mode.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::BytesMut;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::watch::watch_loop;
use crate::balance::{Balance, InstanceStats, Outliers, Pick, Pool, PoolConfig, PoolStats, hash_key};
use crate::client::{
    BatchOptions, CallOptions, ClientConfig, StreamOptions, StreamSender, Streaming, Upload,
};
use crate::codec::{StableHash, Wire};
use crate::discovery::Instance;
use crate::discovery::wire::{RelayRequest, Target};
use crate::error::Error;
use crate::liveness::Keepalive;
use crate::method::{BidiStreamMethod, ClientStreamMethod, Method, StreamMethod};
use crate::metrics::stats::Snapshot;
use crate::registry::Registry;
use crate::retry::{Hedge, Plan, Retrier, RetryBudget, RetryConfig};

/// How a [`ServiceClient`] reaches instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    /// Resolve a service once, cache its instances (kept fresh by a watch), call instances
    /// directly: two messages per call, no registry traffic per call.
    #[default]
    Direct,
    /// Send every call to the controller, which forwards it to an instance and relays the
    /// reply (the MF report's "normal" mode): four messages per call. For clients that cannot
    /// reach the servers, and to measure direct mode against.
    Relayed,
}

impl Mode {
    /// `direct` or `relayed`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Relayed => "relayed",
        }
    }
}

/// Settings of a [`ServiceClient`].
#[derive(Debug, Clone)]
#[non_exhaustive]
#[derive(derive_setters::Setters)]
pub struct ServiceConfig {
    pub mode: Mode,
    /// How calls without a key pick an instance.
    pub balance: Balance,
    /// Connection settings (timeouts, limits) for the registry and every instance (the
    /// instances' keepalive is `instance_keepalive`, if set). The client id and sequence are
    /// the registry's.
    pub client: ClientConfig,
    /// Keepalive of the connections to instances, in place of `client.keepalive` (`None`: that
    /// one). Default: a connection with calls waiting is pinged after 500 ms without receiving
    /// anything and declared dead 1 s after an unanswered ping, so a frozen instance (a stopped
    /// process, a hung host whose kernel still accepts bytes) fails its calls as a lost
    /// connection within about 2 s — idempotent ones move to another instance — and is left
    /// out until a probe gets an answer; an idle connection is pinged after 30 s. A live
    /// server answers a ping after the requests read with it, so only one that sends nothing
    /// at all for 1.5 s while calls wait is taken for dead.
    pub instance_keepalive: Option<Keepalive>,
    /// How long the controller may hold one watch (long poll) before answering "no change".
    pub watch_timeout: Duration,
    /// How long an instance that stopped answering is left out before it is tried again (if
    /// the registry still lists it).
    pub quarantine: Duration,
    /// Most instances one call tries (retries, failover and hedges included).
    pub max_attempts: usize,
    /// Longest pause between watch attempts while the registry is unreachable.
    pub max_backoff: Duration,
    /// Retries of idempotent calls after errors that are safe to retry, within a budget (see
    /// [`RetryBudget`] for which errors). `None` (default): an idempotent call moves to
    /// another instance only when its connection is lost, unbudgeted.
    #[setters(strip_option)]
    pub retry_budget: Option<RetryBudget>,
    /// Hedged requests for idempotent calls (see [`Hedge`]). Default: none.
    #[setters(strip_option)]
    pub hedge: Option<Hedge>,
    /// Outlier ejection: instances failing in a row or far slower than their peers are left
    /// out for the quarantine (see [`Outliers`]). Default: off (instances that cannot be
    /// reached are always left out).
    #[setters(strip_option)]
    pub outliers: Option<Outliers>,
    /// Connect to an instance on this host (its registered host id is this process's
    /// [`host_id`](crate::discovery::host_id)) through the first of its same-host addresses
    /// (`shm://`, `unix://`: [`InstanceSpec::local_address`](crate::discovery::InstanceSpec::local_address))
    /// that opens, and through its `address` when none does. Default: off, every connection
    /// goes to `address`. Routing does not change: an instance keeps its place on the hash
    /// ring, whichever address its connection uses.
    pub prefer_local: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            mode: Mode::Direct,
            balance: Balance::RoundRobin,
            client: ClientConfig::default(),
            instance_keepalive: Some(
                Keepalive::new(Duration::from_secs(30), Duration::from_secs(1))
                    .busy(Duration::from_millis(500)),
            ),
            watch_timeout: Duration::from_secs(30),
            quarantine: Duration::from_secs(5),
            max_attempts: 3,
            max_backoff: Duration::from_secs(1),
            retry_budget: None,
            hedge: None,
            outliers: None,
            prefer_local: false,
        }
    }
}

/// Counters of a [`ServiceClient`], readable at runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServiceClientStats {
    pub mode: Mode,
    pub client_id: u32,
    /// Calls made (each instance of a scatter-gather counts).
    pub calls: u64,
    /// Calls sent again to another instance: idempotent ones (failover and budgeted retries)
    /// and any call its server never ran (`resent_unrun`).
    pub failovers: u64,
    /// Of the failovers, calls sent again because their server never ran them
    /// ([`Error::NotRun`]: it was going away), whatever the method.
    pub resent_unrun: u64,
    /// Retries the [`RetryBudget`] refused (the call ended with its error).
    pub retries_refused: u64,
    /// Hedges sent, and hedges the budget refused (the call kept waiting on its first
    /// instance).
    pub hedges: u64,
    pub hedges_refused: u64,
    /// Times an instance was left out of rotation (unreachable, or an outlier).
    pub instances_dropped: u64,
    /// Of those, as outliers (failing or slow).
    pub outliers_ejected: u64,
    /// Connections to instances opened through a same-host address
    /// ([`ServiceConfig::prefer_local`]).
    pub local_connections: u64,
    /// Same-host addresses that could not be opened; each time, the connection went to the
    /// instance's address instead.
    pub local_failures: u64,
    /// Registry look-ups (`resolve`): one per service in direct mode.
    pub lookups: u64,
    /// Watch long polls issued.
    pub watches: u64,
    /// Messages sent to the controller (in relayed mode: every call).
    pub registry_messages_sent: u64,
    /// Messages received from the controller.
    pub registry_messages_received: u64,
    /// Transport counters of the connection to the controller.
    pub registry_transport: Snapshot,
    /// Transport counters of the connections to instances (direct mode).
    pub instance_transport: Snapshot,
}

impl ServiceClientStats {
    /// Messages sent to and received from the controller.
    pub fn registry_messages(&self) -> u64 {
        self.registry_messages_sent + self.registry_messages_received
    }

    /// Transport counters of all connections together.
    pub fn transport(&self) -> Snapshot {
        let mut s = self.registry_transport;
        s.add(&self.instance_transport);
        s
    }
}

/// One instance's answer in a scatter-gather.
#[derive(Debug)]
pub struct Gathered<Resp> {
    pub instance: Instance,
    pub result: Result<Resp, Error>,
}

/// Calls services by name: finds their instances through a registry, balances calls over
/// them, routes keyed calls by consistent hashing, fails idempotent calls over, and gathers
/// from every instance. Cheap to clone; clones share connections, caches and counters.
///
/// ```
/// use volley::discovery::{DEFAULT_REGISTRY, InstanceSpec};
/// use volley::registry::{LeaseConfig, Registry};
/// use volley::{Method, Server, ServiceClient};
///
/// const SAY: Method<String, String> = Method::new("greeter", "say");
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> volley::Result<()> {
/// // A server registers with the embedded registry (started on first use)...
/// let server = Server::builder().handle(&SAY, |s: String| async move { Ok(format!("hi {s}")) }).build();
/// let addr = server.listen("inproc://doc-greeter").await?;
/// let registry = Registry::connect(DEFAULT_REGISTRY).await?;
/// registry.register(&server, vec![InstanceSpec::new("greeter", addr.to_string())], LeaseConfig::default()).await?;
///
/// // ...and a client finds it by service name.
/// let client = ServiceClient::connect(DEFAULT_REGISTRY).await?;
/// assert_eq!(client.call(&SAY, "bo".to_string()).await?, "hi bo");
/// server.shutdown().await; // deregisters at once
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ServiceClient {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    config: ServiceConfig,
    /// Services already resolved: read without a lock on every call.
    pools: ArcSwap<FxHashMap<String, Arc<Retrier>>>,
    /// Services being resolved for the first time (one look-up per service, however many
    /// callers ask at once).
    resolving: Mutex<FxHashMap<String, Arc<OnceCell<Arc<Retrier>>>>>,
    pool_stats: Arc<PoolStats>,
    calls: AtomicU64,
    /// Ends the watch tasks when the client goes.
    stop: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ServiceClient {
    /// Connects to the registry at `addr` in direct mode. For
    /// [`DEFAULT_REGISTRY`](crate::discovery::DEFAULT_REGISTRY) the embedded controller is started if
    /// nothing serves it yet.
    pub async fn connect(registry: &str) -> Result<ServiceClient, Error> {
        ServiceClient::connect_with(registry, ServiceConfig::default()).await
    }

    pub async fn connect_with(registry: &str, config: ServiceConfig) -> Result<ServiceClient, Error> {
        let registry = Registry::connect_with(registry, config.client.clone()).await?;
        Ok(ServiceClient::with_registry(registry, config))
    }

    /// A client over an existing registry connection (it shares the client id).
    pub fn with_registry(registry: Registry, config: ServiceConfig) -> ServiceClient {
        ServiceClient {
            inner: Arc::new(Inner {
                registry,
                config,
                pools: ArcSwap::default(),
                resolving: Mutex::default(),
                pool_stats: Arc::default(),
                calls: AtomicU64::new(0),
                stop: CancellationToken::new(),
            }),
        }
    }

    /// Calls `m` on an instance of its service.
    pub async fn call<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
    ) -> Result<Resp, Error> {
        self.route_call(m, req, CallOptions::default(), Pick::Balanced).await
    }

    /// Calls with per-call options. A call marked [`idempotent`](CallOptions::idempotent)
    /// whose instance fails during the call is retried on another instance (the request is
    /// cloned per attempt), within the call's deadline; with a [`RetryBudget`] also after
    /// `Overloaded`, and with a [`Hedge`] it may go to a second instance when the first is
    /// slow. Any other call ends with the connection error.
    pub async fn call_with<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> Result<Resp, Error> {
        self.route_call(m, req, opts, Pick::Balanced).await
    }

    /// The batch API through the registry: the requests are cut into chunks, and every chunk
    /// goes to an instance chosen by the balancing policy, so a batch spreads over the
    /// service's instances; results come back in input order, one per request. In relayed mode
    /// each request is relayed on its own (the controller forwards single calls).
    pub async fn call_batch<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        reqs: impl IntoIterator<Item = Req>,
    ) -> Vec<Result<Resp, Error>> {
        self.call_batch_with(m, reqs, BatchOptions::default()).await
    }

    pub async fn call_batch_with<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        reqs: impl IntoIterator<Item = Req>,
        opts: BatchOptions,
    ) -> Vec<Result<Resp, Error>> {
        let reqs: Vec<Req> = reqs.into_iter().collect();
        let n = reqs.len();
        if self.inner.config.mode == Mode::Relayed {
            let call_opts =
                CallOptions { timeout: opts.timeout, idempotent: opts.idempotent, deadline: None };
            let calls = reqs.into_iter().map(|r| self.route_call(m, r, call_opts, Pick::Balanced));
            return futures_util::future::join_all(calls).await;
        }
        let pool = match self.pool(m.service()).await {
            Ok(pool) => pool,
            Err(e) => return (0..n).map(|_| Err(e.clone())).collect(),
        };
        self.inner.calls.fetch_add(1, Relaxed);
        let size = opts.chunk_size.max(1);
        let mut chunks: Vec<Vec<Req>> = Vec::with_capacity(n.div_ceil(size));
        let mut rest = reqs.into_iter();
        loop {
            let chunk: Vec<Req> = rest.by_ref().take(size).collect();
            if chunk.is_empty() {
                break;
            }
            chunks.push(chunk);
        }
        let sends = chunks.into_iter().map(|chunk| {
            let pool = pool.clone();
            async move {
                let len = chunk.len();
                let mut slot = Some(chunk);
                // The pool connects before it calls `attempt`, and retries (another instance)
                // only on a failed connect, so the chunk is sent at most once.
                let sent = pool
                    .call(&Pick::Balanced, Plan::once(), |client| {
                        let chunk = slot.take();
                        async move {
                            match chunk {
                                Some(chunk) => {
                                    Ok(client.call_batch_with(m, chunk, opts.chunk_size(len)).await)
                                }
                                None => Err(Error::Usage("a batch chunk was attempted twice".into())),
                            }
                        }
                    })
                    .await;
                sent.unwrap_or_else(|e| (0..len).map(|_| Err(e.clone())).collect())
            }
        });
        futures_util::future::join_all(sends).await.into_iter().flatten().collect()
    }

    /// Calls the instance that owns `key` on the service's consistent-hash ring. The key is
    /// hashed over its encoded form ([`hash_key`]), so a key keeps its instance while the set
    /// of instances is stable, and only about 1/N of keys move when one joins or leaves.
    pub async fn call_keyed<K: StableHash + ?Sized, Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        key: &K,
        req: Req,
    ) -> Result<Resp, Error> {
        self.call_keyed_with(m, key, req, CallOptions::default()).await
    }

    pub async fn call_keyed_with<K: StableHash + ?Sized, Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        key: &K,
        req: Req,
        opts: CallOptions,
    ) -> Result<Resp, Error> {
        self.route_call(m, req, opts, Pick::Key(hash_key(key))).await
    }

    /// Scatter-gather: calls `m` on every instance of its service at once and gathers each
    /// instance's result or error, in the registry's order. Fails only if the service has no
    /// instance at all.
    pub async fn scatter<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
    ) -> Result<Vec<Gathered<Resp>>, Error> {
        self.scatter_with(m, req, CallOptions::default()).await
    }

    pub async fn scatter_with<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> Result<Vec<Gathered<Resp>>, Error> {
        let instances = self.instances(m.service()).await?;
        let calls = instances.into_iter().map(|instance| {
            let (req, route) = (req.clone(), Pick::Address(instance.address.clone()));
            async move { Gathered { result: self.route_call(m, req, opts, route).await, instance } }
        });
        Ok(futures_util::future::join_all(calls).await)
    }

    /// Scatter-gather with a merge of the gathered results (see [`merge_sorted`](super::merge_sorted) for merging
    /// sorted top-k lists).
    pub async fn scatter_merge<Req: Wire + Clone, Resp: Wire, T>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        merge: impl FnOnce(Vec<Gathered<Resp>>) -> T,
    ) -> Result<T, Error> {
        Ok(merge(self.scatter(m, req).await?))
    }

    /// The instances of `service`: in direct mode from the cache (resolving on first use), in
    /// relayed mode by a look-up. Fails with [`Error::UnknownService`] or
    /// [`Error::NoInstances`] if there are none.
    pub async fn instances(&self, service: &str) -> Result<Vec<Instance>, Error> {
        let (known, instances) = match self.inner.config.mode {
            Mode::Direct => {
                let view = self.pool(service).await?.pool.view();
                (view.known, view.listed.iter().map(|e| e.instance()).collect::<Vec<_>>())
            }
            Mode::Relayed => {
                let r = self.inner.registry.resolve(service).await?;
                (r.known, r.instances)
            }
        };
        match (instances.is_empty(), known) {
            (false, _) => Ok(instances),
            (true, true) => Err(Error::NoInstances { service: service.to_string() }),
            (true, false) => Err(Error::UnknownService(service.to_string())),
        }
    }

    /// What the direct-mode cache holds for `service` now, without any look-up (`None` if it
    /// was never resolved).
    pub fn cached_instances(&self, service: &str) -> Option<Vec<Instance>> {
        let pools = self.inner.pools.load();
        let pool = pools.get(service)?;
        Some(pool.pool.view().listed.iter().map(|e| e.instance()).collect())
    }

    /// Each instance of `service` as this client sees it: out of rotation or not (and why),
    /// attempts sent, calls outstanding, measured latency. Empty if the service was never
    /// called (direct mode) or in relayed mode.
    pub fn instance_stats(&self, service: &str) -> Vec<InstanceStats> {
        self.inner.pools.load().get(service).map(|p| p.pool.instance_stats()).unwrap_or_default()
    }

    /// The client id the registry allocated (the upper half of every request id).
    pub fn client_id(&self) -> u32 {
        self.inner.registry.client_id()
    }

    pub fn mode(&self) -> Mode {
        self.inner.config.mode
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    pub fn stats(&self) -> ServiceClientStats {
        let i = &self.inner;
        let r = i.registry.stats();
        let mut instance_transport = i.pool_stats.retired();
        for p in i.pools.load().values() {
            instance_transport.add(&p.pool.counters());
        }
        ServiceClientStats {
            mode: i.config.mode,
            client_id: i.registry.client_id(),
            calls: i.calls.load(Relaxed),
            failovers: i.pool_stats.failovers.load(Relaxed),
            resent_unrun: i.pool_stats.resent_unrun.load(Relaxed),
            retries_refused: i.pool_stats.retries_refused.load(Relaxed),
            hedges: i.pool_stats.hedges.load(Relaxed),
            hedges_refused: i.pool_stats.hedges_refused.load(Relaxed),
            instances_dropped: i.pool_stats.instances_dropped.load(Relaxed),
            outliers_ejected: i.pool_stats.outliers_ejected.load(Relaxed),
            local_connections: i.pool_stats.local_connections.load(Relaxed),
            local_failures: i.pool_stats.local_failures.load(Relaxed),
            lookups: r.lookups,
            watches: r.watches,
            registry_messages_sent: r.messages_sent,
            registry_messages_received: r.messages_received,
            registry_transport: r.transport,
            instance_transport,
        }
    }

    async fn route_call<Req: Wire + Clone, Resp: Wire>(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
        route: Pick,
    ) -> Result<Resp, Error> {
        self.inner.calls.fetch_add(1, Relaxed);
        match self.inner.config.mode {
            Mode::Direct => {
                let pool = self.pool(m.service()).await?;
                let idempotent = opts.idempotent;
                // Retries get what is left of the call's time, never a fresh timeout.
                let deadline = tokio::time::Instant::now() + opts.budget(self.inner.config.client.timeout);
                let opts = opts.deadline(deadline);
                // Any call may be attempted again (an idempotent one after a lost connection,
                // any one its server never ran), so each attempt sends a copy.
                let req = &req;
                pool.call(&route, Plan::new(idempotent, Some(deadline)), |client| {
                    let req = req.clone();
                    async move { client.call_with(m, req, opts).await }
                })
                .await
            }
            Mode::Relayed => {
                let mut payload = BytesMut::new();
                req.encode(&mut payload).map_err(|e| Error::Encode(e.0))?;
                let timeout = opts.timeout.unwrap_or(self.inner.config.client.timeout);
                let target = match route {
                    Pick::Balanced => Target::Any,
                    Pick::Key(h) => Target::Key(h),
                    Pick::Address(a) => Target::Address(a),
                };
                let relay = RelayRequest {
                    service: m.service().to_string(),
                    method: m.name().to_string(),
                    idempotent: opts.idempotent,
                    target,
                    timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
                    payload: payload.freeze(),
                };
                let reply = self.inner.registry.relay(relay, timeout).await?.into_result()?;
                Resp::decode(reply).map_err(|e| Error::Decode(e.0))
            }
        }
    }

    /// The instances of `service` and their calls' retry state, resolved (one look-up) and
    /// watched from first use on.
    async fn pool(&self, service: &str) -> Result<Arc<Retrier>, Error> {
        if let Some(p) = self.inner.pools.load().get(service) {
            return Ok(p.clone());
        }
        let cell = self.inner.resolving.lock().entry(service.to_string()).or_default().clone();
        let pool = cell
            .get_or_try_init(|| async {
                let resolved = self.inner.registry.resolve(service).await?;
                let c = &self.inner.config;
                let config = PoolConfig {
                    outliers: c.outliers,
                    prefer_local: c.prefer_local,
                    ..PoolConfig::new(
                        c.balance,
                        c.quarantine,
                        self.inner.registry.client_config(&ClientConfig {
                            keepalive: c.instance_keepalive.or(c.client.keepalive),
                            ..c.client.clone()
                        }),
                    )
                };
                let retry = RetryConfig {
                    max_attempts: c.max_attempts.max(1),
                    retry_budget: c.retry_budget,
                    hedge: c.hedge,
                };
                let pool = Pool::new(service.to_string(), config, self.inner.pool_stats.clone());
                pool.apply(resolved);
                let pool = Arc::new(Retrier::new(pool, retry));
                tokio::spawn(watch_loop(
                    Arc::downgrade(&pool.pool),
                    self.inner.registry.clone(),
                    self.inner.stop.clone(),
                    self.inner.config.watch_timeout,
                    self.inner.config.max_backoff,
                ));
                self.inner.pools.rcu(|m| {
                    let mut m = FxHashMap::clone(m);
                    m.insert(service.to_string(), pool.clone());
                    m
                });
                Ok::<_, Error>(pool)
            })
            .await?
            .clone();
        self.inner.resolving.lock().remove(service);
        Ok(pool)
    }
}

/// Server streams through the registry (PROTOCOL.md §9.9).
impl ServiceClient {
    /// Opens server stream `m` on an instance of its service, picked by the balancing policy;
    /// the stream stays on that instance until it ends. An instance that cannot be connected
    /// to is passed over for another, as for a call; once the open is sent it is not sent
    /// again (a stream's items may already have been taken). Direct mode only: the registry's
    /// relay forwards single calls, so in relayed mode the open is refused with
    /// `Error::Usage`.
    pub async fn open_stream_with<Req: Wire, Item: Wire>(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
        opts: StreamOptions,
    ) -> Result<Streaming<Item>, Error> {
        if self.inner.config.mode == Mode::Relayed {
            return Err(Error::Usage(format!(
                "{m:?}: streams do not go through the registry's relay (it forwards single calls and \
                 answers each with one reply); open them in direct mode"
            )));
        }
        let pool = self.pool(m.service()).await?;
        self.inner.calls.fetch_add(1, Relaxed);
        let mut slot = Some(req);
        // The pool connects before it calls the attempt, and moves on to another instance
        // only on a failed connect: the open is sent at most once.
        pool.call(&Pick::Balanced, Plan::once(), |client| {
            let req = slot.take();
            async move {
                match req {
                    Some(req) => client.open_stream_with(m, req, opts).await,
                    None => Err(Error::Usage("a stream open was attempted twice".into())),
                }
            }
        })
        .await
    }

    /// Opens server stream `m` with the default options (see
    /// [`open_stream_with`](Self::open_stream_with)).
    pub async fn open_stream<Req: Wire, Item: Wire>(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
    ) -> Result<Streaming<Item>, Error> {
        self.open_stream_with(m, req, StreamOptions::default()).await
    }

    /// Opens client stream `m` on an instance of its service (see
    /// [`open_stream_with`](Self::open_stream_with): picked by the balancing policy, kept
    /// until the stream ends; direct mode only).
    pub async fn open_client_stream<Req: Wire, Resp: Wire>(
        &self,
        m: &ClientStreamMethod<Req, Resp>,
        opts: StreamOptions,
    ) -> Result<Upload<Req, Resp>, Error> {
        let pool = self.stream_pool(&format!("{m:?}"), m.service()).await?;
        pool.call(
            &Pick::Balanced,
            Plan::once(),
            |client| async move { client.open_client_stream(m, opts).await },
        )
        .await
    }

    /// Opens both-way stream `m` on an instance of its service (see
    /// [`open_stream_with`](Self::open_stream_with): picked by the balancing policy, kept
    /// until the stream ends; direct mode only).
    pub async fn open_bidi_stream<Req: Wire, Item: Wire>(
        &self,
        m: &BidiStreamMethod<Req, Item>,
        opts: StreamOptions,
    ) -> Result<(StreamSender<Req>, Streaming<Item>), Error> {
        let pool = self.stream_pool(&format!("{m:?}"), m.service()).await?;
        pool.call(
            &Pick::Balanced,
            Plan::once(),
            |client| async move { client.open_bidi_stream(m, opts).await },
        )
        .await
    }

    /// The instances of `service` to open a stream on; streams are refused in relayed mode.
    async fn stream_pool(&self, what: &str, service: &str) -> Result<Arc<Retrier>, Error> {
        if self.inner.config.mode == Mode::Relayed {
            return Err(Error::Usage(format!(
                "{what}: streams do not go through the registry's relay (it forwards single calls and \
                 answers each with one reply); open them in direct mode"
            )));
        }
        let pool = self.pool(service).await?;
        self.inner.calls.fetch_add(1, Relaxed);
        Ok(pool)
    }
}
