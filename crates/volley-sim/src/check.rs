//! The invariants: those checked after every step of a run ([`step`], and as each call ends
//! or runs: `record::Log::end`, `Log::run`), and those checked over its log once it has ended
//! ([`violations`]).

use std::collections::BTreeSet;

use crate::faults::{INSTANCES, Scenario};
use crate::record::{Log, NOT_RUN};
use crate::system::TTL;

/// Most attempts one call makes (`ServiceConfig::max_attempts`, default).
const MAX_ATTEMPTS: usize = 3;
/// How soon after the last fault heals every live instance must be listed again: a failed
/// renewal is retried every tenth of the lease, and a restarted controller asks for a new
/// registration at the first renewal it sees; one lease time plus a second is ample.
pub fn relist_bound_ms() -> u64 {
    TTL.as_millis() as u64 + 1_000
}
/// How long a dead instance may stay listed: its lease time, the controller's expiry tick,
/// and the observer's 100 ms between looks.
pub fn dead_bound_ms() -> u64 {
    TTL.as_millis() as u64 + 100 + 200
}

/// The longest a call may stay open: its 1 s deadline, plus what a direct call may spend
/// before its deadline starts (a look-up, bounded by the registry connection's own 1 s
/// timeout, after a 0.5 s connect), plus a second of slack.
pub const OPEN_BOUND_MS: u64 = 1_000 + 1_000 + 500 + 1_000;

/// After a step at `now_ms`: no call has been open longer than [`OPEN_BOUND_MS`] (each such
/// call reported once, when it crosses the bound).
pub fn step(log: &mut Log, now_ms: u64) {
    while let Some(&(started, id)) = log.open.first() {
        if now_ms.saturating_sub(started) <= OPEN_BOUND_MS {
            break;
        }
        log.open.pop_first();
        let caller = log.calls.get(&id).map_or("?", |c| c.caller.as_str()).to_string();
        log.step_violations.push(format!(
            "{now_ms} ms: call {id:x} ({caller}) open for more than {OPEN_BOUND_MS} ms (since {started} ms)"
        ));
    }
}

/// Every invariant the log breaks, one line each (empty: none).
pub fn violations(log: &Log, scenario: Scenario) -> Vec<String> {
    let mut v = log.step_violations.clone();
    for (id, call) in &log.calls {
        let runs = log.runs.get(id).map_or(0, Vec::len);
        // Every call ends exactly once, with one outcome.
        match call.ends.as_slice() {
            [] => v.push(format!("call {id:x} ({}) never ended", call.caller)),
            [_] => {}
            more => v.push(format!("call {id:x} ended {} times: {more:?}", more.len())),
        }
        // A call that failed as never run never ran.
        if call.ends.iter().any(|(_, o)| o == NOT_RUN) && runs > 0 {
            v.push(format!(
                "call {id:x} (idempotent: {}) failed as never run but ran {runs} time(s): {:?}",
                call.idempotent, log.runs[id]
            ));
        }
        // No call ran twice unless it is idempotent (and then once per attempt at most).
        if (!call.idempotent && runs > 1) || runs > MAX_ATTEMPTS {
            v.push(format!(
                "call {id:x} (idempotent: {}) ran {runs} times: {:?}",
                call.idempotent, log.runs[id]
            ));
        }
        // A rolling deploy fails no call.
        if scenario == Scenario::RollingDeploy && call.ends.iter().any(|(_, o)| !o.starts_with("ok")) {
            v.push(format!("call {id:x} failed during a rolling deploy: {:?}", call.ends));
        }
    }
    for id in log.runs.keys() {
        if !log.calls.contains_key(id) {
            v.push(format!("request {id:x} ran but no caller made it"));
        }
    }
    // Every live instance is listed again within a bound after the last fault healed.
    let all: BTreeSet<String> = INSTANCES.iter().map(|s| s.to_string()).collect();
    match log.listings.iter().find(|(at, listed)| *at >= log.healed_ms && listed.is_superset(&all)) {
        Some((at, _)) if at - log.healed_ms <= relist_bound_ms() => {}
        Some((at, _)) => v.push(format!(
            "every instance listed again only {} ms after the last fault healed (bound {} ms)",
            at - log.healed_ms,
            relist_bound_ms()
        )),
        None => v.push(format!(
            "not every instance listed again after the last fault healed at {} ms (last listing: {:?})",
            log.healed_ms,
            log.listings.last()
        )),
    }
    // No instance listed that has been dead longer than its lease time.
    for (at, listed) in &log.listings {
        for host in listed {
            if let Some(since) = log.down_since(host, *at)
                && at - since > dead_bound_ms()
            {
                v.push(format!("{host} listed at {at} ms, dead since {since} ms"));
            }
        }
    }
    // Bounded state: near the end the callers are done and gone, so the controller holds a
    // client id only for the connections still open (three instances, the observer) and no
    // watch: what a caller, a restart or a fault left behind would show here.
    match log.held {
        Some((ids, 0)) if ids <= 4 => {}
        Some((ids, watches)) => {
            v.push(format!("the controller holds {ids} client ids and {watches} watches at the end"))
        }
        None => v.push("the controller's holdings were not read at the end".into()),
    }
    // Client ids: no two callers hold the same one.
    let mut last: std::collections::BTreeMap<&str, u32> = Default::default();
    for (_, caller, id) in &log.client_ids {
        last.insert(caller, *id);
    }
    let ids: BTreeSet<u32> = last.values().copied().collect();
    if ids.len() < last.len() {
        v.push(format!("callers share a client id: {last:?}"));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Call;

    fn call(started_ms: u64, idempotent: bool) -> Call {
        Call { caller: "c1".into(), idempotent, started_ms, ends: Vec::new() }
    }

    #[test]
    fn a_call_ending_twice_or_never_started_is_caught_when_it_happens() {
        let mut log = Log::default();
        log.start(1, call(10, false));
        log.end(1, 20, "ok i1".into());
        assert!(log.step_violations.is_empty());
        log.end(1, 30, "timeout".into());
        log.end(2, 40, "ok i2".into());
        assert_eq!(log.step_violations.len(), 2, "{:?}", log.step_violations);
        assert!(log.step_violations[0].starts_with("30 ms: call 1 ended again"));
    }

    #[test]
    fn a_run_nobody_asked_for_or_after_not_run_or_twice_is_caught() {
        let mut log = Log::default();
        log.start(1, call(0, false));
        log.run(1, "i1", 5);
        assert!(log.step_violations.is_empty());
        log.run(1, "i2", 6);
        log.run(9, "i1", 7);
        log.start(2, call(0, true));
        log.end(2, 8, NOT_RUN.into());
        log.run(2, "i3", 9);
        let v = &log.step_violations;
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(
            v[0].contains("a second time") && v[1].contains("no caller made") && v[2].contains("never ran")
        );
    }

    #[test]
    fn a_call_open_past_the_bound_is_reported_once() {
        let mut log = Log::default();
        log.start(1, call(100, true));
        log.start(2, call(200, true));
        step(&mut log, 100 + OPEN_BOUND_MS);
        assert!(log.step_violations.is_empty(), "at the bound is still in time");
        log.end(2, 300, "ok i1".into());
        step(&mut log, 101 + OPEN_BOUND_MS);
        step(&mut log, 5_000 + OPEN_BOUND_MS);
        assert_eq!(log.step_violations.len(), 1, "{:?}", log.step_violations);
        assert!(log.step_violations[0].contains("call 1 (c1) open for more than"));
    }
}
