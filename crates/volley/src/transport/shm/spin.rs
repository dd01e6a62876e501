//! Whether a reader polls its ring for a while before it sleeps, and for how long.
//!
//! Polling pays when the peer runs on a core of its own: a reply that comes back within the
//! spin costs neither side a system call (a round trip of 2–3 µs instead of about 12 µs with
//! eventfd wake-ups). It costs dearly when the cores are oversubscribed: the polling side holds
//! the very core its sleeping peer needs to wake up on, and each round trip then pays the spin
//! on both sides (measured: 110 µs instead of 12 µs; docs/BENCHMARKS.md). So the spin adapts,
//! as adaptive mutexes do: a spin that ended in sleep anyway turns spinning off for the next
//! waits, twice as many after each failed probe, and one that caught its bytes turns it back
//! on for good.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The longest spin, after the last bytes arrived. Long enough to span a busy peer's turn:
/// a server answering 8 batches of 128 echoes takes 100–200 µs here, so a 50 µs spin missed
/// every reply and both sides slept and were woken through the kernel between turns (batch
/// items/s 1.09× unix); 200 µs catches them (1.88×, 256 callers 1.12× → 1.35×; the median of
/// 5 interleaved rounds, docs/BENCHMARKS.md). A lone call's reply comes within a few µs either
/// way.
const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// The environment variable that sets the longest spin in microseconds (0: never spin).
const SPIN_ENV: &str = "VOLLEY_SHM_SPIN_US";

/// Waits without spinning after the first failed spin, and at most, between two probes.
const FIRST_BACKOFF: u32 = 8;
const MAX_BACKOFF: u32 = 1024;

/// The spin of this process: [`SPIN_ENV`] if it is set to a number, else [`DEFAULT_SPIN`].
fn longest() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| match std::env::var(SPIN_ENV) {
        Err(_) => DEFAULT_SPIN,
        Ok(v) => v.trim().parse().map(Duration::from_micros).unwrap_or_else(|_| {
            tracing::warn!(value = %v, "{SPIN_ENV} is not a number of microseconds; using the default");
            DEFAULT_SPIN
        }),
    })
}

/// One reader's spin policy.
#[derive(Debug)]
pub(super) struct Spin {
    /// Waits left before the next probe.
    skip: u32,
    /// Waits to skip after the next failed spin.
    backoff: u32,
}

impl Spin {
    pub(super) fn new() -> Spin {
        Spin { skip: 0, backoff: FIRST_BACKOFF }
    }

    /// Until when a reader that last got bytes at `last_bytes` polls before it sleeps (`None`:
    /// it sleeps at once).
    pub(super) fn until(&mut self, last_bytes: Instant) -> Option<Instant> {
        self.until_with(last_bytes, longest())
    }

    fn until_with(&mut self, last_bytes: Instant, longest: Duration) -> Option<Instant> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        (!longest.is_zero()).then(|| last_bytes + longest)
    }

    /// The bytes came while polling.
    pub(super) fn paid(&mut self) {
        self.backoff = FIRST_BACKOFF;
    }

    /// The reader polled in vain and goes to sleep.
    pub(super) fn failed(&mut self) {
        self.skip = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US_50: Duration = Duration::from_micros(50);

    fn spins(s: &mut Spin) -> bool {
        s.until_with(Instant::now(), US_50).is_some()
    }

    #[test]
    fn a_failed_spin_turns_spinning_off_for_twice_as_many_waits_each_time() {
        let mut s = Spin::new();
        assert!(spins(&mut s), "spins at first");
        for skipped in [8, 16, 32, 64] {
            s.failed();
            assert_eq!((0..skipped).filter(|_| spins(&mut s)).count(), 0, "off for {skipped} waits");
            assert!(spins(&mut s), "a probe after {skipped} waits");
        }
        for _ in 0..20 {
            s.failed();
            while !spins(&mut s) {}
        }
        s.failed();
        assert_eq!((0..MAX_BACKOFF).filter(|_| spins(&mut s)).count(), 0);
        assert!(spins(&mut s), "the back-off stops growing at {MAX_BACKOFF}");
    }

    #[test]
    fn a_spin_that_pays_keeps_spinning_on() {
        let mut s = Spin::new();
        s.failed();
        while !spins(&mut s) {}
        s.paid();
        assert!((0..100).all(|_| spins(&mut s)), "spins on while spins pay");
        s.failed();
        assert_eq!((0..FIRST_BACKOFF).filter(|_| spins(&mut s)).count(), 0, "back to the first back-off");
    }

    #[test]
    fn a_spin_of_zero_never_spins() {
        let mut s = Spin::new();
        assert_eq!(s.until_with(Instant::now(), Duration::ZERO), None);
        let t = Instant::now();
        assert_eq!(s.until_with(t, US_50), Some(t + US_50));
    }
}
