//! An adaptive bound on the requests a server works on at once, so that under overload it
//! answers [`Overloaded`](crate::Code::Overloaded) at once instead of queueing work its callers
//! will have given up on by the time it runs.
//!
//! Why a bound at all: a busy server keeps reading, and without one every request read waits
//! behind all those read before it. Once that wait passes the callers' deadlines, every answer
//! is late: the server stays busy and serves nobody (`volley bench overload` measures it). A
//! fixed bound (`max_queued`) must be tuned per handler and per machine; this one follows the
//! latency it observes.
//!
//! The rule is a gradient limit (the shape of Netflix's concurrency-limits and brpc's automatic
//! limiter). Every window, from the mean *sojourn* of the requests answered in it (read from the
//! connection → reply queued), the limit becomes
//!
//! ```text
//! limit × clamp(target / sojourn, ½, 1)  (+ √limit if the limit was reached in the window)
//! ```
//!
//! with `target` the larger of the configured target and `tolerance` × the no-load sojourn.
//! Latency above target shrinks the limit at once, by up to half per window; a limit that binds
//! while latency is under target grows by √limit per window. The no-load sojourn is measured
//! only where the limit sits at its floor (no queue can be shorter there): a handler slower by
//! itself than the target (one that waits 50 ms on a disk) first drives the limit to the floor,
//! where its own time is measured and lifts the target, and the limit grows back. The target is
//! absolute, not only a ratio to a baseline, because a baseline measured under load lets the
//! queue ratchet up.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Settings of the adaptive concurrency limit (see [`ServerBuilder::concurrency_limit`]).
///
/// [`ServerBuilder::concurrency_limit`]: crate::ServerBuilder::concurrency_limit
#[derive(Debug, Clone, Copy, PartialEq, derive_setters::Setters)]
#[non_exhaustive]
pub struct ConcurrencyLimit {
    /// The sojourn (read → reply queued) the limit aims to keep requests under. Default 5 ms:
    /// well under the tens of milliseconds callers usually allow, so that replies stay on time
    /// even after the wait in the socket before a request is read.
    pub target: Duration,
    /// A sojourn up to this multiple of the no-load sojourn is tolerated even above `target`,
    /// so a handler that takes long by itself (say it waits 50 ms on a disk) is not throttled
    /// to the floor. Default 2.
    pub tolerance: f64,
    /// The limit when the server starts. Default 256.
    pub initial: usize,
    /// The limit never goes below this. Default 4.
    pub min: usize,
    /// The limit never goes above this. Default 50,000 (the default `max_queued`).
    pub max: usize,
    /// How often the limit is adjusted. Default 100 ms.
    pub window: Duration,
}

impl Default for ConcurrencyLimit {
    fn default() -> Self {
        ConcurrencyLimit {
            target: Duration::from_millis(5),
            tolerance: 2.0,
            initial: 256,
            min: 4,
            max: 50_000,
            window: Duration::from_millis(100),
        }
    }
}

/// The limit and the requests admitted under it, shared by every connection of a server.
pub(crate) struct Limiter {
    config: ConcurrencyLimit,
    limit: AtomicUsize,
    in_flight: AtomicUsize,
    /// The most requests in flight at once in the current window.
    peak: AtomicUsize,
    window: Mutex<Window>,
}

/// What the current window saw.
struct Window {
    started: Instant,
    sojourn_secs: f64,
    answered: u64,
    /// The limit as a real number: whole steps would stall the growth of a small limit.
    limit: f64,
    no_load: Option<f64>,
}

