//! What a caller learns about an instance's latency from its own calls: a peak-sensitive
//! moving average (for the load-aware balancer and for finding slow outliers).

use parking_lot::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How fast the average forgets: after this long, an old value weighs 1/e.
const DECAY: Duration = Duration::from_secs(10);

/// Peak EWMA (as in Finagle and Linkerd): a latency above the average replaces it at once, one
/// below pulls it down slowly, and time without samples decays it towards zero, so an instance
/// that was slow once is tried again later instead of being shunned for good.
#[derive(Debug)]
pub(crate) struct PeakEwma {
    state: Mutex<(f64, Option<Instant>)>,
}

impl PeakEwma {
    pub fn new() -> PeakEwma {
        PeakEwma { state: Mutex::new((0.0, None)) }
    }

    /// Records one call's latency.
    pub fn observe(&self, latency: Duration, now: Instant) {
        let rtt = latency.as_nanos() as f64;
        let mut s = self.state.lock();
        let decayed = decay(s.0, s.1, now);
        s.0 = if rtt > decayed { rtt } else { decayed + (rtt - decayed) * (1.0 - weight(s.1, now)) };
        s.1 = Some(now);
    }

    /// The average now, in nanoseconds; `None` before the first sample.
    pub fn get(&self, now: Instant) -> Option<f64> {
        let s = self.state.lock();
        s.1.map(|_| decay(s.0, s.1, now))
    }

    /// Forgets what was seen (an instance back from ejection starts afresh).
    pub fn reset(&self) {
        *self.state.lock() = (0.0, None);
    }
}

/// How much of the old value survives the time since `then`.
fn weight(then: Option<Instant>, now: Instant) -> f64 {
    let dt = then.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
    (-dt.as_secs_f64() / DECAY.as_secs_f64()).exp()
}

fn decay(value: f64, then: Option<Instant>, now: Instant) -> f64 {
    value * weight(then, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn peak_ewma_jumps_to_peaks_and_decays_slowly() {
        let e = PeakEwma::new();
        let t0 = Instant::now();
        assert_eq!(e.get(t0), None);
        e.observe(MS, t0);
        e.observe(50 * MS, t0);
        assert_eq!(e.get(t0), Some(50e6), "a peak replaces the average at once");
        e.observe(MS, t0 + MS);
        let after = e.get(t0 + MS).unwrap();
        assert!(after > 49e6, "one fast call barely moves it: {after}");
        let later = e.get(t0 + DECAY * 3).unwrap();
        assert!(later < 50e6 * 0.06, "time without calls decays it: {later}");
        e.reset();
        assert_eq!(e.get(t0), None);
    }
}
