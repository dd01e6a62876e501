//! What is kept per (service, method), on a server or on the clients of a process: calls,
//! errors by code, latency, calls in flight, and the sizes of the batches they came in.
//!
//! Recording is a handful of relaxed atomic adds on counters that belong to the method; the
//! handle is resolved once (when a handler is registered, or on a client method's first call),
//! so a call never looks anything up by name, takes a lock or allocates.

use std::ops::Deref;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

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
        Error::Connection(_) => 15,
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

/// The metrics of one method.
pub(crate) struct MethodMetrics {
    pub(crate) service: Box<str>,
    pub(crate) method: Box<str>,
    /// Calls that ended (answered, failed or abandoned).
    calls: AtomicU64,
    errors: [AtomicU64; ERROR_LABELS.len()],
    in_flight: AtomicI64,
    /// Nanoseconds from the start of a call (a server: the handler's batch) to its end.
    latency: Histogram,
    /// Requests per handler batch (server) or per batch chunk (client; a single call is 1).
    batch: Histogram,
}

impl MethodMetrics {
    pub(crate) fn new(service: &str, method: &str) -> MethodMetrics {
        MethodMetrics {
            service: service.into(),
            method: method.into(),
            calls: AtomicU64::new(0),
            errors: Default::default(),
            in_flight: AtomicI64::new(0),
            latency: Histogram::new(Shape::LATENCY_NS),
            batch: Histogram::new(Shape::COUNT),
        }
    }

    /// `n` calls start together (a batch of `n`).
    #[inline]
    pub(crate) fn start(&self, n: usize) -> quanta::Instant {
        self.in_flight.fetch_add(n as i64, Relaxed);
        self.batch.record(n as u64, 1);
        quanta::Instant::now()
    }

    /// `n` calls started at `at` ended.
    #[inline]
    pub(crate) fn end(&self, n: usize, at: quanta::Instant) {
        let ns = quanta::Instant::now().saturating_duration_since(at).as_nanos() as u64;
        self.latency.record(ns, n as u64);
        self.calls.fetch_add(n as u64, Relaxed);
        self.in_flight.fetch_sub(n as i64, Relaxed);
    }

    /// Counts one error at counter `index` (see [`code_index`], [`error_index`]).
    #[inline]
    pub(crate) fn error(&self, index: usize) {
        self.errors[index].fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MethodSnapshot {
        MethodSnapshot {
            calls: self.calls.load(Relaxed),
            errors: std::array::from_fn(|i| self.errors[i].load(Relaxed)),
            in_flight: self.in_flight.load(Relaxed).max(0) as u64,
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
    n: usize,
    at: quanta::Instant,
    ended: bool,
}

/// A client's meter: its methods live as long as the process.
pub(crate) type CallMeter = Meter<&'static MethodMetrics>;

impl<R: Deref<Target = MethodMetrics>> Meter<R> {
    pub(crate) fn start(method: R, n: usize) -> Self {
        let at = method.start(n);
        Meter { method, n, at, ended: false }
    }

    /// A client's call ended with `result`.
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

    pub(crate) fn end(mut self) {
        self.ended = true;
        self.method.end(self.n, self.at);
    }
}

impl<R: Deref<Target = MethodMetrics>> Drop for Meter<R> {
    fn drop(&mut self) {
        if !self.ended {
            for _ in 0..self.n {
                self.method.error(code_index(Code::Cancelled));
            }
            self.method.end(self.n, self.at);
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
        CallMeter::start(m, 3).finish_all::<()>(&[Ok(()), Err(Error::Closed), Ok(())]);
        drop(CallMeter::start(m, 1));
        let s = m.snapshot();
        assert_eq!((s.calls, s.in_flight, s.latency.count()), (4, 0, 4));
        assert_eq!(s.errors[18], 1);
        assert_eq!(s.errors[code_index(Code::Cancelled)], 1);
        assert_eq!(s.batch.count(), 2);
    }
}
