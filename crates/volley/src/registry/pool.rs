//! The instances of one service as a caller sees them: a cached list, one connection per
//! instance, balancing, key routing, dropping instances that stop answering, and failover.
//!
//! Used by both callers of instances: a [`ServiceClient`](super::ServiceClient) in direct
//! mode (the list comes from the registry and is kept fresh by a watch) and the controller's
//! relay (the list comes from its own store).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::time::Instant;

use super::hash::HashRing;
use super::wire::{Instance, Resolved};
use crate::client::{Client, ClientConfig};
use crate::error::Error;
use crate::proto::Code;
use crate::stats::Snapshot;
use crate::transport::Address;

/// How a call without a key picks among the instances of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// In turn, each instance as often as its weight says.
    #[default]
    RoundRobin,
    /// Power of two choices: of two instances picked at random, the one with fewer calls
    /// outstanding (relative to its weight). Adapts to slow instances without a global scan.
    LeastOutstanding,
}

/// Where one call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// By the balancing policy.
    Balanced,
    /// By key hash on the ring; on failover, the next instance clockwise.
    Key(u64),
    /// To the instance at this address only (scatter-gather); no failover.
    Address(String),
}

/// Settings of a pool.
#[derive(Debug, Clone)]
pub(crate) struct PoolConfig {
    pub balance: Balance,
    /// How long an instance that stopped answering is left out before it is tried again (if
    /// the registry still lists it).
    pub quarantine: Duration,
    /// Most instances one call tries (idempotent calls fail over; any call moves on when
    /// connecting fails, since nothing was sent).
    pub max_attempts: usize,
    /// For the connections to instances (carries the owner's client id and sequence).
    pub client: ClientConfig,
    /// Keep the last good list when an update lists no usable instance. Right for clients
    /// (the registry may have lost its state while the instances still work); the
    /// controller's relay reads its own store, which is the truth, and turns this off.
    pub keep_last_good: bool,
}

/// Counters shared by the pools of one owner.
#[derive(Debug, Default)]
pub(crate) struct PoolStats {
    pub failovers: AtomicU64,
    pub instances_dropped: AtomicU64,
    /// Transport counters of connections that were closed or replaced.
    retired: Mutex<Snapshot>,
}

impl PoolStats {
    fn retire(&self, s: Snapshot) {
        add_snapshot(&mut self.retired.lock(), &s);
    }

    pub fn retired(&self) -> Snapshot {
        *self.retired.lock()
    }
}

pub(crate) fn add_snapshot(acc: &mut Snapshot, s: &Snapshot) {
    acc.frames_sent += s.frames_sent;
    acc.messages_sent += s.messages_sent;
    acc.bytes_sent += s.bytes_sent;
    acc.frames_received += s.frames_received;
    acc.messages_received += s.messages_received;
    acc.bytes_received += s.bytes_received;
}

/// One instance and the connection to it (made on first use).
pub(crate) struct Endpoint {
    pub address: String,
    /// Updated in place when the registry changes the instance's weight or metadata, so the
    /// connection survives.
    info: ArcSwap<Instance>,
    client: ArcSwapOption<Client>,
    connecting: tokio::sync::Mutex<()>,
    outstanding: AtomicUsize,
    stats: Arc<PoolStats>,
}

impl Endpoint {
    fn new(instance: Instance, stats: Arc<PoolStats>) -> Endpoint {
        Endpoint {
            address: instance.address.clone(),
            info: ArcSwap::from_pointee(instance),
            client: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
            outstanding: AtomicUsize::new(0),
            stats,
        }
    }

    pub fn instance(&self) -> Instance {
        (**self.info.load()).clone()
    }

    fn weight(&self) -> u32 {
        self.info.load().weight.max(1)
    }

