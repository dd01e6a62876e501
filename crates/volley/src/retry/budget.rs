//! The retry budget: how many extra attempts (retries and hedges) a client may send, so that
//! retrying cannot multiply the load on a service that is already failing. A token bucket, as
//! Finagle's `RetryBudget`: every call deposits a share of a token, every extra attempt
//! withdraws a whole one; a small reserve refilled with time lets a quiet client still retry.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::policy::RetryBudget;

/// A token, in thousandths: deposits of a share of one stay integers.
const TOKEN: i64 = 1000;
/// Credit from calls piles up to what this many calls earn: after a long healthy stretch, a
/// sudden outage gets a burst of retries, not an unbounded one.
const BURST_CALLS: i64 = 1000;

/// The bucket of one client's pools.
pub(crate) struct Budget {
    /// Thousandths of a token each call deposits.
    per_call: i64,
    cap: i64,
    balance: AtomicI64,
    /// The reserve: tokens and when they were last refilled.
    reserve: Mutex<(f64, Instant)>,
    per_second: f64,
}

impl Budget {
    pub fn new(cfg: &RetryBudget) -> Budget {
        let per_call = (cfg.ratio.clamp(0.0, 1.0) * TOKEN as f64).round() as i64;
        Budget {
            per_call,
            cap: (per_call * BURST_CALLS).max(TOKEN),
            balance: AtomicI64::new(0),
            reserve: Mutex::new((cfg.min_per_second as f64, Instant::now())),
            per_second: cfg.min_per_second as f64,
        }
    }

    /// A call started: credit its share.
    pub fn deposit(&self) {
        if self.balance.fetch_add(self.per_call, Relaxed) + self.per_call > self.cap {
            self.balance.fetch_min(self.cap, Relaxed);
        }
    }

    /// Takes one token for an extra attempt; false if there is none (the attempt is not made).
    pub fn withdraw(&self) -> bool {
        let taken = self.balance.fetch_update(Relaxed, Relaxed, |b| (b >= TOKEN).then_some(b - TOKEN));
        taken.is_ok() || self.take_from_reserve()
    }

    /// The floor: `min_per_second` tokens a second, at most one second's worth held.
    fn take_from_reserve(&self) -> bool {
        if self.per_second <= 0.0 {
            return false;
        }
        let mut r = self.reserve.lock();
        let now = Instant::now();
        let refill = now.saturating_duration_since(r.1).as_secs_f64() * self.per_second;
        *r = ((r.0 + refill).min(self.per_second), now);
        if r.0 >= 1.0 {
            r.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(ratio: f64, min_per_second: u32) -> Budget {
        Budget::new(&RetryBudget::default().ratio(ratio).min_per_second(min_per_second))
    }

    #[tokio::test(start_paused = true)]
    async fn extra_attempts_are_a_share_of_calls() {
        let b = budget(0.1, 0);
        let mut granted = 0;
        for _ in 0..1000 {
            b.deposit();
            // Every call wants a retry: only one in ten gets it.
            granted += b.withdraw() as u32;
        }
        assert_eq!(granted, 100);
        assert!(!b.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_client_can_retry_from_the_reserve() {
        let b = budget(0.1, 5);
        let granted = (0..20).filter(|_| b.withdraw()).count();
        assert_eq!(granted, 5, "one second's reserve at the start");
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!((0..20).filter(|_| b.withdraw()).count(), 2, "refilled at 5 a second");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!((0..20).filter(|_| b.withdraw()).count(), 5, "never more than a second's worth");
    }

    #[tokio::test(start_paused = true)]
    async fn credit_from_calls_is_capped() {
        let b = budget(0.5, 0);
        for _ in 0..100_000 {
            b.deposit();
        }
        assert_eq!((0..100_000).filter(|_| b.withdraw()).count(), 500);
    }
}
