//! Keepalive: is the peer of a connection still there? A small state machine that is told the
//! time and how many reads have completed, and answers what to do: nothing yet, send a ping,
//! or give the peer up. It reads no clock and starts no timer, so it is tested with made-up
//! instants; the server's connection loop and the client's keepalive task drive it, each with
//! its own timer.
//!
//! It counts reads instead of reading the clock on every one: a read is the hot path, and a
//! counter is all the state machine needs to tell "something arrived since I last looked".
//! It looks four times per interval, and counts a silence from the look *before* the one that
//! saw traffic (the last read may have come just after it): a ping may go out up to a quarter
//! of an interval early, never late, so a peer that stops is given up within `interval +
//! timeout` of its last byte. Counting from the look that saw the traffic would add up to a
//! whole interval.

use std::time::{Duration, Instant};

/// Keepalive settings: after `interval` without receiving anything, send a ping; if nothing
/// arrives within `timeout` after it, the peer is declared dead and the connection closed.
///
/// With `busy` set (clients only), a connection that has calls waiting is pinged after `busy`
/// without receiving anything instead: a peer that froze (a stopped process, a hung host whose
/// kernel still accepts bytes) fails its calls within about `busy + timeout`, as a lost
/// connection, rather than holding them to their deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
    /// The silence after which a connection with calls waiting is pinged (`None`: `interval`).
    pub busy: Option<Duration>,
}

impl Keepalive {
    pub fn new(interval: Duration, timeout: Duration) -> Keepalive {
        Keepalive { interval, timeout, busy: None }
    }

    /// Pings a connection with calls waiting after `silence` without receiving anything.
    pub fn busy(self, silence: Duration) -> Keepalive {
        Keepalive { busy: Some(silence), ..self }
    }

    /// The shortest silence that gets a ping: `interval`, or `busy` if shorter.
    fn shortest_silence(&self) -> Duration {
        self.busy.map_or(self.interval, |b| b.min(self.interval))
    }

    /// How often the state is looked at: four times per shortest silence.
    fn check_every(&self) -> Duration {
        self.shortest_silence() / LOOKS_PER_INTERVAL
    }
}

impl Default for Keepalive {
    /// A ping after 30 s without traffic; dead 20 s after it.
    fn default() -> Self {
        Keepalive { interval: Duration::from_secs(30), timeout: Duration::from_secs(20), busy: None }
    }
}

/// Looks per interval: more looks bound the error on when the silence began more tightly (a
/// quarter of an interval here), at a timer wake-up each.
const LOOKS_PER_INTERVAL: u32 = 4;

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
    /// Since when nothing may have arrived: the look before the read count was last seen to
    /// change (or the start).
    quiet_since: Instant,
    /// The last look (or the start).
    looked: Instant,
    ping_out: bool,
    deadline: Instant,
}

impl Liveness {
    pub(crate) fn new(cfg: Keepalive, now: Instant) -> Liveness {
        Liveness {
            cfg,
            seen: 0,
            quiet_since: now,
            looked: now,
            ping_out: false,
            deadline: now + cfg.check_every(),
        }
    }

    /// When [`poll`](Self::poll) has something to decide next.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Decides, given the time and the number of reads completed on the connection so far.
    pub(crate) fn poll(&mut self, now: Instant, reads: u64) -> Action {
        self.poll_busy(now, reads, false)
    }

