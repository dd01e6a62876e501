//! The resilience settings of a [`ServiceClient`](super::ServiceClient), each off unless set in
//! its [`ServiceConfig`](super::ServiceConfig): retries under a budget, hedged requests, and
//! outlier ejection. What each instance looks like to the client is in [`InstanceStats`].

use std::time::Duration;

/// Retries of failed idempotent calls, limited so that they cannot multiply the load on a
/// service that is failing: extra attempts (retries and hedges) may be at most `ratio` of the
/// calls, plus `min_per_second` so a client that makes few calls can still retry. Credit from
/// calls piles up to what 1,000 calls earn, the reserve to one second's worth.
///
/// A call is retried only if it is marked [`idempotent`](crate::CallOptions::idempotent), on
/// another instance, within its own deadline (a retry gets what is left of it), at most
/// [`ServiceConfig::max_attempts`](super::ServiceConfig::max_attempts) attempts in all, and
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

/// Outlier ejection: an instance that keeps failing, or is far slower than its peers, is taken
/// out of rotation for the [quarantine](super::ServiceConfig::quarantine) and then probed (a
/// round trip to the instance, not a caller's call) before it takes calls again.
///
/// - **Failures:** `consecutive_failures` calls in a row ended with a connection loss, a
///   timeout, or a reply `Overloaded`, `ShuttingDown`, `Internal`, `Panicked` or
///   `DeadlineExceeded` (0: off). Application errors are the request's outcome, not the
///   instance's health, and do not count.
/// - **Latency:** at most once per `check_every`, an instance whose peak-EWMA latency is more
///   than `latency_factor` times the median of the instances in rotation, and above
///   `min_latency`, is ejected (`latency_factor` 0: off).
///
/// Never more than `max_ejected_share` of the listed instances are out as outliers at once
/// (instances that cannot be reached are out regardless): a service whose instances all look
/// bad is better served by all of them.
#[derive(Debug, Clone, Copy, PartialEq, derive_setters::Setters)]
#[non_exhaustive]
pub struct Outliers {
    /// Failures in a row that eject an instance (default 5; 0: off).
    pub consecutive_failures: u32,
    /// How many times the median latency makes an instance an outlier (default 5; 0: off).
    pub latency_factor: f64,
    /// Latencies below this are never an outlier's, however they compare (default 10 ms).
    pub min_latency: Duration,
    /// How often the latencies are compared (default 1 s).
    pub check_every: Duration,
    /// The largest share of the listed instances out as outliers at once (default 0.5).
    pub max_ejected_share: f64,
}

impl Default for Outliers {
    fn default() -> Self {
        Outliers {
            consecutive_failures: 5,
            latency_factor: 5.0,
            min_latency: Duration::from_millis(10),
            check_every: Duration::from_secs(1),
            max_ejected_share: 0.5,
        }
    }
}

/// One instance of a service as a [`ServiceClient`](super::ServiceClient) sees it
/// ([`ServiceClient::instance_stats`](super::ServiceClient::instance_stats)).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct InstanceStats {
    pub address: String,
    /// Why it is out of rotation (`unreachable`, `failing`, `slow`), if it is.
    pub ejected: Option<&'static str>,
    /// Attempts sent to it (retries and hedges included; probes not).
    pub attempts: u64,
    /// Calls on it now (kept by the least-outstanding and peak-EWMA balancers and by
    /// outlier ejection).
    pub outstanding: u64,
    /// Its peak-EWMA latency, if it is measured (peak-EWMA balancing, outlier ejection).
    pub latency: Option<Duration>,
    /// The address of the connection in use: `address`, or a same-host address of the
    /// instance ([`ServiceConfig::prefer_local`](super::ServiceConfig::prefer_local)); `None`
    /// while there is no live connection.
    pub connected_to: Option<String>,
}
