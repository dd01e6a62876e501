//! Hedged requests: their setting ([`Hedge`]), and the 95th percentile of a service's latency
//! as a caller sees it, for hedging after the usual latency rather than a fixed delay. The
//! hedged attempt itself is one of a call's attempts (`attempts.rs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::metrics::histogram::{Histogram, Shape, Snapshot};

/// Hedged (backup) requests: when an idempotent call has no reply after a delay, the same
/// request goes to a second instance and the first reply wins; the other call is dropped,
/// which sends `Cancel` so its server stops working on it. A reply that is an error the
/// [retry budget](super::RetryBudget) would retry does not win: the other call is awaited.
///
/// Hedges are extra attempts: each takes a token from the retry budget (the configured one,
/// or a default [`RetryBudget`](super::RetryBudget) if none is set), so hedging cannot double the load.
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
