//! Instances taken out of rotation: an instance whose connection is refused or fails is
//! *ejected* — calls stop going to it — and, once its backoff has passed, *probed*: one
//! connection attempt made beside the calls, not by one of them. A probe that connects puts the
//! instance back; one that fails ejects it again for twice as long (up to 16 times the first
//! period), with a quarter of jitter so that many dead instances are not all probed at once.
//!
//! The state is per address and says why an instance is out: it could not be reached, or it is
//! an outlier (failing calls in a row, or far slower than its peers; see
//! [`Outliers`](super::Outliers)). Every reason is probed the same way: a round trip to the
//! instance that must come back.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::time::Instant;

use crate::backoff::Backoff;

/// Why an instance was taken out of rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Connecting failed, or the connection failed during a call, or the instance said it is
    /// going away.
    Unreachable,
    /// Calls to it failed that many times in a row (outlier ejection).
    Failing,
    /// Its latency was far above its peers' (outlier ejection).
    Slow,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Unreachable => "unreachable",
            Reason::Failing => "failing",
            Reason::Slow => "slow",
        }
    }

    /// Ejected as an outlier (those are capped to a share of the instances).
    pub fn is_outlier(self) -> bool {
        self != Reason::Unreachable
    }
}

/// One instance out of rotation.
#[derive(Debug)]
pub(crate) struct Ejection {
    pub reason: Reason,
    /// Failed probes since it was first ejected, as a growing pause.
    backoff: Backoff,
    /// Out of rotation until then; then it is probed.
    until: Instant,
    /// A probe is running (it was due): not probed again until it ends.
    probing: bool,
}

/// The ejected instances of one service, by address.
#[derive(Debug)]
pub(crate) struct Ejections {
    by_address: FxHashMap<String, Ejection>,
    first: Duration,
}

/// The longest pause between probes, as a multiple of the first.
const MAX_FACTOR: u32 = 16;

impl Ejections {
    /// Ejected instances are probed `first` after they failed, then after 2×, 4× ... up to 16×.
    pub fn new(first: Duration) -> Ejections {
        Ejections { by_address: FxHashMap::default(), first }
    }

    /// Takes `address` out of rotation; returns false if it already was (a failure seen by
    /// several calls at once counts once).
    pub fn eject(&mut self, address: &str, reason: Reason, now: Instant) -> bool {
        if self.by_address.contains_key(address) {
            return false;
        }
        let mut backoff = Backoff::new(self.first, self.first * MAX_FACTOR);
        let until = now + jitter(backoff.fail());
        self.by_address.insert(address.to_string(), Ejection { reason, backoff, until, probing: false });
        true
    }

    pub fn is_ejected(&self, address: &str) -> bool {
        self.by_address.contains_key(address)
    }

    /// Why `address` is out, if it is.
    pub fn reason(&self, address: &str) -> Option<Reason> {
        self.by_address.get(address).map(|e| e.reason)
    }

    /// How many instances are out as outliers.
    pub fn outliers(&self) -> usize {
        self.by_address.values().filter(|e| e.reason.is_outlier()).count()
    }

    /// The addresses due for a probe now, marked as being probed.
    pub fn take_due(&mut self, now: Instant) -> Vec<String> {
        let mut due = Vec::new();
        for (addr, e) in self.by_address.iter_mut().filter(|(_, e)| !e.probing && e.until <= now) {
            e.probing = true;
            due.push(addr.clone());
        }
        due
    }

    /// When the next probe is due (`None`: none is waiting).
    pub fn next_due(&self) -> Option<Instant> {
        self.by_address.values().filter(|e| !e.probing).map(|e| e.until).min()
    }

    /// A probe connected: `address` is back in rotation. Returns why it was out.
    pub fn readmit(&mut self, address: &str) -> Option<Reason> {
        self.by_address.remove(address).map(|e| e.reason)
    }

    /// A probe failed: out again, for longer.
    pub fn probe_failed(&mut self, address: &str, now: Instant) {
        if let Some(e) = self.by_address.get_mut(address) {
            e.until = now + jitter(e.backoff.fail());
            e.probing = false;
        }
    }

    /// Forgets instances the registry no longer lists.
    pub fn retain(&mut self, listed: impl Fn(&str) -> bool) {
        self.by_address.retain(|a, _| listed(a));
    }
}

/// When the next probe of a pool is due, read without a lock by every call.
pub(crate) struct ProbeClock {
    /// Milliseconds from `born` (`NONE`: no probe waiting).
    at: AtomicU64,
    born: Instant,
}

impl ProbeClock {
    const NONE: u64 = u64::MAX;

    pub fn set(&self, at: Option<Instant>) {
        let ms = at.map_or(Self::NONE, |t| t.saturating_duration_since(self.born).as_millis() as u64);
        self.at.store(ms, Relaxed);
    }

    /// Whether a probe is due; the caller that sees it first takes the turn to start it (and
    /// then sets the next time).
    pub fn take_turn(&self) -> bool {
        let at = self.at.load(Relaxed);
        at != Self::NONE
            && self.born.elapsed().as_millis() as u64 >= at
            && self.at.compare_exchange(at, Self::NONE, Relaxed, Relaxed).is_ok()
    }
}

impl Default for ProbeClock {
    fn default() -> Self {
        ProbeClock { at: AtomicU64::new(Self::NONE), born: Instant::now() }
    }
}

/// `d` ± 25 %.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.75 + fastrand::f64() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_probe_clock_gives_one_caller_the_turn_when_a_probe_is_due() {
        let clock = ProbeClock::default();
        assert!(!clock.take_turn(), "nothing waiting");
        clock.set(Some(Instant::now() + Duration::from_secs(1)));
        assert!(!clock.take_turn(), "not yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(clock.take_turn());
        assert!(!clock.take_turn(), "one caller takes the turn");
        clock.set(None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!clock.take_turn());
    }

    #[test]
    fn an_ejected_instance_is_probed_after_a_growing_pause() {
        let first = Duration::from_secs(1);
        let mut e = Ejections::new(first);
        let t0 = Instant::now();
        assert!(e.eject("a", Reason::Unreachable, t0));
        assert!(!e.eject("a", Reason::Unreachable, t0), "counted once");
        assert!(e.take_due(t0).is_empty());
        let due = e.next_due().unwrap() - t0;
        assert!(due >= first.mul_f64(0.75) && due <= first.mul_f64(1.25), "{due:?}");
        let t1 = t0 + first * 2;
        assert_eq!(e.take_due(t1), ["a"]);
        assert_eq!(e.next_due(), None, "being probed");
        assert!(e.take_due(t1).is_empty(), "one probe at a time");
        // Every failed probe doubles the pause, up to 16 times the first.
        let mut now = t1;
        let mut pauses = Vec::new();
        for _ in 0..6 {
            e.probe_failed("a", now);
            let pause = e.next_due().unwrap() - now;
            pauses.push(pause.as_secs_f64());
            now += pause;
            assert_eq!(e.take_due(now), ["a"]);
        }
        let nominal = [2.0, 4.0, 8.0, 16.0, 16.0, 16.0];
        for (p, n) in pauses.iter().zip(nominal) {
            assert!((n * 0.75..=n * 1.25).contains(p), "{pauses:?}");
        }
        assert_eq!(e.readmit("a"), Some(Reason::Unreachable));
        assert!(!e.is_ejected("a"));
        e.eject("b", Reason::Unreachable, now);
        e.retain(|a| a != "b");
        assert!(!e.is_ejected("b"), "an instance the registry dropped is forgotten");
    }
}