    /// As [`poll`](Self::poll), knowing whether calls are waiting on the connection (`busy`).
    pub(crate) fn poll_busy(&mut self, now: Instant, reads: u64, busy: bool) -> Action {
        if now < self.deadline {
            return Action::Wait;
        }
        let every = self.cfg.check_every();
        let looked = std::mem::replace(&mut self.looked, now);
        if reads != self.seen {
            // Traffic since the last look: the peer is there; the silence starts at the latest
            // just after that look.
            (self.seen, self.ping_out, self.quiet_since, self.deadline) = (reads, false, looked, now + every);
            return Action::Wait;
        }
        if self.ping_out {
            return Action::Dead;
        }
        let limit = if busy { self.cfg.shortest_silence() } else { self.cfg.interval };
        if now >= self.quiet_since + limit {
            (self.ping_out, self.deadline) = (true, now + self.cfg.timeout);
            Action::Ping
        } else {
            // Look again when the idle limit is reached, or sooner to see whether calls wait.
            self.deadline = (self.quiet_since + self.cfg.interval).min(now + every);
            Action::Wait
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
        (Liveness::new(Keepalive::new(32 * S, 20 * S), t0), t0)
    }

    /// Drives `l` as a connection's timer does, with `reads(t)` reads done by time `t`, until it
    /// answers `Dead`; returns when, and when each ping went out.
    fn drive(l: &mut Liveness, reads: impl Fn(Instant) -> u64) -> (Instant, Vec<Instant>) {
        let mut pings = Vec::new();
        for _ in 0..10_000 {
            let now = l.deadline();
            match l.poll(now, reads(now)) {
                Action::Wait => {}
                Action::Ping => pings.push(now),
                Action::Dead => return (now, pings),
            }
        }
        panic!("never dead");
    }

    #[test]
    fn an_idle_peer_is_pinged_after_the_interval_and_dead_after_the_timeout() {
        let (mut l, t0) = live();
        assert_eq!(l.deadline(), t0 + 8 * S, "looks four times per interval");
        assert_eq!(l.poll(t0 + 8 * S, 0), Action::Wait);
        assert_eq!(l.poll(t0 + 31 * S, 0), Action::Wait);
        assert_eq!(l.poll(t0 + 32 * S, 0), Action::Ping);
        assert_eq!(l.deadline(), t0 + 52 * S);
        assert_eq!(l.poll(t0 + 51 * S, 0), Action::Wait);
        assert_eq!(l.poll(t0 + 52 * S, 0), Action::Dead);
    }

    #[test]
    fn traffic_puts_off_the_ping_by_an_interval_from_the_look_before_it() {
        let (mut l, t0) = live();
        assert_eq!(l.poll(t0 + 8 * S, 5), Action::Wait);
        assert_eq!(l.deadline(), t0 + 16 * S);
        // The reads may have come just after the start: the silence counts from there.
        assert_eq!(l.poll(t0 + 16 * S, 5), Action::Wait);
        assert_eq!(l.deadline(), t0 + 24 * S);
        assert_eq!(l.poll(t0 + 24 * S, 5), Action::Wait);
        assert_eq!(l.poll(t0 + 32 * S, 5), Action::Ping);
    }

    /// A peer that sends for a moment and then parks (never reads, never answers) is given up
    /// within interval + timeout of its last byte, wherever that falls between two looks.
    #[test]
    fn a_peer_that_goes_quiet_is_given_up_within_interval_plus_timeout_of_its_last_read() {
        let (interval, timeout) = (32 * S, 20 * S);
        for last_ms in [0u64, 1, 500, 7_999, 8_000, 8_001, 15_999, 23_000, 23_999] {
            let t0 = Instant::now();
            let mut l = Liveness::new(Keepalive::new(interval, timeout), t0);
            let last = t0 + Duration::from_millis(last_ms);
            // A read at the start (the first request) and one at `last`, before the first ping.
            let (dead, pings) = drive(&mut l, |now| 1 + u64::from(now >= last));
            assert!(dead <= last + interval + timeout, "last read at {last_ms} ms: dead at {:?}", dead - t0);
            assert!(dead >= last + interval * 3 / 4 + timeout, "dead too early: {:?}", dead - t0);
            assert_eq!(pings.len(), 1);
        }
    }

    #[test]
    fn an_answer_to_the_ping_keeps_the_connection() {
        let (mut l, t0) = live();
        assert_eq!(l.poll(t0 + 32 * S, 0), Action::Ping);
        // The pong (or anything else) arrives: one more read.
        assert_eq!(l.poll(t0 + 52 * S, 1), Action::Wait);
        assert_eq!(l.deadline(), t0 + 60 * S);
        // Silent since the look that sent the ping, at the latest.
        assert_eq!(l.poll(t0 + 60 * S, 1), Action::Wait);
        assert_eq!(l.deadline(), t0 + 64 * S);
        assert_eq!(l.poll(t0 + 64 * S, 1), Action::Ping);
        assert_eq!(l.poll(t0 + 84 * S, 1), Action::Dead);
    }

    #[test]
    fn a_busy_connection_is_pinged_after_the_shorter_silence() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut l = Liveness::new(Keepalive::new(30 * S, 2 * S).busy(S), t0);
        assert_eq!(l.deadline(), t0 + 250 * ms, "looks four times per busy interval");
        // Idle: no ping before the interval, however often it looks.
        assert_eq!(l.poll_busy(t0 + S, 0, false), Action::Wait);
        assert_eq!(l.deadline(), t0 + 1250 * ms);
        // Calls are waiting and nothing came for a second: ping; dead after the timeout.
        assert_eq!(l.poll_busy(t0 + 2 * S, 0, true), Action::Ping);
        assert_eq!(l.poll_busy(t0 + 3 * S, 0, true), Action::Wait);
        assert_eq!(l.poll_busy(t0 + 4 * S, 0, true), Action::Dead);
        // Replies keep a busy connection alive without pings.
        let mut l = Liveness::new(Keepalive::new(30 * S, 2 * S).busy(S), t0);
        for k in 1..40 {
            assert_eq!(l.poll_busy(t0 + k * 250 * ms, k as u64, true), Action::Wait);
        }
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
