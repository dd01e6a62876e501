//! What is kept per (service, method), on a server or on the clients of a process: calls,
//! errors by code, latency, calls in flight, and the sizes of the batches they came in.
//!
//! Recording is a handful of relaxed atomic adds on counters that belong to the method; the
//! handle is resolved once (when a handler is registered, or on a client method's first call),
//! so a call never looks anything up by name, takes a lock or allocates.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use thread_local::ThreadLocal;

use super::histogram::{Histogram, Shape, Snapshot};
use crate::error::{Error, Status};
use crate::proto::Code;

/// The error labels, in the order of the counters. The first 13 are the wire's codes; the rest
/// are failures a client sees without an error reply.
pub(crate) const ERROR_LABELS: [&str; 21] = [
    "unknown_service",
    "unknown_method",
    "bad_request",
    "application",
    "panicked",
    "overloaded",
    "shutting_down",
    "cancelled",
    "deadline_exceeded",
    "internal",
    "unauthenticated",
    "protocol",
    "too_large",
    "other",
    "timeout",
    "connection",
    "encode",
    "decode",
    "closed",
    "no_instances",
    "usage",
];

/// The counter index of an error reply's code.
pub(crate) fn code_index(code: Code) -> usize {
    match code.to_u16() {
        c @ 1..=13 => c as usize - 1,
        _ => 13,
    }
}

/// The counter index of a failed call, as its caller sees it.
pub(crate) fn error_index(e: &Error) -> usize {
    match e {
        Error::Remote(status) => code_index(status.code),
        Error::Timeout(_) => 14,
        Error::Connection(_) | Error::NotRun(_) => 15,
        Error::Encode(_) => 16,
        Error::Decode(_) => 17,
        Error::Closed => 18,
        Error::NoInstances { .. } | Error::UnknownService { .. } => 19,
        Error::Usage(_) => 20,
        Error::Protocol(_) => code_index(Code::Protocol),
        Error::TooLarge { .. } => code_index(Code::TooLarge),
        Error::Unauthenticated(_) => code_index(Code::Unauthenticated),
        _ => 13,
    }
}

/// How a call is measured.
#[derive(Clone, Copy)]
pub(crate) enum Timing {
    /// Every call timed, its batch size recorded: a server's handler batch, a client's chunk
    /// (a few reads of the clock per batch cost nothing per request).
    Batch,
    /// A client's single call: counted always, timed one in [`SAMPLE_EVERY`] per thread.
    Single,
}

/// A client times one single call in this many (per thread and method). A read of the TSC
/// costs about 25 ns on the development VM, so timing every call (two reads) cost 9% of the
/// throughput of the 256-caller tcp echo (BENCHMARKS.md, "Metrics"); counts stay exact, and at
/// the rates where sampling makes a difference the quantiles of one call in 16 are as good.
pub(crate) const SAMPLE_EVERY: u64 = 16;

/// Counts kept per thread and written only by their thread: a plain load and store each,
/// not an atomic add (which costs several times more); a scrape sums the threads' tallies.
#[derive(Default)]
pub(crate) struct Tally {
    started: AtomicU64,
    ended: AtomicU64,
    /// Single calls since the last one timed.
    untimed: AtomicU64,
}

/// A number for this thread, unique for the life of the process. Neither a thread-local's
/// address nor the `thread_local` crate's thread ids will do: both are reused once a thread
/// exits, and a call may end on another thread than the one it started on.
#[inline]
pub(crate) fn thread_token() -> u64 {
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    static NEXT: AtomicU64 = AtomicU64::new(1);
    TOKEN.with(|t| match t.get() {
        0 => {
            let token = NEXT.fetch_add(1, Relaxed);
            t.set(token);
            token
        }
        token => token,
    })
}

