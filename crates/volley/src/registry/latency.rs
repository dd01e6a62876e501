//! What a caller learns about instances' latency from its own calls: a peak-sensitive moving
//! average per instance (for the load-aware balancer and for finding slow outliers), and a
//! per-service 95th percentile (for hedging after the usual latency rather than a fixed delay).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::metrics::histogram::{Histogram, Shape, Snapshot};

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

/// The 95th percentile of a service's call latency over the last window, recomputed at most
/// once a window from a lock-free histogram that every call records into.
pub(crate) struct P95 {
    hist: Histogram,
    /// Nanoseconds; 0 until a window had enough samples.
    value: AtomicU64,
    /// The histogram at the start of the window, and when the window started.
    window: Mutex<(Snapshot, Instant)>,
}

/// One window of samples: the estimate follows changes within about this long.
const WINDOW: Duration = Duration::from_secs(1);
/// Fewer samples than this in a window say little about a 95th percentile: keep the last one.
const MIN_SAMPLES: u64 = 20;

impl P95 {
    pub fn new() -> P95 {
        let hist = Histogram::new(Shape::LATENCY_NS);
        let start = hist.snapshot();
        P95 { hist, value: AtomicU64::new(0), window: Mutex::new((start, Instant::now())) }
    }

    pub fn observe(&self, latency: Duration, now: Instant) {
        self.hist.record(latency.as_nanos() as u64, 1);
        let Some(mut w) = self.window.try_lock() else { return };
        if now.saturating_duration_since(w.1) < WINDOW && self.value.load(Relaxed) != 0 {
            return;
        }
        let all = self.hist.snapshot();
        let recent = all.since(&w.0);
        if recent.count() < MIN_SAMPLES {
            return;
        }
        if let Some(q) = recent.quantile(0.95) {
            self.value.store(q.max(1), Relaxed);
        }
        *w = (all, now);
    }

    /// The estimate; `None` until enough calls were seen.
    pub fn get(&self) -> Option<Duration> {
        match self.value.load(Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }
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

    #[tokio::test(start_paused = true)]
    async fn p95_follows_the_recent_window() {
        let p = P95::new();
        let t0 = Instant::now();
        for i in 0..100 {
            p.observe(if i % 10 == 0 { 100 * MS } else { MS }, t0);
        }
        let first = p.get().unwrap();
        assert!(first >= 90 * MS, "10 % of calls at 100 ms: {first:?}");
        // Then all calls are fast: a window later, the estimate follows.
        for _ in 0..100 {
            p.observe(MS, t0 + 2 * WINDOW);
        }
        p.observe(MS, t0 + 4 * WINDOW);
        let now = p.get().unwrap();
        assert!(now <= 2 * MS, "{now:?}");
    }
}