    /// The connection, made now if there is none or it died. Connecting here, before the
    /// request is handed over, means a failure to connect is known to have sent nothing.
    async fn connect(&self, config: &ClientConfig) -> Result<Client, Error> {
        if let Some(c) = self.client.load().as_deref().filter(|c| c.is_connected()) {
            return Ok(c.clone());
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(c) = self.client.load().as_deref().filter(|c| c.is_connected()) {
            return Ok(c.clone());
        }
        let c = Client::connect_with(&self.address, config.clone()).await?;
        if let Some(old) = self.client.swap(Some(Arc::new(c.clone()))) {
            self.stats.retire(old.counters());
        }
        Ok(c)
    }

    fn counters(&self) -> Snapshot {
        self.client.load().as_deref().map(Client::counters).unwrap_or_default()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(c) = self.client.load().as_deref() {
            self.stats.retire(c.counters());
        }
    }
}

/// One immutable picture of the service; replaced whole on every change.
pub(crate) struct View {
    pub epoch: u64,
    pub revision: u64,
    pub settling: bool,
    pub known: bool,
    /// Every valid instance the registry lists (the last good list).
    pub listed: Vec<Arc<Endpoint>>,
    /// `listed` without the instances left out for not answering (or all of `listed` if that
    /// would leave none: trying is better than failing without trying).
    active: Vec<Arc<Endpoint>>,
    ring: HashRing,
    /// Prefix sums of the active instances' weights (weighted round-robin).
    cum_weights: Vec<u64>,
    /// When the first left-out instance may be tried again.
    readmit_at: Option<Instant>,
}

impl View {
    fn empty() -> View {
        View {
            epoch: 0,
            revision: 0,
            settling: false,
            known: false,
            listed: Vec::new(),
            active: Vec::new(),
            ring: HashRing::default(),
            cum_weights: Vec::new(),
            readmit_at: None,
        }
    }
}

/// The instances of one service.
pub(crate) struct Pool {
    pub service: String,
    view: ArcSwap<View>,
    config: PoolConfig,
    rr: AtomicU64,
    /// Address -> until when it is left out.
    quarantine: Mutex<FxHashMap<String, Instant>>,
    /// Serializes view rebuilds (updates and drops), which are rare.
    update: Mutex<()>,
    pub stats: Arc<PoolStats>,
}

impl Pool {
    pub fn new(service: String, config: PoolConfig, stats: Arc<PoolStats>) -> Pool {
        Pool {
            service,
            view: ArcSwap::from_pointee(View::empty()),
            config,
            rr: AtomicU64::new(0),
            quarantine: Mutex::new(FxHashMap::default()),
            update: Mutex::new(()),
            stats,
        }
    }

    /// The current view, first letting left-out instances back in if their time is up.
    pub fn view(&self) -> Arc<View> {
        let v = self.view.load_full();
        match v.readmit_at {
            Some(t) if Instant::now() >= t => {
                let _g = self.update.lock();
                let cur = self.view.load_full();
                self.install(&cur, cur.listed.clone())
            }
            _ => v,
        }
    }

    /// (epoch, revision, settling) of the list held: where the next watch continues from.
    pub fn position(&self) -> (u64, u64, bool) {
        let v = self.view.load();
        (v.epoch, v.revision, v.settling)
    }

    /// Applies a list from the registry. Returns whether the set of instances changed.
    ///
    /// - Invalid entries (another service, an address that does not parse, weight 0) are
    ///   ignored.
    /// - **The last good list is kept**: an update that leaves no valid instance does not wipe
    ///   a non-empty list (a registry that lost its state, or a bad update, must not stop
    ///   calls that work); instances that really died are dropped when calls to them fail.
    /// - While the controller is settling after a restart (servers still registering again),
    ///   the update is merged with the list held instead of replacing it.
    pub fn apply(&self, r: Resolved) -> bool {
        let _g = self.update.lock();
        let cur = self.view.load_full();
        if r.epoch == cur.epoch && r.revision < cur.revision {
            return false; // an answer overtaken by a newer one
        }
        let total = r.instances.len();
        let mut seen = std::collections::HashSet::new();
        let mut valid: Vec<Instance> = r
            .instances
            .into_iter()
            .filter(|i| {
                i.service == self.service
                    && i.weight > 0
                    && Address::parse(&i.address).is_ok()
                    && seen.insert(i.address.clone())
            })
            .collect();
        if valid.len() < total {
            tracing::warn!(service = %self.service, ignored = total - valid.len(), "ignored invalid instances in a registry update");
        }
        if r.settling {
            for ep in &cur.listed {
                if !valid.iter().any(|i| i.address == ep.address) {
                    valid.push(ep.instance());
                }
            }
        }
        let keep_last_good = self.config.keep_last_good && valid.is_empty() && !cur.listed.is_empty();
        if keep_last_good {
            tracing::warn!(service = %self.service, revision = r.revision, "registry update lists no usable instance; keeping the last good list");
        }
        let listed: Vec<Arc<Endpoint>> = if keep_last_good {
            cur.listed.clone()
        } else {
            valid
                .into_iter()
                .map(|i| match cur.listed.iter().find(|e| e.address == i.address) {
                    Some(e) => {
                        if **e.info.load() != i {
                            e.info.store(Arc::new(i));
                        }
                        e.clone()
                    }
                    None => Arc::new(Endpoint::new(i, self.stats.clone())),
                })
                .collect()
        };
        let changed = listed.len() != cur.listed.len()
            || listed.iter().zip(&cur.listed).any(|(a, b)| !Arc::ptr_eq(a, b));
        let meta = View {
            epoch: r.epoch,
            revision: r.revision,
            settling: r.settling,
            known: r.known || cur.known,
            ..View::empty()
        };
        self.install(&meta, listed);
        changed
    }

