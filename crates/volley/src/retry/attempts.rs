//! One call through a [`Pool`]: pick an instance, connect, attempt; retry on another instance
//! when the error allows it (and the budget does), hedge a slow attempt with a second one, and
//! let each attempt's outcome teach the pool (ejections, latency, failures in a row).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::Budget;
use super::hedge::{Hedge, P95};
use super::policy::RetryBudget;
use crate::balance::{Endpoint, Outstanding, Pick, Pool, Reason, unreachable};
use crate::client::Client;
use crate::error::Error;
use crate::proto::Code;

/// What the pool needs to know about a call to retry it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Safe to send again (retries, failover after a lost connection, hedges).
    pub idempotent: bool,
    /// No retry starts after this.
    pub deadline: Option<Instant>,
    /// The request can be sent again when its server never ran it (`Error::NotRun`).
    pub resend_unrun: bool,
}

impl Plan {
    pub fn new(idempotent: bool, deadline: Option<Instant>) -> Plan {
        Plan { idempotent, deadline, resend_unrun: true }
    }

    /// A request that goes out once, whatever happens after its connection is made (a batch
    /// chunk, which is not copied for a second attempt: its items fail with the error).
    pub fn once() -> Plan {
        Plan { idempotent: false, deadline: None, resend_unrun: false }
    }
}

/// How calls to one service are retried and hedged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryConfig {
    /// Most instances one call tries (idempotent calls fail over; any call moves on when
    /// connecting fails, since nothing was sent).
    pub max_attempts: usize,
    /// Retries of idempotent calls after retryable errors, and the budget for them and for
    /// hedges (`None`: failover after a lost connection only, unbudgeted).
    pub retry_budget: Option<RetryBudget>,
    pub hedge: Option<Hedge>,
}

impl RetryConfig {
    /// Failover after a lost connection only, over at most `max_attempts` instances.
    pub fn failover(max_attempts: usize) -> RetryConfig {
        RetryConfig { max_attempts, retry_budget: None, hedge: None }
    }
}

/// The instances of one service and the state its calls' retries and hedges keep: what an
/// owner (a service client, the controller's relay) holds per service.
pub(crate) struct Retrier {
    pub pool: Arc<Pool>,
    config: RetryConfig,
    /// Tokens for retries and hedges: the configured budget, or a default one for hedges.
    budget: Option<Budget>,
    /// The service's latency, for hedging after its 95th percentile.
    p95: P95,
    /// Attempts are timed (for the pool, or for hedging after the p95).
    measures: bool,
}

impl Retrier {
    pub fn new(pool: Arc<Pool>, config: RetryConfig) -> Retrier {
        let budget = config.retry_budget.or(config.hedge.map(|_| RetryBudget::default()));
        let measures = pool.load.measures || matches!(config.hedge, Some(Hedge::P95 { .. }));
        Retrier { pool, config, budget: budget.as_ref().map(Budget::new), p95: P95::new(), measures }
    }

    /// Whether `e` lets an idempotent call be sent again: with a retry budget, a lost or closed
    /// connection, `Overloaded` or `ShuttingDown`; without one, only a lost connection or
    /// `ShuttingDown` (failover).
    fn retryable(&self, e: &Error) -> bool {
        unreachable(e)
            || (self.config.retry_budget.is_some()
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
        if let Some(b) = &self.budget {
            b.deposit();
        }
        let mut tried: Vec<Arc<Endpoint>> = Vec::new();
        let mut last_err: Option<Error> = None;
        loop {
            let ep = match self.pool.next(route, &tried, self.config.max_attempts) {
                Ok(ep) => ep,
                Err(none) => return Err(last_err.unwrap_or(none)),
            };
            let client = match ep.connect(&self.pool.config.client).await {
                Ok(c) => c,
                Err(e) => {
                    self.pool.eject(&ep, Reason::Unreachable, &e);
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
            // A request its server never ran (it was going away) is sent again whatever the
            // method, and takes no token: it adds no work to the service.
            let never_ran = plan.resend_unrun && matches!(e, Error::NotRun(_));
            if !(plan.idempotent || never_ran) || !self.may_retry(plan.deadline, tried.len(), never_ran) {
                return Err(e);
            }
            self.pool.stats.failovers.fetch_add(1, Relaxed);
            if never_ran {
                self.pool.stats.resent_unrun.fetch_add(1, Relaxed);
            }
            last_err = Some(e);
        }
    }

    /// Whether a failed call may go out again: time is left, another attempt is allowed, and
    /// the budget (if any) gives a token, unless the attempt is `free`.
    fn may_retry(&self, deadline: Option<Instant>, tried: usize, free: bool) -> bool {
        if tried >= self.config.max_attempts || deadline.is_some_and(|d| d <= Instant::now()) {
            return false;
        }
        match &self.budget {
            Some(b) if self.config.retry_budget.is_some() && !free => {
                let granted = b.withdraw();
                if !granted {
                    self.pool.stats.retries_refused.fetch_add(1, Relaxed);
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
            started: self.measures.then(Instant::now),
            _load: self.pool.load.tracks_load.then(|| Outstanding::new(ep.outstanding())),
        };
        let r = fut.await;
        let timed = watch.started.take().map(|t0| {
            let now = Instant::now();
            (now - t0, now)
        });
        self.pool.learn(ep, timed, r.as_ref().err());
        if let Some((took, now)) = timed.filter(|_| r.is_ok()) {
            self.p95.observe(took, now);
        }
        r
    }

    /// The hedge delay for this call, if it is hedged (idempotent, not pinned to one address).
    fn hedge_delay(&self, route: &Pick, idempotent: bool) -> Option<Duration> {
        if !idempotent || matches!(route, Pick::Address(_)) {
            return None;
        }
        match self.config.hedge? {
            Hedge::After(d) => Some(d),
            Hedge::P95 { initial } => Some(self.p95.get().unwrap_or(initial)),
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
            let mut skip = tried.clone();
            skip.push(ep.clone());
            self.pool.pick(&self.pool.view(), route, &skip)
        };
        let Some(b) = backup else { return primary.await };
        if !self.budget.as_ref().is_some_and(|budget| budget.withdraw()) {
            self.pool.stats.hedges_refused.fetch_add(1, Relaxed);
            return primary.await;
        }
        self.pool.stats.hedges.fetch_add(1, Relaxed);
        tried.push(b.clone());
        let backup = async {
            match b.connect(&self.pool.config.client).await {
                Ok(c) => self.attempt(&b, attempt(c)).await,
                Err(e) => {
                    self.pool.eject(&b, Reason::Unreachable, &e);
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
