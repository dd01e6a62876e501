//! One call through a [`Pool`]: pick an instance, connect, attempt; retry on another instance
//! when the error allows it (and the budget does), hedge a slow attempt with a second one, and
//! let each attempt's outcome teach the pool (ejections, latency, failures in a row).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;

use super::ejection::Reason;
use super::endpoint::{Endpoint, Outstanding};
use super::instances::{Pick, Pool};
use super::policy::Hedge;
use crate::client::Client;
use crate::error::Error;
use crate::proto::Code;

/// What the pool needs to know about a call to retry it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    /// Safe to send again (retries, failover after a lost connection, hedges).
    pub idempotent: bool,
    /// No retry starts after this.
    pub deadline: Option<Instant>,
}

impl Plan {
    pub fn new(idempotent: bool, deadline: Option<Instant>) -> Plan {
        Plan { idempotent, deadline }
    }
}

/// The instance is gone (or going), whatever the request: leave it out.
fn unreachable(e: &Error) -> bool {
    matches!(e, Error::Connection(_)) || e.code() == Some(Code::ShuttingDown)
}

/// Counts towards an instance's failures in a row (outlier ejection).
fn counts_as_failure(e: &Error) -> bool {
    matches!(e, Error::Connection(_) | Error::Closed | Error::Timeout(_))
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

impl Pool {
    /// Whether `e` lets an idempotent call be sent again: with a retry budget, a lost or closed
    /// connection, `Overloaded` or `ShuttingDown`; without one, only a lost connection or
    /// `ShuttingDown` (failover).
    fn retryable(&self, e: &Error) -> bool {
        unreachable(e)
            || (self.guards.budgeted_retries
                && (matches!(e, Error::Closed) || e.code() == Some(Code::Overloaded)))
    }

    /// Runs one call: picks an instance, connects, and hands the connection to `attempt`.
    ///
    /// An instance that cannot be connected to is left out and the next one is tried, for any
    /// call (nothing was sent). An attempt that fails with an error the call may be retried
    /// after ([`retryable`](Self::retryable)) is repeated on another instance if the call is
    /// idempotent, its deadline has not passed and the retry budget (if one is set) has a
    /// token; otherwise the error is returned. Every other outcome (replies, other error
    /// replies, timeouts) is returned as it is. At most `max_attempts` instances are tried.
    pub async fn call<T, F, Fut>(&self, route: &Pick, plan: Plan, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        if let Some(b) = &self.guards.budget {
            b.deposit();
        }
        let mut tried: Vec<Arc<Endpoint>> = Vec::new();
        let mut last_err: Option<Error> = None;
        loop {
            let ep = match self.next(route, &tried) {
                Ok(ep) => ep,
                Err(none) => return Err(last_err.unwrap_or(none)),
            };
            let client = match ep.connect(&self.config.client).await {
                Ok(c) => c,
                Err(e) => {
                    self.eject(&ep, Reason::Unreachable, &e);
                    tried.push(ep);
                    last_err = Some(e);
                    continue;
                }
            };
            let r = match self.hedge_delay(route, plan.idempotent) {
                Some(delay) => self.hedged(route, &mut tried, &ep, client, &mut attempt, delay).await,
                None => self.attempt(&ep, attempt(client)).await,
            };
            let e = match r {
                Err(e) if self.retryable(&e) => e,
                other => return other,
            };
            tried.push(ep);
            if !plan.idempotent || !self.may_retry(plan.deadline, tried.len()) {
                return Err(e);
            }
            self.stats.failovers.fetch_add(1, Relaxed);
            last_err = Some(e);
        }
    }

    /// The next instance to try, avoiding those `tried`; starts the probes that are due.
    fn next(&self, route: &Pick, tried: &[Arc<Endpoint>]) -> Result<Arc<Endpoint>, Error> {
        if self.next_probe.take_turn() {
            self.start_probes();
        }
        // A guard, not a clone: the view is only needed until the pick.
        let view = self.view.load();
        match tried.len() < self.config.max_attempts {
            true => self.pick(&view, route, tried).ok_or_else(|| self.no_instances(&view)),
            false => Err(self.no_instances(&view)),
        }
    }

    /// Whether a failed call may go out again: time is left, another attempt is allowed, and
    /// the budget (if any) gives a token.
    fn may_retry(&self, deadline: Option<Instant>, tried: usize) -> bool {
        if tried >= self.config.max_attempts || deadline.is_some_and(|d| d <= Instant::now()) {
            return false;
        }
        match &self.guards.budget {
            Some(b) if self.guards.budgeted_retries => {
                let granted = b.withdraw();
                if !granted {
                    self.stats.retries_refused.fetch_add(1, Relaxed);
                }
                granted
            }
            _ => true,
        }
    }

    /// Runs one attempt on `ep`, counting it and learning from its outcome.
    async fn attempt<T>(
        &self,
        ep: &Arc<Endpoint>,
        fut: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        ep.attempts.fetch_add(1, Relaxed);
        let mut watch = Watch {
            ep,
            started: self.guards.measures.then(Instant::now),
            _load: self.guards.tracks_load.then(|| Outstanding::new(ep.outstanding())),
        };
        let r = fut.await;
        let started = watch.started.take();
        self.learn(ep, started, r.as_ref().err());
        r
    }

    /// What an attempt's outcome says about its instance.
    fn learn(&self, ep: &Arc<Endpoint>, started: Option<Instant>, err: Option<&Error>) {
        if let Some(e) = err.filter(|e| unreachable(e)) {
            self.eject(ep, Reason::Unreachable, e);
        }
        // A failure that came back at once says nothing about the instance's speed (a broken
        // instance that answers errors fast must not look like the fastest); a timeout does.
        if let Some(t0) = started.filter(|_| err.is_none_or(|e| matches!(e, Error::Timeout(_)))) {
            let now = Instant::now();
            ep.latency.observe(now - t0, now);
            if err.is_none() {
                self.guards.p95.observe(now - t0, now);
            }
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
        if o.latency_factor > 0.0 && self.guards.latency_check.take_turn() {
            self.guards.latency_check.set(Some(Instant::now() + o.check_every));
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

    /// The hedge delay for this call, if it is hedged (idempotent, not pinned to one address).
    fn hedge_delay(&self, route: &Pick, idempotent: bool) -> Option<Duration> {
        if !idempotent || matches!(route, Pick::Address(_)) {
            return None;
        }
        match self.config.hedge? {
            Hedge::After(d) => Some(d),
            Hedge::P95 { initial } => Some(self.guards.p95.get().unwrap_or(initial)),
        }
    }

    /// Runs the attempt on `ep`; if it has not ended after `delay`, sends the call to a second
    /// instance too (if the budget gives a token) and returns the first reply that is not a
    /// retryable error. The other attempt is dropped, which cancels it on its server.
    async fn hedged<T, F, Fut>(
        &self,
        route: &Pick,
        tried: &mut Vec<Arc<Endpoint>>,
        ep: &Arc<Endpoint>,
        client: Client,
        attempt: &mut F,
        delay: Duration,
    ) -> Result<T, Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let primary = self.attempt(ep, attempt(client));
        tokio::pin!(primary);
        tokio::select! {
            r = &mut primary => return r,
            () = tokio::time::sleep(delay) => {}
        }
        let backup = {
            let view = self.view.load();
            let mut skip = tried.clone();
            skip.push(ep.clone());
            self.pick(&view, route, &skip)
        };
        let Some(b) = backup else { return primary.await };
        if !self.guards.budget.as_ref().is_some_and(|budget| budget.withdraw()) {
            self.stats.hedges_refused.fetch_add(1, Relaxed);
            return primary.await;
        }
        self.stats.hedges.fetch_add(1, Relaxed);
        tried.push(b.clone());
        let backup = async {
            match b.connect(&self.config.client).await {
                Ok(c) => self.attempt(&b, attempt(c)).await,
                Err(e) => {
                    self.eject(&b, Reason::Unreachable, &e);
                    Err(e)
                }
            }
        };
        tokio::pin!(backup);
        let (mut primary_done, mut backup_done) = (false, false);
        loop {
            let r = tokio::select! {
                r = &mut primary, if !primary_done => { primary_done = true; r }
                r = &mut backup, if !backup_done => { backup_done = true; r }
            };
            match r {
                Err(e) if self.retryable(&e) && !(primary_done && backup_done) => {}
                other => return other,
            }
        }
    }
}

/// An attempt in progress. Dropped before it ended (the losing half of a hedge, a caller that
/// gave up), it still records how long the instance has taken so far: that instance is at
/// least that slow, and hedging must not hide a slow instance from the balancer.
struct Watch<'a> {
    ep: &'a Arc<Endpoint>,
    started: Option<Instant>,
    _load: Option<Outstanding<'a>>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if let Some(t0) = self.started.take() {
            let now = Instant::now();
            self.ep.latency.observe(now - t0, now);
        }
    }
}