impl Limiter {
    pub fn new(config: ConcurrencyLimit, now: Instant) -> Limiter {
        let min = config.min.max(1);
        let config = ConcurrencyLimit { min, max: config.max.max(min), ..config };
        let initial = config.initial.clamp(config.min, config.max);
        Limiter {
            config,
            limit: AtomicUsize::new(initial),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            window: Mutex::new(Window {
                started: now,
                sojourn_secs: 0.0,
                answered: 0,
                limit: initial as f64,
                no_load: None,
            }),
        }
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.limit.load(Relaxed)
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Relaxed)
    }

    /// Admits up to `n` requests and returns how many; the caller refuses the rest. With
    /// `whole`, admits the `n` items of a batch request all or none — it is one unit of work —
    /// and returns what they count as (0: refused): at most half the limit, so that one batch
    /// cannot crowd out the single requests beside it; it is always admitted when nothing is in
    /// flight, so that no batch is too big to ever run. What is returned is what
    /// [`done`](Self::done) must be given back.
    pub fn admit(&self, n: usize, whole: bool) -> usize {
        let limit = self.limit.load(Relaxed);
        let mut current = self.in_flight.load(Relaxed);
        loop {
            let room = limit.saturating_sub(current);
            let share = n.min((limit / 2).max(1));
            let take = match (whole, current) {
                (true, 0) => share,
                (true, _) if share <= room => share,
                (true, _) => 0,
                (false, _) => n.min(room),
            };
            if take == 0 {
                return 0;
            }
            match self.in_flight.compare_exchange_weak(current, current + take, Relaxed, Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(current + take, Relaxed);
                    return take;
                }
                Err(now) => current = now,
            }
        }
    }

    /// `n` admitted requests were answered, `sojourn` after they were read.
    pub fn done(&self, n: usize, sojourn: Duration, now: Instant) {
        if n == 0 {
            return;
        }
        self.in_flight.fetch_sub(n, Relaxed);
        let mut w = self.window.lock();
        w.sojourn_secs += sojourn.as_secs_f64() * n as f64;
        w.answered += n as u64;
        if now.saturating_duration_since(w.started) >= self.config.window {
            self.adjust(&mut w, now);
        }
    }

    /// Ends the window: the new limit from its mean sojourn.
    fn adjust(&self, w: &mut Window, now: Instant) {
        let c = &self.config;
        let sojourn = w.sojourn_secs / w.answered as f64;
        let (min, max) = (c.min as f64, c.max as f64);
        // Measured at the floor, where no queue can be shorter; above it, only ever lowered:
        // a sojourn measured under load would make a baseline that lets the queue grow.
        let at_floor = self.limit.load(Relaxed) <= c.min;
        let no_load = if at_floor { Some(sojourn) } else { w.no_load.map(|n| n.min(sojourn)) };
        let target = c.target.as_secs_f64().max(c.tolerance * no_load.unwrap_or(0.0));
        let gradient = if sojourn > 0.0 { (target / sojourn).clamp(0.5, 1.0) } else { 1.0 };
        let reached = self.peak.swap(self.in_flight.load(Relaxed), Relaxed) >= self.limit.load(Relaxed);
        let growth = if reached { w.limit.sqrt() } else { 0.0 };
        w.limit = (w.limit * gradient + growth).clamp(min, max);
        w.no_load = no_load;
        w.started = now;
        w.sojourn_secs = 0.0;
        w.answered = 0;
        self.limit.store(w.limit as usize, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(initial: usize) -> (Limiter, Instant) {
        let t0 = Instant::now();
        let config = ConcurrencyLimit { initial, ..ConcurrencyLimit::default() };
        (Limiter::new(config, t0), t0)
    }

    /// Runs `windows` windows in which `n` requests are admitted at once (as many as the limit
    /// lets in) and answered after `sojourn(admitted)`; returns the limit after each window.
    fn drive(
        l: &Limiter,
        t0: Instant,
        windows: u32,
        n: usize,
        sojourn: impl Fn(usize) -> Duration,
    ) -> Vec<usize> {
        (1..=windows)
            .map(|i| {
                let admitted = l.admit(n, false);
                l.done(admitted, sojourn(admitted), t0 + l.config.window * i);
                l.limit()
            })
            .collect()
    }

    #[test]
    fn admits_up_to_the_limit_and_counts_what_is_in_flight() {
        let (l, t0) = limiter(10);
        assert_eq!(l.admit(7, false), 7);
        assert_eq!(l.admit(7, false), 3, "only the room left");
        assert_eq!(l.admit(1, false), 0);
        assert_eq!(l.in_flight(), 10);
        l.done(4, Duration::from_millis(1), t0);
        assert_eq!(l.in_flight(), 6);
        assert_eq!(l.admit(5, true), 0, "a batch is admitted whole or not at all");
        assert_eq!(l.admit(4, true), 4);
    }

    #[test]
    fn a_batch_larger_than_the_limit_runs_when_nothing_else_does_and_takes_half() {
        let (l, t0) = limiter(4);
        assert_eq!(l.admit(1_000, true), 2, "counted as half the limit");
        assert_eq!(l.admit(1, false), 1, "single requests keep the other half");
        assert_eq!(l.admit(1_000, true), 0, "a second batch does not fit beside them");
        l.done(2, Duration::from_millis(1), t0);
        assert_eq!(l.in_flight(), 1);
    }

    #[test]
    fn latency_above_the_target_shrinks_the_limit_to_what_meets_it() {
        // Work that takes 200 µs per request, served one after another: the sojourn grows
        // with the number admitted. The limit settles where it meets the 5 ms target.
        let (l, t0) = limiter(1_000);
        let limits = drive(&l, t0, 60, 10_000, |n| Duration::from_micros(200) * n as u32);
        let settled = *limits.last().unwrap();
        assert!(limits[0] < 1_000, "the first window over target shrinks it: {limits:?}");
        assert!((10..=30).contains(&settled), "25 requests of 200 µs fill 5 ms: {limits:?}");
    }

    #[test]
    fn a_binding_limit_under_the_target_grows() {
        let (l, t0) = limiter(16);
        let limits = drive(&l, t0, 20, 10_000, |_| Duration::from_micros(300));
        assert!(limits.windows(2).all(|w| w[1] > w[0]), "grows every window: {limits:?}");
    }

    #[test]
    fn a_limit_that_does_not_bind_stays() {
        let (l, t0) = limiter(64);
        let limits = drive(&l, t0, 10, 8, |_| Duration::from_micros(300));
        assert!(limits.iter().all(|&x| x == 64), "{limits:?}");
    }

    #[test]
    fn a_handler_slow_by_itself_is_not_kept_at_the_floor() {
        // Each request waits 50 ms by itself (on a disk, say), whatever the concurrency: ten
        // times the target, yet no queue. The limit falls to the floor, where that time is
        // measured and lifts the target; then it grows back.
        let (l, t0) = limiter(64);
        let limits = drive(&l, t0, 60, 10_000, |_| Duration::from_millis(50));
        assert!(limits.contains(&4), "falls to the floor first: {limits:?}");
        assert!(*limits.last().unwrap() > 64, "then grows past where it began: {limits:?}");
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let (l, t0) = limiter(8);
        let low = drive(&l, t0, 30, 10_000, |_| Duration::from_secs(1));
        assert!(low.iter().all(|&x| x >= 4), "{low:?}");
        let config = ConcurrencyLimit { initial: 8, max: 20, ..ConcurrencyLimit::default() };
        let l = Limiter::new(config, t0);
        let high = drive(&l, t0, 30, 10_000, |_| Duration::from_micros(10));
        assert_eq!(*high.last().unwrap(), 20, "{high:?}");
    }
}
