//! Relayed mode: the controller forwards a call to an instance of its service, through its
//! own connections to instances (one pool per service, kept in step with the store), with the
//! same balancing and failover as a [`ServiceClient`](crate::ServiceClient) in direct mode.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::sync::{OnceCell, watch};

use super::shrink::Shrink;
use super::store::{Store, status};
use crate::balance::{Balance, Pick, Pool, PoolConfig, PoolStats};
use crate::client::{CallOptions, ClientConfig};
use crate::discovery::wire::{RelayRequest, Resolved, Target};
use crate::error::Error;
use crate::metrics::stats::Snapshot;
use crate::retry::{Plan, Retrier, RetryConfig};

/// Relayed mode: the controller's own connections to instances, one pool per service, kept in
/// step with the store.
pub(crate) struct Relay {
    pools: Mutex<FxHashMap<String, Arc<RelayPool>>>,
    stats: Arc<PoolStats>,
    /// The relay's connections use one client id from the store, allocated on first use.
    client: OnceCell<ClientConfig>,
    base: ClientConfig,
    balance: Balance,
    revision: watch::Receiver<u64>,
    calls: AtomicU64,
}

struct RelayPool {
    retrier: Arc<Retrier>,
    /// 1 + the store revision the pool was last refreshed at (0: never).
    seen: AtomicU64,
}

impl Relay {
    /// A relay that balances by `balance` over connections made with `client`, and refreshes
    /// a service's pool when the store's `revision` moved.
    pub fn new(balance: Balance, client: ClientConfig, revision: watch::Receiver<u64>) -> Relay {
        Relay {
            pools: Mutex::new(FxHashMap::default()),
            stats: Arc::default(),
            client: OnceCell::new(),
            base: client,
            balance,
            revision,
            calls: AtomicU64::new(0),
        }
    }

    /// Transport counters of the relay's connections, closed ones included.
    pub fn transport(&self) -> Snapshot {
        let mut t = self.stats.retired();
        for p in self.pools.lock().values() {
            t.add(&p.retrier.pool.counters());
        }
        t
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Relaxed)
    }

    pub fn failovers(&self) -> u64 {
        self.stats.failovers.load(Relaxed)
    }

    pub fn resent_unrun(&self) -> u64 {
        self.stats.resent_unrun.load(Relaxed)
    }

    /// Drops the pools of services the store forgot, with their connections (whose counters
    /// join the retired ones as they close).
    pub fn forget(&self, services: &[String]) {
        let mut pools = self.pools.lock();
        for s in services {
            pools.remove(s);
        }
        pools.shrink_if_sparse();
    }

    /// Drops every pool (and with them the connections to instances).
    pub fn clear(&self) {
        self.pools.lock().clear();
    }

    /// Forwards one relayed call to an instance of its service in `store`.
    pub async fn forward(
        &self,
        store: &dyn Store,
        epoch: u64,
        r: RelayRequest,
    ) -> Result<bytes::Bytes, Error> {
        self.calls.fetch_add(1, Relaxed);
        let pool = self.pool(store, epoch, &r.service).await?;
        let route = match r.target {
            Target::Any => Pick::Balanced,
            Target::Key(h) => Pick::Key(h),
            Target::Address(a) => Pick::Address(a),
        };
        let timeout = match r.timeout_ms {
            0 => self.base.timeout,
            ms => Duration::from_millis(ms as u64),
        };
        let opts = CallOptions { timeout: Some(timeout), idempotent: r.idempotent, deadline: None };
        let (service, method, payload) = (&r.service, &r.method, &r.payload);
        pool.call(&route, Plan::new(r.idempotent, None), |client| {
            let payload = payload.clone();
            async move { client.call_raw(service, method, payload, opts).await }
        })
        .await
    }

    /// The pool of `service`, refreshed from the store if the store changed since. Services
    /// the store never heard of get no pool (names in requests are not trusted to be bounded).
    async fn pool(&self, store: &dyn Store, epoch: u64, service: &str) -> Result<Arc<Retrier>, Error> {
        let now = *self.revision.borrow();
        let existing = self.pools.lock().get(service).cloned();
        if let Some(p) = &existing
            && p.seen.load(Relaxed) > now
        {
            return Ok(p.retrier.clone());
        }
        let s = store.resolve(service).await.map_err(|e| Error::Remote(status(e)))?;
        if !s.known {
            return Err(Error::UnknownService(service.to_string()));
        }
        let p = match existing {
            Some(p) => p,
            None => {
                let config = PoolConfig {
                    keep_last_good: false,
                    ..PoolConfig::new(self.balance, Duration::from_secs(1), self.client_config(store).await?)
                };
                let pool = Pool::new(service.to_string(), config, self.stats.clone());
                let fresh = Arc::new(RelayPool {
                    retrier: Arc::new(Retrier::new(pool, RetryConfig::failover(3))),
                    seen: AtomicU64::new(0),
                });
                self.pools.lock().entry(service.to_string()).or_insert(fresh).clone()
            }
        };
        p.retrier.pool.apply(Resolved {
            service: service.to_string(),
            epoch,
            revision: s.revision,
            known: true,
            settling: false,
            instances: s.instances,
        });
        p.seen.fetch_max(now + 1, Relaxed);
        Ok(p.retrier.clone())
    }

    async fn client_config(&self, store: &dyn Store) -> Result<ClientConfig, Error> {
        self.client
            .get_or_try_init(|| async {
                let id = store.alloc_client_id().await.map_err(|e| Error::Remote(status(e)))?;
                Ok::<_, Error>(ClientConfig {
                    client_id: Some(id),
                    shared_sequence: Some(Default::default()),
                    ..self.base.clone()
                })
            })
            .await
            .cloned()
    }
}
