//! The instances of one service as a caller sees them: a cached list, one connection per
//! instance, balancing, key routing, and ejecting instances that stop answering or stand out
//! (and probing them later, see [`ejection`](super::ejection)). What an attempt's outcome
//! teaches the pool is [`Pool::learn`]; the attempts themselves (retries, failover, hedges) are
//! [`retry`](crate::retry)'s.
//!
//! Used by both callers of instances: a [`ServiceClient`](crate::ServiceClient) in direct
//! mode (the list comes from the registry and is kept fresh by a watch) and the controller's
//! relay (the list comes from its own store).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio::time::Instant;

use super::ejection::{Ejections, ProbeClock, Reason};
use super::endpoint::Endpoint;
use super::p2c::{two_choices, two_choices_by_latency};
use super::policy::{InstanceStats, Outliers};
use super::ring::HashRing;
use super::stats::PoolStats;
use crate::client::ClientConfig;
use crate::discovery::{Instance, Resolved};
use crate::error::Error;
use crate::metrics::stats::Snapshot;
use crate::transport::Address;

/// How a call without a key picks among the instances of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Balance {
    /// In turn, each instance as often as its weight says.
    #[default]
    RoundRobin,
    /// Power of two choices: of two instances picked at random, the one with fewer calls
    /// outstanding (relative to its weight). Adapts to slow instances without a global scan.
    LeastOutstanding,
    /// Power of two choices by expected wait: peak-EWMA latency × (calls outstanding + 1),
    /// relative to weight (Finagle's and brpc's load-aware balancing). The average jumps to a
    /// slow reply at once and forgets it over about 10 s, so a slow instance gets few calls
    /// and is tried again later; an instance not yet measured counts as 1 ms.
    PeakEwma,
}

/// First connections to newly listed instances made at once, per pool.
const WARMING_AT_ONCE: usize = 64;

/// Probes due within this much of each other start together.
const PROBE_ROUND: Duration = Duration::from_millis(100);

/// How one call picks its instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pick {
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
    /// How long an instance that stopped answering is left out before it is probed (if the
    /// registry still lists it); each failed probe doubles it, up to 16 times.
    pub quarantine: Duration,
    /// For the connections to instances (carries the owner's client id and sequence).
    pub client: ClientConfig,
    /// Keep the last good list when an update lists no usable instance. Right for clients
    /// (the registry may have lost its state while the instances still work); the
    /// controller's relay reads its own store, which is the truth, and turns this off.
    pub keep_last_good: bool,
    pub outliers: Option<Outliers>,
    /// Connect to instances on this host through their same-host addresses.
    pub prefer_local: bool,
}

impl PoolConfig {
    /// A pool that balances by `balance` and nothing else.
    pub fn new(balance: Balance, quarantine: Duration, client: ClientConfig) -> PoolConfig {
        PoolConfig { balance, quarantine, client, keep_last_good: true, outliers: None, prefer_local: false }
    }
}

/// What the pool measures of its calls, settled once from its config.
pub(crate) struct Load {
    /// Attempts are timed for the pool (peak-EWMA balancing, outlier ejection).
    pub measures: bool,
    /// Outstanding calls are counted (least-outstanding and peak-EWMA balancing).
    pub tracks_load: bool,
    /// When latencies are next compared (outlier ejection).
    latency_check: ProbeClock,
}

