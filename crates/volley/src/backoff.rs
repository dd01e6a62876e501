//! Backoff: how long to wait before trying something that failed again — reconnecting to a
//! controller, probing an instance taken out of rotation.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// A delay that doubles on every failure, from `min` up to `max`, and starts over after a
/// success.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max: max.max(min), next: min }
    }

    /// The delay before the next try after one more failure.
    pub fn fail(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Paces connection attempts to one controller: the first attempt after a connection is lost
/// goes at once; after a failed one, every caller fails fast until the backoff has passed
/// (50 ms, doubling to 250 ms: at most 20 attempts a second, and a controller that comes back
/// is found within a quarter of a second). One attempt runs at a time; callers that arrive
/// meanwhile wait for its outcome instead of making their own.
pub(crate) struct ReconnectGate {
    /// Held for the length of one attempt.
    pub attempt: tokio::sync::Mutex<()>,
    state: Mutex<GateState>,
}

struct GateState {
    backoff: Backoff,
    /// No attempt before this (after a failure).
    not_before: Option<Instant>,
}

/// First pause after a failed attempt.
pub(crate) const RECONNECT_MIN: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
pub(crate) const RECONNECT_MAX: Duration = Duration::from_millis(250);

impl Default for ReconnectGate {
    fn default() -> Self {
        ReconnectGate {
            attempt: tokio::sync::Mutex::new(()),
            state: Mutex::new(GateState {
                backoff: Backoff::new(RECONNECT_MIN, RECONNECT_MAX),
                not_before: None,
            }),
        }
    }
}

impl ReconnectGate {
    /// Starts an attempt now, or says how long until one may start. An attempt that starts
    /// books the pause after it (in case it fails).
    pub fn begin(&self) -> Result<(), Duration> {
        let now = Instant::now();
        let mut st = self.state.lock();
        if let Some(t) = st.not_before.filter(|&t| t > now) {
            return Err(t - now);
        }
        let pause = st.backoff.fail();
        st.not_before = Some(now + pause);
        Ok(())
    }

    /// The attempt succeeded: the next loss of the connection reconnects at once.
    pub fn succeeded(&self) {
        let mut st = self.state.lock();
        st.backoff.reset();
        st.not_before = None;
    }

    /// How long until an attempt may start (zero: now).
    pub fn wait(&self) -> Duration {
        let st = self.state.lock();
        st.not_before.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(35));
        let steps: Vec<u64> = (0..4).map(|_| b.fail().as_millis() as u64).collect();
        assert_eq!(steps, [10, 20, 35, 35]);
        b.reset();
        assert_eq!(b.fail(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_lets_one_attempt_through_per_pause_and_opens_after_a_success() {
        let g = ReconnectGate::default();
        let mut attempts = 0;
        let start = Instant::now();
        // Callers hammering a controller that is down for 2 s.
        while start.elapsed() < Duration::from_secs(2) {
            if g.begin().is_ok() {
                attempts += 1;
            }
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // At 0, 50, 150, 350 ms, then every 250 ms: 10 in 2 s, never more than 20 a second.
        assert_eq!(attempts, 10);
        assert!(g.begin().is_err() && g.wait() > Duration::ZERO);
        g.succeeded();
        assert_eq!(g.wait(), Duration::ZERO);
        assert!(g.begin().is_ok(), "a connection lost after a success is retried at once");
    }
}