    /// Builds and installs a view with `meta`'s epoch/revision and the given list, applying the
    /// quarantine. Call with `update` held.
    fn install(&self, meta: &View, listed: Vec<Arc<Endpoint>>) -> Arc<View> {
        let now = Instant::now();
        let mut q = self.quarantine.lock();
        q.retain(|addr, until| *until > now && listed.iter().any(|e| &e.address == addr));
        let mut active: Vec<Arc<Endpoint>> =
            listed.iter().filter(|e| !q.contains_key(&e.address)).cloned().collect();
        let readmit_at = q.values().min().copied();
        drop(q);
        if active.is_empty() {
            active = listed.clone();
        }
        let ring = HashRing::new(active.iter().map(|e| (e.address.as_str(), e.weight())));
        let cum_weights = active
            .iter()
            .scan(0u64, |acc, e| {
                *acc += e.weight() as u64;
                Some(*acc)
            })
            .collect();
        let v = Arc::new(View {
            epoch: meta.epoch,
            revision: meta.revision,
            settling: meta.settling,
            known: meta.known,
            listed,
            active,
            ring,
            cum_weights,
            readmit_at,
        });
        self.view.store(v.clone());
        v
    }

    /// Leaves out an instance that stopped answering, for the quarantine time.
    fn drop_endpoint(&self, ep: &Endpoint, why: &Error) {
        let _g = self.update.lock();
        let cur = self.view.load_full();
        if !cur.listed.iter().any(|e| e.address == ep.address) {
            return;
        }
        let fresh =
            self.quarantine.lock().insert(ep.address.clone(), Instant::now() + self.config.quarantine);
        if fresh.is_none() {
            self.stats.instances_dropped.fetch_add(1, Relaxed);
            tracing::info!(service = %self.service, address = %ep.address, error = %why, "instance stopped answering; leaving it out");
        }
        self.install(&cur, cur.listed.clone());
    }

    fn no_instances(&self, view: &View) -> Error {
        if view.known {
            Error::NoInstances { service: self.service.clone() }
        } else {
            Error::UnknownService(self.service.clone())
        }
    }

    /// Picks an instance for `route`, avoiding those already `tried` by this call.
    fn pick(&self, view: &View, route: &Route, tried: &[Arc<Endpoint>]) -> Option<Arc<Endpoint>> {
        let was_tried = |e: &Arc<Endpoint>| tried.iter().any(|t| Arc::ptr_eq(t, e));
        let active = &view.active;
        match route {
            Route::Address(a) => view.listed.iter().find(|e| &e.address == a && !was_tried(e)).cloned(),
            Route::Key(h) => {
                view.ring.node_skipping(*h, |i| was_tried(&active[i])).map(|i| active[i].clone())
            }
            Route::Balanced if active.is_empty() => None,
            Route::Balanced => match self.config.balance {
                Balance::RoundRobin => {
                    let total = *view.cum_weights.last()?;
                    let x = self.rr.fetch_add(1, Relaxed) % total;
                    let first = view.cum_weights.partition_point(|&c| c <= x);
                    (0..active.len())
                        .map(|k| &active[(first + k) % active.len()])
                        .find(|e| !was_tried(e))
                        .cloned()
                }
                Balance::LeastOutstanding => {
                    let candidates: Vec<&Arc<Endpoint>> = if tried.is_empty() {
                        active.iter().collect()
                    } else {
                        active.iter().filter(|e| !was_tried(e)).collect()
                    };
                    match candidates.len() {
                        0 => None,
                        1 => Some(candidates[0].clone()),
                        n => {
                            let a = fastrand::usize(..n);
                            let b = (a + 1 + fastrand::usize(..n - 1)) % n;
                            let (ea, eb) = (candidates[a], candidates[b]);
                            // Fewer outstanding calls per unit of weight wins.
                            let la = ea.outstanding.load(Relaxed) as u64 * eb.weight() as u64;
                            let lb = eb.outstanding.load(Relaxed) as u64 * ea.weight() as u64;
                            Some(if lb < la { eb.clone() } else { ea.clone() })
                        }
                    }
                }
            },
        }
    }

