//! The retry settings of a [`ServiceClient`](crate::ServiceClient), each off unless set in its
//! [`ServiceConfig`](crate::service_client::ServiceConfig): retries under a budget, and hedged
//! requests.

use std::time::Duration;

/// Retries of failed idempotent calls, limited so that they cannot multiply the load on a
/// service that is failing: extra attempts (retries and hedges) may be at most `ratio` of the
/// calls, plus `min_per_second` so a client that makes few calls can still retry. Credit from
/// calls piles up to what 1,000 calls earn, the reserve to one second's worth.
///
/// A call is retried only if it is marked [`idempotent`](crate::CallOptions::idempotent), on
/// another instance, within its own deadline (a retry gets what is left of it), at most
/// [`ServiceConfig::max_attempts`](crate::service_client::ServiceConfig::max_attempts) attempts in all, and
/// only after an error that says the request can be sent again:
///
/// - the connection failed or closed (`Error::Connection`, `Error::Closed`: refused, reset,
///   a keepalive ping unanswered, a go-away from a server leaving);
/// - the instance answered `Overloaded` (it refused the request without running it) or
///   `ShuttingDown` (dropped at its drain deadline).
///
/// Timeouts are not retried (the deadline they spent is the call's), nor are application
/// errors or refusals that would repeat (`BadRequest`, `Unauthenticated` ...).
///
/// Without a budget (`ServiceConfig::retry_budget = None`), only a lost connection or a
/// `ShuttingDown` moves an idempotent call to another instance, unbudgeted, as it always did;
/// any call moves on when connecting fails, since nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, derive_setters::Setters)]
#[non_exhaustive]
pub struct RetryBudget {
    /// Extra attempts as a share of calls (default 0.1: one per ten calls).
    pub ratio: f64,
    /// Extra attempts allowed per second whatever the number of calls (default 10).
    pub min_per_second: u32,
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget { ratio: 0.1, min_per_second: 10 }
    }
}

/// Hedged (backup) requests: when an idempotent call has no reply after a delay, the same
/// request goes to a second instance and the first reply wins; the other call is dropped,
/// which sends `Cancel` so its server stops working on it. A reply that is an error the
/// [retry budget](RetryBudget) would retry does not win: the other call is awaited.
///
/// Hedges are extra attempts: each takes a token from the retry budget (the configured one,
/// or a default [`RetryBudget`] if none is set), so hedging cannot double the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hedge {
    /// Hedge after a fixed delay.
    After(Duration),
    /// Hedge after the 95th percentile of the service's latency as this client sees it
    /// (recomputed each second from its calls); `initial` until 20 calls were seen.
    P95 { initial: Duration },
}

impl Hedge {
    /// A hedge after the observed 95th percentile, `initial` until it is known.
    pub fn p95(initial: Duration) -> Hedge {
        Hedge::P95 { initial }
    }
}