/// This thread's tally of a client method, and the [`thread_token`] of the thread it belongs to.
pub(crate) type Home = (&'static Tally, u64);

/// Adds `n` to a counter only this thread writes.
#[inline]
fn bump(c: &AtomicU64, n: u64) -> u64 {
    let v = c.load(Relaxed).wrapping_add(n);
    c.store(v, Relaxed);
    v
}

/// The metrics of one method.
pub(crate) struct MethodMetrics {
    pub(crate) service: Box<str>,
    pub(crate) method: Box<str>,
    tallies: ThreadLocal<Tally>,
    errors: [AtomicU64; ERROR_LABELS.len()],
    /// Nanoseconds from the start of a call (a server: the handler's batch) to its end, for
    /// every call timed.
    latency: Histogram,
    /// Requests per handler batch (server) or per batch chunk (client).
    batch: Histogram,
}

impl MethodMetrics {
    pub(crate) fn new(service: &str, method: &str) -> MethodMetrics {
        MethodMetrics {
            service: service.into(),
            method: method.into(),
            tallies: ThreadLocal::new(),
            errors: Default::default(),
            latency: Histogram::new(Shape::LATENCY_NS),
            batch: Histogram::new(Shape::COUNT),
        }
    }

    /// This thread's tally (a client's per-thread cache keeps it beside the method).
    #[inline]
    pub(crate) fn tally(&self) -> &Tally {
        self.tallies.get_or_default()
    }

    /// `n` calls start together on the thread of tally `t`; the time they started, if they
    /// are timed.
    #[inline]
    pub(crate) fn start(&self, t: &Tally, n: usize, timing: Timing) -> Option<quanta::Instant> {
        bump(&t.started, n as u64);
        match timing {
            Timing::Batch => self.batch.record(n as u64, 1),
            Timing::Single => {
                if bump(&t.untimed, 1) % SAMPLE_EVERY != 1 {
                    return None;
                }
            }
        }
        Some(quanta::Instant::now())
    }

    /// `n` calls ended (timed from `at`, if they were); `home` is the tally they started on, if
    /// known: when they end on its thread, the `thread_local` table need not be searched.
    ///
    /// Inlined, with what most calls skip (another thread's tally, a sampled call's timing)
    /// out of line: a client's single call then starts and ends its meter in about 33
    /// instructions, where an out-of-line `end` made it about 50 (`scripts/callcost.py`).
    #[inline]
    pub(crate) fn end(&self, n: usize, at: Option<quanta::Instant>, home: Option<Home>) {
        let tally = match home {
            Some((tally, token)) if token == thread_token() => tally,
            _ => self.this_threads_tally(),
        };
        bump(&tally.ended, n as u64);
        if let Some(at) = at {
            self.timed(at, n);
        }
    }

    #[inline(never)]
    fn this_threads_tally(&self) -> &Tally {
        self.tallies.get_or_default()
    }

    #[inline(never)]
    fn timed(&self, at: quanta::Instant, n: usize) {
        let ns = quanta::Instant::now().saturating_duration_since(at).as_nanos() as u64;
        self.latency.record(ns, n as u64);
    }

    /// Counts one error at counter `index` (see [`code_index`], [`error_index`]).
    #[inline]
    pub(crate) fn error(&self, index: usize) {
        self.errors(index, 1);
    }

    pub(crate) fn errors(&self, index: usize, n: u64) {
        self.errors[index].fetch_add(n, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MethodSnapshot {
        // Ends are read before starts, so a call ending meanwhile cannot show as -1 in flight.
        let ended: u64 = self.tallies.iter().map(|t| t.ended.load(Relaxed)).sum();
        let started: u64 = self.tallies.iter().map(|t| t.started.load(Relaxed)).sum();
        MethodSnapshot {
            calls: ended,
            errors: std::array::from_fn(|i| self.errors[i].load(Relaxed)),
            in_flight: started.saturating_sub(ended),
            latency: self.latency.snapshot(),
            batch: self.batch.snapshot(),
        }
    }
}

/// One method's metrics at one moment.
#[derive(Clone)]
pub(crate) struct MethodSnapshot {
    pub calls: u64,
    pub errors: [u64; ERROR_LABELS.len()],
    pub in_flight: u64,
    pub latency: Snapshot,
    pub batch: Snapshot,
}

impl MethodSnapshot {
    pub(crate) fn error_total(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// Calls being measured, on a client (a call or a batch chunk) or a server (a handler batch):
/// they end exactly once, when finished or dropped (calls whose caller gave up, or whose work
/// a server dropped at its shutdown deadline, count as `cancelled`).
pub(crate) struct Meter<R: Deref<Target = MethodMetrics>> {
    method: R,
    home: Option<Home>,
    n: usize,
    at: Option<quanta::Instant>,
    ended: bool,
}

/// A client's meter: its methods live as long as the process.
pub(crate) type CallMeter = Meter<&'static MethodMetrics>;

impl<R: Deref<Target = MethodMetrics>> Meter<R> {
    pub(crate) fn start(method: R, n: usize, timing: Timing) -> Self {
        let at = method.start(method.tally(), n, timing);
        Meter { method, home: None, n, at, ended: false }
    }

    /// [`start`](Self::start), with this thread's tally of the method already at hand.
    pub(crate) fn start_on(method: R, home: Home, n: usize, timing: Timing) -> Self {
        let at = method.start(home.0, n, timing);
        Meter { method, home: Some(home), n, at, ended: false }
    }

    /// A client's call ended with `result`.
    #[inline]
    pub(crate) fn finish<T>(self, result: &Result<T, Error>) {
        if let Err(e) = result {
            self.method.error(error_index(e));
        }
        self.end();
    }

    /// A client's chunk of calls ended, with one result each.
    pub(crate) fn finish_all<T>(self, results: &[Result<T, Error>]) {
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            self.method.error(error_index(e));
        }
        self.end();
    }

    /// A server's handler batch ended, with one result per request.
    pub(crate) fn answered<T>(self, results: &[Result<T, Status>]) {
        for s in results.iter().filter_map(|r| r.as_ref().err()) {
            self.method.error(code_index(s.code));
        }
        self.end();
    }

    /// The method's metrics, to count errors one by one before [`end`](Self::end).
    pub(crate) fn method(&self) -> &MethodMetrics {
        &self.method
    }

    #[inline]
    pub(crate) fn end(mut self) {
        self.ended = true;
        self.method.end(self.n, self.at, self.home);
    }
}

impl<R: Deref<Target = MethodMetrics>> Drop for Meter<R> {
    fn drop(&mut self) {
        if !self.ended {
            for _ in 0..self.n {
                self.method.error(code_index(Code::Cancelled));
            }
            self.method.end(self.n, self.at, self.home);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_code_has_its_own_label() {
        for c in 1..=13u16 {
            let label = ERROR_LABELS[code_index(Code::from_u16(c))];
            assert_eq!(label, ERROR_LABELS[c as usize - 1]);
        }
        assert_eq!(ERROR_LABELS[code_index(Code::Overloaded)], "overloaded");
        assert_eq!(ERROR_LABELS[code_index(Code::Other(999))], "other");
        assert_eq!(ERROR_LABELS[error_index(&Error::Timeout(Default::default()))], "timeout");
    }

    #[test]
    fn a_dropped_meter_ends_its_calls_as_cancelled() {
        let m: &'static MethodMetrics = Box::leak(Box::new(MethodMetrics::new("s", "m")));
        CallMeter::start(m, 3, Timing::Batch).finish_all::<()>(&[Ok(()), Err(Error::Closed), Ok(())]);
        let pending = CallMeter::start(m, 1, Timing::Batch);
        assert_eq!(m.snapshot().in_flight, 1);
        drop(pending);
        let s = m.snapshot();
        assert_eq!((s.calls, s.in_flight, s.latency.count()), (4, 0, 4));
        assert_eq!(s.errors[18], 1);
        assert_eq!(s.errors[code_index(Code::Cancelled)], 1);
        assert_eq!(s.batch.count(), 2);
    }

    /// A client's call counts its end on the tally it started on when it ends on the same
    /// thread, and on its new thread's when it moved: either way every call ends once.
    #[test]
    fn calls_that_end_on_another_thread_are_counted_once() {
        let m: &'static MethodMetrics = Box::leak(Box::new(MethodMetrics::new("s", "moved")));
        let here = || (m.tally(), thread_token());
        let stay = CallMeter::start_on(m, here(), 1, Timing::Single);
        let moved: Vec<_> = (0..3).map(|_| CallMeter::start_on(m, here(), 1, Timing::Single)).collect();
        assert_eq!(m.snapshot().in_flight, 4);
        stay.finish::<()>(&Ok(()));
        std::thread::spawn(move || {
            assert_ne!(thread_token(), 0);
            moved.into_iter().for_each(|meter| meter.finish::<()>(&Ok(())));
        })
        .join()
        .unwrap();
        let s = m.snapshot();
        assert_eq!((s.calls, s.in_flight), (4, 0));
        // The other thread's ends went to its own tally, not this thread's.
        assert_eq!(m.tally().ended.load(Relaxed), 1);
    }

    #[test]
    fn single_calls_are_all_counted_and_one_in_sixteen_timed() {
        let m: &'static MethodMetrics = Box::leak(Box::new(MethodMetrics::new("s", "single")));
        for _ in 0..20 {
            CallMeter::start(m, 1, Timing::Single).finish::<()>(&Ok(()));
        }
        let s = m.snapshot();
        assert_eq!((s.calls, s.in_flight), (20, 0));
        // The 1st, the 17th ...
        assert_eq!(s.latency.count(), 20u64.div_ceil(SAMPLE_EVERY));
        assert_eq!(s.batch.count(), 0, "single calls are no batch");
    }
}