    /// Runs one call: picks an instance, connects, and hands the connection to `attempt`.
    ///
    /// An instance that cannot be connected to is left out and the next one is tried, for any
    /// call (nothing was sent). An instance whose connection fails during the call, or that
    /// answers it `ShuttingDown` (dropped at its drain deadline), is left out too; the call is
    /// then retried on another instance only if it is `idempotent` (its outcome on the first
    /// instance is unknown), otherwise it ends with that error. Every other outcome (replies,
    /// other error replies, timeouts) is returned as it is. At most `max_attempts` instances
    /// are tried.
    pub async fn call<T, F, Fut>(&self, route: &Route, idempotent: bool, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut tried: Vec<Arc<Endpoint>> = Vec::new();
        let mut last_err: Option<Error> = None;
        let mut failing_over = false;
        loop {
            let picked = {
                // A guard, not a clone: the view is only needed until the pick.
                let mut view = self.view.load();
                if view.readmit_at.is_some_and(|t| Instant::now() >= t) {
                    self.view();
                    view = self.view.load();
                }
                match tried.len() < self.config.max_attempts {
                    true => self.pick(&view, route, &tried).ok_or_else(|| self.no_instances(&view)),
                    false => Err(self.no_instances(&view)),
                }
            };
            let ep = match picked {
                Ok(ep) => ep,
                Err(none) => return Err(last_err.unwrap_or(none)),
            };
            let client = match ep.connect(&self.config.client).await {
                Ok(c) => c,
                Err(e) => {
                    self.drop_endpoint(&ep, &e);
                    tried.push(ep);
                    last_err = Some(e);
                    continue;
                }
            };
            if failing_over {
                self.stats.failovers.fetch_add(1, Relaxed);
            }
            // Only least-outstanding reads the count; the other policies skip two atomics.
            let load =
                (self.config.balance == Balance::LeastOutstanding).then(|| Outstanding::new(&ep.outstanding));
            let r = attempt(client).await;
            drop(load);
            match r {
                // A `ShuttingDown` reply: the instance dropped the call at its drain deadline
                // and is going away, like a lost connection (the call may have partly run).
                Err(e) if matches!(e, Error::Connection(_)) || e.code() == Some(Code::ShuttingDown) => {
                    self.drop_endpoint(&ep, &e);
                    if !idempotent {
                        return Err(e);
                    }
                    failing_over = true;
                    tried.push(ep);
                    last_err = Some(e);
                }
                other => return other,
            }
        }
    }

    /// Transport counters of the live connections of this pool.
    pub fn counters(&self) -> Snapshot {
        let mut acc = Snapshot::default();
        for e in &self.view.load().listed {
            add_snapshot(&mut acc, &e.counters());
        }
        acc
    }
}

/// Counts a call as outstanding on an instance until dropped (also when the caller gives up).
struct Outstanding<'a>(&'a AtomicUsize);

