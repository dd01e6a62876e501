//! Keepalive: is the peer of a connection still there? A small state machine that is told the
//! time and how many reads have completed, and answers what to do: nothing yet, send a ping,
//! or give the peer up. It reads no clock and starts no timer, so it is tested with made-up
//! instants; the server's connection loop and the client's keepalive task drive it, each with
//! its own timer.
//!
//! It counts reads instead of reading the clock on every one: a read is the hot path, and a
//! counter is all the state machine needs to tell "something arrived since I last looked".

use std::time::{Duration, Instant};

/// Keepalive settings: after `interval` without receiving anything, send a ping; if nothing
/// arrives within `timeout` after it, the peer is declared dead and the connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Keepalive {
    pub fn new(interval: Duration, timeout: Duration) -> Keepalive {
        Keepalive { interval, timeout }
    }
}

impl Default for Keepalive {
    /// A ping after 30 s without traffic; dead 20 s after it.
    fn default() -> Self {
        Keepalive { interval: Duration::from_secs(30), timeout: Duration::from_secs(20) }
    }
}

/// What the driver should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing until [`Liveness::deadline`].
    Wait,
    /// Send a ping (and keep driving).
    Ping,
    /// Nothing arrived within the timeout after a ping: close the connection.
    Dead,
}

/// The keepalive state of one connection.
#[derive(Debug)]
pub(crate) struct Liveness {
    cfg: Keepalive,
    /// The read count seen at the last decision.
    seen: u64,
    ping_out: bool,
    deadline: Instant,
}

impl Liveness {
    pub(crate) fn new(cfg: Keepalive, now: Instant) -> Liveness {
        Liveness { cfg, seen: 0, ping_out: false, deadline: now + cfg.interval }
    }

    /// When [`poll`](Self::poll) has something to decide next.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Decides, given the time and the number of reads completed on the connection so far.
    pub(crate) fn poll(&mut self, now: Instant, reads: u64) -> Action {
        if now < self.deadline {
            return Action::Wait;
        }
        if reads != self.seen {
            // Traffic since the last look: the peer is there; look again an interval from now.
            (self.seen, self.ping_out, self.deadline) = (reads, false, now + self.cfg.interval);
            Action::Wait
        } else if !self.ping_out {
            (self.ping_out, self.deadline) = (true, now + self.cfg.timeout);
            Action::Ping
        } else {
            Action::Dead
        }
    }

    /// How long the peer had to answer the ping, for the error a dead connection reports.
    pub(crate) fn timeout(&self) -> Duration {
        self.cfg.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn live() -> (Liveness, Instant) {
        let t0 = Instant::now();
        (Liveness::new(Keepalive::new(30 * S, 20 * S), t0), t0)
    }

    #[test]
    fn an_idle_peer_is_pinged_after_the_interval_and_dead_after_the_timeout() {
        let (mut l, t0) = live();
        assert_eq!(l.poll(t0 + 29 * S, 0), Action::Wait);
        assert_eq!(l.poll(t0 + 30 * S, 0), Action::Ping);
        assert_eq!(l.deadline(), t0 + 50 * S);
        assert_eq!(l.poll(t0 + 49 * S, 0), Action::Wait);
        assert_eq!(l.poll(t0 + 50 * S, 0), Action::Dead);
    }

    #[test]
    fn traffic_puts_off_the_ping_by_an_interval_from_when_it_is_seen() {
        let (mut l, t0) = live();
        assert_eq!(l.poll(t0 + 30 * S, 5), Action::Wait);
        assert_eq!(l.deadline(), t0 + 60 * S);
        assert_eq!(l.poll(t0 + 60 * S, 5), Action::Ping);
    }

    #[test]
    fn an_answer_to_the_ping_keeps_the_connection() {
        let (mut l, t0) = live();
        assert_eq!(l.poll(t0 + 30 * S, 0), Action::Ping);
        // The pong (or anything else) arrives: one more read.
        assert_eq!(l.poll(t0 + 50 * S, 1), Action::Wait);
        assert_eq!(l.deadline(), t0 + 80 * S);
        assert_eq!(l.poll(t0 + 80 * S, 1), Action::Ping);
        assert_eq!(l.poll(t0 + 100 * S, 1), Action::Dead);
    }

    #[test]
    fn a_late_tick_decides_by_what_it_sees_then() {
        let (mut l, t0) = live();
        // The driver's timer fired very late (a stalled machine): still one step at a time,
        // never dead without a ping first.
        assert_eq!(l.poll(t0 + 500 * S, 0), Action::Ping);
        assert_eq!(l.poll(t0 + 501 * S, 0), Action::Wait);
        assert_eq!(l.poll(t0 + 520 * S, 0), Action::Dead);
    }
}
