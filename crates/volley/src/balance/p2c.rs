//! Power of two random choices (Mitzenmacher): of two instances picked at random, the cheaper
//! one — by calls outstanding, or by expected wait. It adapts to slow instances without a scan
//! of them all, and does not herd every caller onto the one instance that looks best.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use tokio::time::Instant;

use super::endpoint::Endpoint;

/// Power of two choices: of two instances picked at random, the one of lower `cost`.
fn cheaper_of_two(candidates: &[Arc<Endpoint>], cost: impl Fn(&Endpoint) -> f64) -> Option<Arc<Endpoint>> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0].clone()),
        n => {
            let a = fastrand::usize(..n);
            let b = (a + 1 + fastrand::usize(..n - 1)) % n;
            let (ea, eb) = (&candidates[a], &candidates[b]);
            Some(if cost(eb) < cost(ea) { eb.clone() } else { ea.clone() })
        }
    }
}

/// Power of two choices: the one with fewer calls outstanding per unit of weight.
pub(crate) fn two_choices(candidates: &[Arc<Endpoint>]) -> Option<Arc<Endpoint>> {
    cheaper_of_two(candidates, |e| e.outstanding().load(Relaxed) as f64 / e.weight() as f64)
}

/// Default cost of an instance with no latency measured yet: new instances get tried.
const UNMEASURED_NS: f64 = 1_000_000.0;

/// Power of two choices over peak-EWMA latency × (calls outstanding + 1), per unit of weight
/// (Finagle's and brpc's load-aware balancing): the instance expected to answer soonest.
pub(crate) fn two_choices_by_latency(candidates: &[Arc<Endpoint>]) -> Option<Arc<Endpoint>> {
    let now = Instant::now();
    cheaper_of_two(candidates, |e| {
        let latency = e.latency.get(now).unwrap_or(UNMEASURED_NS).max(1.0);
        latency * (e.outstanding().load(Relaxed) + 1) as f64 / e.weight() as f64
    })
}
