//! The invariants, checked against a run's log once it has ended.

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

/// Every invariant the log breaks, one line each (empty: none).
pub fn violations(log: &Log, scenario: Scenario) -> Vec<String> {
    let mut v = Vec::new();
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
