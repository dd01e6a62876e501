//! The retry budget of a [`ServiceClient`](crate::ServiceClient), off unless set in its
//! [`ServiceConfig`](crate::service_client::ServiceConfig).

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
