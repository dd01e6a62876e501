//! The fixed seeds every test run checks, one run of each scenario per seed, and determinism.
//! Larger sweeps run on demand from the binary (`cargo run -p volley-sim --release -- --seeds
//! 1000`): not a test here, since the workspace's test run includes ignored tests.

use volley_sim::{Scenario, run};

/// Seeds every test run checks (each scenario with each). A seed that once found a bug is
/// kept here (with a note of what it found).
const FIXED_SEEDS: [u64; 2] = [1, 2];

fn check(scenario: Scenario) {
    for seed in FIXED_SEEDS {
        let report = run(scenario, seed);
        assert!(report.passed(), "{}", report.failure());
        // The run did something: calls went out and most of them were answered.
        let ok =
            report.log.calls.values().filter(|c| c.ends.iter().any(|(_, o)| o.starts_with("ok"))).count();
        assert!(ok > 100, "{scenario} seed {seed}: only {ok} calls answered\n{}", report.failure());
    }
}

#[test]
fn controller_restart() {
    check(Scenario::ControllerRestart);
}

#[test]
fn frozen_instance() {
    check(Scenario::FrozenInstance);
}

#[test]
fn lease_race() {
    check(Scenario::LeaseRace);
}

#[test]
fn rolling_deploy() {
    check(Scenario::RollingDeploy);
}

#[test]
fn flapping_instance() {
    check(Scenario::FlappingInstance);
}

#[test]
fn client_id_reuse() {
    check(Scenario::ClientIdReuse);
}

/// The same seed gives the same trace: faults, every call's outcome and time, every handler
/// run, every listing — compared by hash, run twice.
#[test]
fn a_seed_replays_exactly() {
    let a = run(Scenario::FlappingInstance, 7);
    let b = run(Scenario::FlappingInstance, 7);
    assert!(a.log.trace.len() > 100, "a trace of substance");
    assert_eq!(
        a.log.trace_hash(),
        b.log.trace_hash(),
        "first difference: {:?}",
        first_difference(&a.log.trace, &b.log.trace)
    );
    let c = run(Scenario::FlappingInstance, 8);
    assert_ne!(a.log.trace_hash(), c.log.trace_hash(), "another seed, another run");
}

fn first_difference(a: &[String], b: &[String]) -> Option<(String, String)> {
    a.iter().zip(b).find(|(x, y)| x != y).map(|(x, y)| (x.clone(), y.clone()))
}