impl Load {
    fn new(c: &PoolConfig) -> Load {
        let latency_check = ProbeClock::default();
        if let Some(o) = c.outliers {
            latency_check.set(Some(Instant::now() + o.check_every));
        }
        Load {
            measures: c.balance == Balance::PeakEwma || c.outliers.is_some(),
            tracks_load: matches!(c.balance, Balance::LeastOutstanding | Balance::PeakEwma),
            latency_check,
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
    /// Whether each listed instance is out of rotation (all false if every one is: trying is
    /// better than failing without trying).
    out: Vec<bool>,
    /// `listed` without the instances out of rotation.
    active: Vec<Arc<Endpoint>>,
    /// The ring over `listed`, made on the first keyed call (a caller that never routes by key
    /// never pays for it) and shared by the views that differ only in who is out.
    ring: Arc<OnceLock<HashRing>>,
    /// Prefix sums of the active instances' weights (weighted round-robin).
    cum_weights: Vec<u64>,
}

impl View {
    fn empty() -> View {
        View {
            epoch: 0,
            revision: 0,
            settling: false,
            known: false,
            listed: Vec::new(),
            out: Vec::new(),
            active: Vec::new(),
            ring: Arc::default(),
            cum_weights: Vec::new(),
        }
    }

    fn ring(&self) -> &HashRing {
        self.ring.get_or_init(|| HashRing::new(self.listed.iter().map(|e| (e.address.as_str(), e.weight()))))
    }
}

/// The instances of one service.
pub(crate) struct Pool {
    pub service: String,
    view: ArcSwap<View>,
    pub config: PoolConfig,
    pub load: Load,
    rr: AtomicU64,
    /// Instances out of rotation, and when to probe them.
    ejections: Mutex<Ejections>,
    /// When the next probe is due. Read by every call, so it lives outside the view: starting
    /// or failing a probe rebuilds nothing.
    next_probe: ProbeClock,
    /// Serializes view rebuilds (updates and ejections), which are rare.
    update: Mutex<()>,
    /// Bounds the first connections made at once to newly listed instances (a list of
    /// thousands must not open thousands of sockets in one go).
    warming: Arc<tokio::sync::Semaphore>,
    pub stats: Arc<PoolStats>,
    /// This pool, for the probes it starts.
    me: Weak<Pool>,
}

impl Pool {
    pub fn new(service: String, config: PoolConfig, stats: Arc<PoolStats>) -> Arc<Pool> {
        Arc::new_cyclic(|me| Pool {
            service,
            view: ArcSwap::from_pointee(View::empty()),
            ejections: Mutex::new(Ejections::new(config.quarantine)),
            next_probe: ProbeClock::default(),
            load: Load::new(&config),
            config,
            rr: AtomicU64::new(0),
            update: Mutex::new(()),
            warming: Arc::new(tokio::sync::Semaphore::new(WARMING_AT_ONCE)),
            stats,
            me: me.clone(),
        })
    }

    /// The current view.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
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
    ///   calls that work); instances that really died are ejected when calls to them fail.
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
        let held: FxHashMap<&str, &Arc<Endpoint>> =
            cur.listed.iter().map(|e| (e.address.as_str(), e)).collect();
        if r.settling {
            let fresh: std::collections::HashSet<String> = valid.iter().map(|i| i.address.clone()).collect();
            valid.extend(cur.listed.iter().filter(|e| !fresh.contains(&e.address)).map(|e| e.instance()));
        }
        let keep_last_good = self.config.keep_last_good && valid.is_empty() && !cur.listed.is_empty();
        if keep_last_good {
            tracing::warn!(service = %self.service, revision = r.revision, "registry update lists no usable instance; keeping the last good list");
        }
        let runtime = tokio::runtime::Handle::try_current().ok();
        let mut fresh = Vec::new();
        let listed: Vec<Arc<Endpoint>> = if keep_last_good {
            cur.listed.clone()
        } else {
            valid
                .into_iter()
                .map(|i| match held.get(i.address.as_str()) {
                    Some(&e) => {
                        e.update(i);
                        e.clone()
                    }
                    None => {
                        let e = Arc::new(Endpoint::new(i, self.stats.clone(), self.config.prefer_local));
                        if runtime.is_some() {
                            // Also in the first list: while none of it is connected, all of
                            // it is in rotation (see `install`); once one is, calls go to the
                            // connected ones rather than to addresses still being tried.
                            e.warming().store(true, Relaxed);
                            fresh.push(e.clone());
                        }
                        e
                    }
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
            // A weight may have changed in place: the ring is made again.
            ring: Arc::default(),
            ..View::empty()
        };
        if changed {
            let addresses: std::collections::HashSet<&str> =
                listed.iter().map(|e| e.address.as_str()).collect();
            self.ejections.lock().retain(|a| addresses.contains(a));
        }
        self.install(&meta, listed);
        if let Some(rt) = runtime {
            for e in fresh {
                self.warm(&rt, e);
            }
        }
        changed
    }

    /// Connects to a newly listed instance in the background and, if it was held out while
    /// warming, puts it in rotation once connected; when connecting fails it is taken out as
    /// unreachable, for the probes to bring back. Meanwhile calls go to the instances already
    /// connected: a process that has just registered may still be starting, and callers that
    /// picked it would all queue behind its first connection (a stall of every caller at each
    /// restart of a rolling deploy), and a listed address nothing listens on (a junk
    /// registration) would fail calls before it is known. When no instance is ready the
    /// warming ones are in rotation: trying beats failing without trying.
    fn warm(&self, rt: &tokio::runtime::Handle, ep: Arc<Endpoint>) {
        let (pool, config) = (self.me.clone(), self.config.client.clone());
        let permits = self.warming.clone();
        rt.spawn(async move {
            let _one_of_few = permits.acquire_owned().await;
            let connected = ep.connect(&config).await;
            ep.warming().store(false, Relaxed);
            let Some(pool) = pool.upgrade() else { return };
            let still_listed = pool.view().listed.iter().any(|l| Arc::ptr_eq(l, &ep));
            match connected {
                Ok(_) => {
                    pool.reinstall();
                }
                Err(e) if still_listed => pool.eject(&ep, Reason::Unreachable, &e),
                Err(_) => {}
            }
        });
    }

    /// Builds and installs a view with `meta`'s epoch, revision and ring and the given list,
    /// leaving out the ejected instances. Call with `update` held.
    fn install(&self, meta: &View, listed: Vec<Arc<Endpoint>>) -> Arc<View> {
        let ej = self.ejections.lock();
        let mut out: Vec<bool> = listed.iter().map(|e| ej.is_ejected(&e.address)).collect();
        drop(ej);
        let warming = |e: &Endpoint| e.warming().load(Relaxed);
        if listed.iter().zip(&out).any(|(e, &o)| !o && !warming(e)) {
            listed.iter().zip(out.iter_mut()).for_each(|(e, o)| *o |= warming(e));
        }
        if out.iter().all(|&o| o) {
            out.iter_mut().for_each(|o| *o = false);
        }
        let active: Vec<Arc<Endpoint>> =
            listed.iter().zip(&out).filter(|(_, o)| !**o).map(|(e, _)| e.clone()).collect();
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
            out,
            active,
            ring: meta.ring.clone(),
            cum_weights,
        });
        self.view.store(v.clone());
        v
    }

    /// The view again with the current ejections (same list, same ring).
    fn reinstall(&self) -> Arc<View> {
        let _g = self.update.lock();
        let cur = self.view.load_full();
        self.install(&cur, cur.listed.clone())
    }

    /// Takes an instance out of rotation until it is probed. Outliers (failing or slow) are
    /// left in if that would put more than the configured share of the instances out.
    pub fn eject(&self, ep: &Endpoint, reason: Reason, why: &Error) {
        let fresh = {
            let mut ej = self.ejections.lock();
            if reason.is_outlier() && !ej.is_ejected(&ep.address) {
                let share = self.config.outliers.map_or(0.0, |o| o.max_ejected_share);
                let listed = self.view.load().listed.len();
                if (ej.outliers() + 1) as f64 > share * listed as f64 {
                    return;
                }
            }
            let fresh = ej.eject(&ep.address, reason, Instant::now());
            self.set_next_probe(ej.next_due());
            fresh
        };
        if !fresh {
            return;
        }
        self.stats.instances_dropped.fetch_add(1, Relaxed);
        if reason.is_outlier() {
            self.stats.outliers_ejected.fetch_add(1, Relaxed);
        }
        tracing::info!(service = %self.service, address = %ep.address, reason = reason.name(), error = %why, "taking an instance out of rotation");
        self.reinstall();
    }

    fn set_next_probe(&self, at: Option<Instant>) {
        self.next_probe.set(at);
    }

    /// Probes every ejected instance that is due, each on a task of its own, beside the calls:
    /// a round trip that must come back within the connect timeout (a request for a service
    /// no server offers: any reply, the refusal included, shows the instance reads and
    /// answers; a frozen process whose kernel still accepts connections does not pass). The
    /// view does not change until a probe succeeds. Runs on a call's task, inside the runtime.
    fn start_probes(&self) {
        let due = {
            let mut ej = self.ejections.lock();
            // Those due in the next moments too: many ejected instances are probed in a few
            // rounds rather than one round each.
            let due = ej.take_due(Instant::now() + PROBE_ROUND);
            self.set_next_probe(ej.next_due());
            due
        };
        let view = self.view.load_full();
        let by_address: FxHashMap<&str, &Arc<Endpoint>> =
            view.listed.iter().map(|e| (e.address.as_str(), e)).collect();
        for address in due {
            let Some(ep) = by_address.get(address.as_str()).map(|&e| e.clone()) else { continue };
            let (pool, config) = (self.me.clone(), self.config.client.clone());
            let service = self.service.clone();
            tokio::spawn(async move {
                let answered = ep.probe(&service, &config).await;
                let Some(pool) = pool.upgrade() else { return };
                if answered.is_ok() {
                    ep.failures.store(0, Relaxed);
                    ep.latency.reset();
                }
                pool.probed(&ep.address, answered.err());
            });
        }
    }

    /// A probe's outcome: back in rotation, or out for longer.
    fn probed(&self, address: &str, failed: Option<Error>) {
        let mut ej = self.ejections.lock();
        match failed {
            None => {
                let was = ej.readmit(address);
                self.set_next_probe(ej.next_due());
                drop(ej);
                tracing::info!(service = %self.service, address, out_for = ?was, "instance answers again; back in rotation");
                self.reinstall();
            }
            Some(e) => {
                ej.probe_failed(address, Instant::now());
                self.set_next_probe(ej.next_due());
                tracing::debug!(service = %self.service, address, error = %e, "probe failed");
            }
        }
    }

    /// Each listed instance as this pool sees it.
    pub fn instance_stats(&self) -> Vec<InstanceStats> {
        let view = self.view.load_full();
        let ej = self.ejections.lock();
        let now = Instant::now();
        view.listed
            .iter()
            .map(|e| InstanceStats {
                address: e.address.clone(),
                ejected: ej.reason(&e.address).map(Reason::name),
                attempts: e.attempts.load(Relaxed),
                outstanding: e.outstanding().load(Relaxed) as u64,
                latency: e.latency.get(now).map(|ns| Duration::from_nanos(ns as u64)),
                connected_to: e.connected_to(),
            })
            .collect()
    }

    fn no_instances(&self, view: &View) -> Error {
        if view.known {
            Error::NoInstances { service: self.service.clone() }
        } else {
            Error::UnknownService(self.service.clone())
        }
    }

    /// Picks an instance for `route`, avoiding those already `tried` by this call.
    pub fn pick(&self, view: &View, route: &Pick, tried: &[Arc<Endpoint>]) -> Option<Arc<Endpoint>> {
        let was_tried = |e: &Arc<Endpoint>| tried.iter().any(|t| Arc::ptr_eq(t, e));
        let active = &view.active;
        match route {
            Pick::Address(a) => view.listed.iter().find(|e| &e.address == a && !was_tried(e)).cloned(),
            // Out of rotation or tried: the key goes to the next instance clockwise, as if that
            // one had left the ring.
            Pick::Key(h) => view
                .ring()
                .node_skipping(*h, |i| view.out[i] || was_tried(&view.listed[i]))
                .map(|i| view.listed[i].clone()),
            Pick::Balanced if active.is_empty() => None,
            Pick::Balanced => match self.config.balance {
                Balance::RoundRobin => {
                    let total = *view.cum_weights.last()?;
                    let x = self.rr.fetch_add(1, Relaxed) % total;
                    let first = view.cum_weights.partition_point(|&c| c <= x);
                    (0..active.len())
                        .map(|k| &active[(first + k) % active.len()])
                        .find(|e| !was_tried(e))
                        .cloned()
                }
                Balance::LeastOutstanding if tried.is_empty() => two_choices(active),
                Balance::LeastOutstanding => {
                    let left: Vec<Arc<Endpoint>> = active.iter().filter(|e| !was_tried(e)).cloned().collect();
                    two_choices(&left)
                }
                Balance::PeakEwma if tried.is_empty() => two_choices_by_latency(active),
                Balance::PeakEwma => {
                    let left: Vec<Arc<Endpoint>> = active.iter().filter(|e| !was_tried(e)).cloned().collect();
                    two_choices_by_latency(&left)
                }
            },
        }
    }

    /// The next instance to try, avoiding those `tried`, unless `tried` already holds
    /// `max_attempts`; starts the probes that are due.
    pub fn next(
        &self,
        route: &Pick,
        tried: &[Arc<Endpoint>],
        max_attempts: usize,
    ) -> Result<Arc<Endpoint>, Error> {
        if self.next_probe.take_turn() {
            self.start_probes();
        }
        // A guard, not a clone: the view is only needed until the pick.
        let view = self.view.load();
        match tried.len() < max_attempts {
            true => self.pick(&view, route, tried).ok_or_else(|| self.no_instances(&view)),
            false => Err(self.no_instances(&view)),
        }
    }

    /// What an attempt's outcome says about its instance: `timed` is how long it took (and
    /// when it ended), if the attempt was timed.
    pub fn learn(&self, ep: &Arc<Endpoint>, timed: Option<(Duration, Instant)>, err: Option<&Error>) {
        if let Some(e) = err.filter(|e| unreachable(e)) {
            self.eject(ep, Reason::Unreachable, e);
        }
        // A failure that came back at once says nothing about the instance's speed (a broken
        // instance that answers errors fast must not look like the fastest); a timeout does.
        if let Some((took, now)) = timed.filter(|_| err.is_none_or(|e| matches!(e, Error::Timeout(_)))) {
            ep.latency.observe(took, now);
        }
        let Some(o) = self.config.outliers else { return };
        match err.filter(|e| counts_as_failure(e)) {
            None => {
                if ep.failures.load(Relaxed) != 0 {
                    ep.failures.store(0, Relaxed);
                }
            }
            Some(e) => {
                let n = ep.failures.fetch_add(1, Relaxed) + 1;
                if o.consecutive_failures > 0 && n >= o.consecutive_failures {
                    self.eject(ep, Reason::Failing, e);
                }
            }
        }
        if o.latency_factor > 0.0 && self.load.latency_check.take_turn() {
            self.load.latency_check.set(Some(Instant::now() + o.check_every));
            self.eject_slow(o.latency_factor, o.min_latency);
        }
    }

    /// Ejects the instances in rotation whose latency is more than `factor` times the (lower)
    /// median of them all, and above `floor`.
    fn eject_slow(&self, factor: f64, floor: Duration) {
        let now = Instant::now();
        let view = self.view.load_full();
        let measured: Vec<(&Arc<Endpoint>, f64)> =
            view.active.iter().filter_map(|e| Some((e, e.latency.get(now)?))).collect();
        if measured.len() < 2 {
            return;
        }
        let mut sorted: Vec<f64> = measured.iter().map(|m| m.1).collect();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[(sorted.len() - 1) / 2];
        for (ep, latency) in measured {
            if latency > median * factor && latency > floor.as_nanos() as f64 {
                let why = Error::Timeout(Duration::from_nanos(latency as u64));
                self.eject(ep, Reason::Slow, &why);
            }
        }
    }

    /// Transport counters of the live connections of this pool.
    pub fn counters(&self) -> Snapshot {
        let mut acc = Snapshot::default();
        for e in &self.view.load().listed {
            acc.add(&e.counters());
        }
        acc
    }
}

/// The instance is gone (or going), whatever the request: leave it out.
pub(crate) fn unreachable(e: &Error) -> bool {
    matches!(e, Error::Connection(_) | Error::NotRun(_)) || e.code() == Some(crate::proto::Code::ShuttingDown)
}

/// Counts towards an instance's failures in a row (outlier ejection).
fn counts_as_failure(e: &Error) -> bool {
    use crate::proto::Code;
    matches!(e, Error::Connection(_) | Error::NotRun(_) | Error::Closed | Error::Timeout(_))
        || matches!(
            e.code(),
            Some(
                Code::Overloaded
                    | Code::ShuttingDown
                    | Code::Internal
                    | Code::Panicked
                    | Code::DeadlineExceeded
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(balance: Balance) -> Arc<Pool> {
        let config = PoolConfig::new(balance, Duration::from_secs(60), ClientConfig::default());
        Pool::new("svc".into(), config, Arc::default())
    }

    fn inst(id: u64, addr: &str, weight: u32) -> Instance {
        crate::discovery::InstanceSpec::new("svc", addr).weight(weight).instance(id, 1)
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
            *counts.entry(p.pick(&v, &Pick::Balanced, &[]).unwrap().address.clone()).or_insert(0) += 1;
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
        busy.outstanding().store(10, Relaxed);
        for _ in 0..100 {
            assert_eq!(p.pick(&v, &Pick::Balanced, &[]).unwrap().address, "tcp://h:2");
        }
    }

    /// The first list too: while none of it is connected all of it is tried; once one is,
    /// the others wait out of rotation until their own connections are made.
    #[tokio::test(flavor = "current_thread")]
    async fn the_first_list_is_in_rotation_until_one_of_it_is_connected() {
        let p = pool(Balance::RoundRobin);
        // The background connections are spawned here and do not run before this test yields.
        p.apply(resolved(1, 1, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 1)]));
        let v = p.view();
        assert!(v.listed.iter().all(|e| e.warming().load(Relaxed)), "the first list is warmed too");
        assert_eq!(v.active.len(), 2, "none connected yet: every instance is tried");
        let one = v.listed.iter().find(|e| e.address == "tcp://h:1").unwrap();
        one.warming().store(false, Relaxed);
        p.reinstall();
        let v = p.view();
        let active: Vec<&str> = v.active.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(active, ["tcp://h:1"], "the connected instance alone");
    }

    #[test]
    fn a_dropped_instance_is_left_out_unless_it_is_the_last() {
        let p = pool(Balance::RoundRobin);
        p.apply(resolved(1, 1, false, vec![inst(1, "tcp://h:1", 1), inst(2, "tcp://h:2", 1)]));
        let v = p.view();
        let one = v.listed.iter().find(|e| e.address == "tcp://h:1").unwrap().clone();
        p.eject(&one, Reason::Unreachable, &Error::Connection("reset".into()));
        p.eject(&one, Reason::Unreachable, &Error::Connection("reset".into()));
        assert_eq!(p.stats.instances_dropped.load(Relaxed), 1, "counted once");
        let v = p.view();
        for _ in 0..10 {
            assert_eq!(p.pick(&v, &Pick::Balanced, &[]).unwrap().address, "tcp://h:2");
            assert_eq!(p.pick(&v, &Pick::Key(fastrand::u64(..)), &[]).unwrap().address, "tcp://h:2");
        }
        // Still listed (the registry lists it), so scatter-gather still reaches it.
        assert_eq!(v.listed.len(), 2);
        let two = v.listed.iter().find(|e| e.address == "tcp://h:2").unwrap().clone();
        p.eject(&two, Reason::Unreachable, &Error::Connection("reset".into()));
        assert_eq!(p.view().active.len(), 2, "with every instance left out, all are tried again");
    }
}
