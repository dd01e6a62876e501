//! What a run records: the trace of its steps (faults, calls, handler runs, listings), and the
//! facts the invariants are checked against. One `Log` per run, shared by every simulated
//! host (all of them run on the simulation's one thread; the lock is never contended).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

/// One call made by a caller, by its request id (unique in a run).
#[derive(Debug, Clone)]
pub struct Call {
    pub caller: String,
    pub idempotent: bool,
    pub started_ms: u64,
    /// Each end the caller saw: when, and the outcome (`ok iN` or an error's kind).
    pub ends: Vec<(u64, String)>,
}

/// Everything a run records.
#[derive(Debug, Default)]
pub struct Log {
    /// The steps, in order, each stamped with simulated milliseconds.
    pub trace: Vec<String>,
    pub calls: BTreeMap<u64, Call>,
    /// Handler runs per request id: the instance and when.
    pub runs: BTreeMap<u64, Vec<(String, u64)>>,
    /// What the observer saw listed, and when.
    pub listings: Vec<(u64, BTreeSet<String>)>,
    /// Per host, the intervals it was down (crashed or drained): from, until (`None`: still).
    pub down: BTreeMap<String, Vec<(u64, Option<u64>)>>,
    /// The client id each caller held, sampled: when, caller, id.
    pub client_ids: Vec<(u64, String, u32)>,
    /// When the last fault was healed (every host up, every link whole).
    pub healed_ms: u64,
    /// What the controller held near the end: client ids, watches.
    pub held: Option<(u64, u64)>,
    /// The calls not yet ended: (started, request id), oldest first.
    pub open: BTreeSet<(u64, u64)>,
    /// Invariants broken as the run went, each when it broke (checked after every step and
    /// as each call ends or runs, not only over the finished log).
    pub step_violations: Vec<String>,
}

impl Log {
    pub fn event(&mut self, at_ms: u64, what: impl AsRef<str>) {
        self.trace.push(format!("{at_ms:>6} {}", what.as_ref()));
    }

    /// A hash of the trace: equal for two runs of one seed.
    pub fn trace_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.trace.hash(&mut h);
        h.finish()
    }

    /// A caller starts call `id`.
    pub fn start(&mut self, id: u64, call: Call) {
        self.open.insert((call.started_ms, id));
        self.calls.insert(id, call);
    }

    /// Call `id` ended at `at_ms` with `what`: it must not have ended before.
    pub fn end(&mut self, id: u64, at_ms: u64, what: String) {
        let Some(call) = self.calls.get_mut(&id) else {
            self.step_violations.push(format!("{at_ms} ms: call {id:x} ended but was never started"));
            return;
        };
        if let Some(first) = call.ends.first() {
            self.step_violations
                .push(format!("{at_ms} ms: call {id:x} ended again ({what}; first {first:?})"));
        }
        self.open.remove(&(call.started_ms, id));
        call.ends.push((at_ms, what));
    }

    /// Instance `host` starts running request `id` at `at_ms`: a caller made it, its caller was
    /// not told it never ran, and it is not run twice unless idempotent.
    pub fn run(&mut self, id: u64, host: &str, at_ms: u64) {
        let runs = self.runs.entry(id).or_default();
        runs.push((host.to_string(), at_ms));
        let runs = runs.len();
        match self.calls.get(&id) {
            None => {
                self.step_violations.push(format!("{at_ms} ms: {host} runs {id:x}, which no caller made"))
            }
            Some(c) if c.ends.iter().any(|(_, o)| o == NOT_RUN) => self
                .step_violations
                .push(format!("{at_ms} ms: {host} runs {id:x}, whose caller was told it never ran")),
            Some(c) if !c.idempotent && runs > 1 => self
                .step_violations
                .push(format!("{at_ms} ms: {host} runs {id:x} (not idempotent) a second time")),
            Some(_) => {}
        }
    }

    /// Whether `host` was down at `at_ms`, and since when.
    pub fn down_since(&self, host: &str, at_ms: u64) -> Option<u64> {
        self.down
            .get(host)?
            .iter()
            .find(|(from, until)| *from <= at_ms && until.is_none_or(|u| at_ms < u))
            .map(|(from, _)| *from)
    }
}

/// The log of a run, shared by its hosts and its driver.
#[derive(Clone, Default)]
pub struct Shared(Arc<Mutex<Log>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn event(&self, what: impl AsRef<str>) {
        self.lock().event(now_ms(), what);
    }

    pub fn take(self) -> Log {
        std::mem::take(&mut *self.lock())
    }
}

/// Simulated milliseconds since the run started (0 outside a host).
pub fn now_ms() -> u64 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64
}

/// An outcome as the trace and the checks read it: `ok` and who answered, or the error's kind
/// (never its message, which may name things that differ between equal runs).
pub fn outcome(r: &Result<u64, volley::Error>) -> String {
    use volley::Error as E;
    match r {
        Ok(n) => format!("ok i{n}"),
        Err(E::Timeout(_)) => "timeout".into(),
        Err(E::Remote(s)) => format!("remote {:?}", s.code),
        Err(E::Connection(_)) => "connection".into(),
        Err(E::NotRun(_)) => NOT_RUN.into(),
        Err(E::NoInstances { .. }) => "no-instances".into(),
        Err(E::UnknownService(_)) => "unknown-service".into(),
        Err(E::Closed) => "closed".into(),
        Err(other) => format!("other {other}"),
    }
}

pub const NOT_RUN: &str = "not-run";