impl<'a> Outstanding<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Relaxed);
        Outstanding(n)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(balance: Balance) -> Pool {
        let config = PoolConfig {
            balance,
            quarantine: Duration::from_secs(60),
            max_attempts: 3,
            client: ClientConfig::default(),
            keep_last_good: true,
        };
        Pool::new("svc".into(), config, Arc::default())
    }

    fn inst(id: u64, addr: &str, weight: u32) -> Instance {
        Instance {
            id,
            lease: 1,
            service: "svc".into(),
            address: addr.into(),
            weight,
            metadata: Default::default(),
        }
    }

    fn resolved(epoch: u64, revision: u64, settling: bool, instances: Vec<Instance>) -> Resolved {
        Resolved { service: "svc".into(), epoch, revision, known: true, settling, instances }
    }

    fn addresses(p: &Pool) -> Vec<String> {
        let mut a: Vec<String> = p.view().listed.iter().map(|e| e.address.clone()).collect();
        a.sort();
        a
    }

    #[test]
    fn an_empty_or_invalid_update_keeps_the_last_good_list() {
        let p = pool(Balance::RoundRobin);
        assert!(p.apply(resolved(1, 1, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 1)])));
        assert!(!p.apply(resolved(1, 2, false, vec![])));
        assert_eq!(addresses(&p), ["tcp://h:1", "tcp://h:2"]);
        assert_eq!(p.position(), (1, 2, false), "the revision still moves on");
        let bad = vec![inst(3, "nonsense", 1), inst(4, "tcp://h:4", 0)];
        assert!(!p.apply(resolved(1, 3, false, bad)));
        assert_eq!(addresses(&p), ["tcp://h:1", "tcp://h:2"]);
        // A real change is applied, and an unchanged instance keeps its endpoint (connection).
        let before = p.view().listed.iter().find(|e| e.address == "tcp://h:1").unwrap().clone();
        assert!(p.apply(resolved(1, 4, false, vec![inst(1, "tcp://h:1", 1)])));
        assert_eq!(addresses(&p), ["tcp://h:1"]);
        assert!(Arc::ptr_eq(&before, &p.view().listed[0]));
    }

    #[test]
    fn a_settling_controller_adds_but_does_not_remove() {
        let p = pool(Balance::RoundRobin);
        p.apply(resolved(1, 5, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 1)]));
        // The controller restarted (new epoch); only one server registered again so far.
        p.apply(resolved(2, 1, true, vec![inst(7, "tcp://h:2", 1), inst(8, "tcp://h:3", 1)]));
        assert_eq!(addresses(&p), ["tcp://h:1", "tcp://h:2", "tcp://h:3"]);
        // Settled: the list is the registry's again.
        p.apply(resolved(2, 1, false, vec![inst(7, "tcp://h:2", 1), inst(8, "tcp://h:3", 1)]));
        assert_eq!(addresses(&p), ["tcp://h:2", "tcp://h:3"]);
    }

    #[test]
    fn round_robin_follows_weights() {
        let p = pool(Balance::RoundRobin);
        p.apply(resolved(1, 1, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 3)]));
        let v = p.view();
        let mut counts = FxHashMap::default();
        for _ in 0..400 {
            *counts.entry(p.pick(&v, &Route::Balanced, &[]).unwrap().address.clone()).or_insert(0) += 1;
        }
        assert_eq!(counts["tcp://h:1"], 100);
        assert_eq!(counts["tcp://h:2"], 300);
    }

    #[test]
    fn least_outstanding_prefers_the_idle_instance() {
        let p = pool(Balance::LeastOutstanding);
        p.apply(resolved(1, 1, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 1)]));
        let v = p.view();
        let busy = v.listed.iter().find(|e| e.address == "tcp://h:1").unwrap();
        busy.outstanding.store(10, Relaxed);
        for _ in 0..100 {
            assert_eq!(p.pick(&v, &Route::Balanced, &[]).unwrap().address, "tcp://h:2");
        }
    }

    #[test]
    fn a_dropped_instance_is_left_out_unless_it_is_the_last() {
        let p = pool(Balance::RoundRobin);
        p.apply(resolved(1, 1, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 1)]));
        let v = p.view();
        let one = v.listed.iter().find(|e| e.address == "tcp://h:1").unwrap().clone();
        p.drop_endpoint(&one, &Error::Connection("reset".into()));
        p.drop_endpoint(&one, &Error::Connection("reset".into()));
        assert_eq!(p.stats.instances_dropped.load(Relaxed), 1, "counted once");
        let v = p.view();
        for _ in 0..10 {
            assert_eq!(p.pick(&v, &Route::Balanced, &[]).unwrap().address, "tcp://h:2");
            assert_eq!(p.pick(&v, &Route::Key(fastrand::u64(..)), &[]).unwrap().address, "tcp://h:2");
        }
        // Still listed (the registry lists it), so scatter-gather still reaches it.
        assert_eq!(v.listed.len(), 2);
        let two = v.listed.iter().find(|e| e.address == "tcp://h:2").unwrap().clone();
        p.drop_endpoint(&two, &Error::Connection("reset".into()));
        assert_eq!(p.view().active.len(), 2, "with every instance left out, all are tried again");
    }
}
