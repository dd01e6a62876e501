//! The balancing settings of a [`ServiceClient`](crate::ServiceClient) that are off unless set
//! in its [`ServiceConfig`](crate::service_client::ServiceConfig) (outlier ejection), and what
//! each instance looks like to the client ([`InstanceStats`]).

use std::time::Duration;

/// Outlier ejection: an instance that keeps failing, or is far slower than its peers, is taken
/// out of rotation for the [quarantine](crate::service_client::ServiceConfig::quarantine) and then probed (a
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

/// One instance of a service as a [`ServiceClient`](crate::ServiceClient) sees it
/// ([`ServiceClient::instance_stats`](crate::ServiceClient::instance_stats)).
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
    /// instance ([`ServiceConfig::prefer_local`](crate::service_client::ServiceConfig::prefer_local)); `None`
    /// while there is no live connection.
    pub connected_to: Option<String>,
}
