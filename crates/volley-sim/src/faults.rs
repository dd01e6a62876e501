//! The scenarios and the faults each injects, drawn from the run's seed before it starts.

use std::fmt;

/// What a run puts the system through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// The controller crashes and restarts (once or twice) under direct and relayed load.
    ControllerRestart,
    /// The callers (and the relaying controller) lose one instance: its messages held (a
    /// frozen process) or dropped (a partition), then delivered or healed.
    FrozenInstance,
    /// One instance is cut from the controller for about one lease time, so its lease lapses
    /// just as its renewals come back.
    LeaseRace,
    /// Each instance in turn drains (deregister, grace, go-away) and restarts: no call fails.
    RollingDeploy,
    /// One instance flaps (cut from its callers and back, again and again) under hedging and
    /// retry budgets.
    FlappingInstance,
    /// The controller restarts twice while a caller joins between the restarts: client ids
    /// held by live callers are never handed to another.
    ClientIdReuse,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::ControllerRestart,
        Scenario::FrozenInstance,
        Scenario::LeaseRace,
        Scenario::RollingDeploy,
        Scenario::FlappingInstance,
        Scenario::ClientIdReuse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::ControllerRestart => "controller-restart",
            Scenario::FrozenInstance => "frozen-instance",
            Scenario::LeaseRace => "lease-race",
            Scenario::RollingDeploy => "rolling-deploy",
            Scenario::FlappingInstance => "flapping-instance",
            Scenario::ClientIdReuse => "client-id-reuse",
        }
    }

    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|c| c.name() == s)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault, or its healing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The host's process dies: its connections and state are gone.
    Crash(String),
    /// A crashed or drained host starts again, from scratch.
    Restart(String),
    /// Messages between the two groups are dropped, both ways. Not used by the scenarios:
    /// turmoil drops a cut link's TCP segments for good, without the retransmission real TCP
    /// makes after a partition heals, so an established stream would resume with a gap in
    /// its bytes — a fault no real network makes. A partition is a [`Fault::Hold`] instead.
    Partition(Vec<String>, Vec<String>),
    Repair(Vec<String>, Vec<String>),
    /// Messages between the two groups are held, and delivered at release: a partition (as
    /// TCP sees one: segments retransmitted once the link heals; new connections hang), or a
    /// frozen peer.
    Hold(Vec<String>, Vec<String>),
    Release(Vec<String>, Vec<String>),
    /// The instance stops gracefully (as a deploy stops it), then its process ends.
    Drain(String),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash(h) => write!(f, "crash {h}"),
            Fault::Restart(h) => write!(f, "restart {h}"),
            Fault::Partition(a, b) => write!(f, "partition {a:?} | {b:?}"),
            Fault::Repair(a, b) => write!(f, "repair {a:?} | {b:?}"),
            Fault::Hold(a, b) => write!(f, "hold {a:?} | {b:?}"),
            Fault::Release(a, b) => write!(f, "release {a:?} | {b:?}"),
            Fault::Drain(h) => write!(f, "drain {h}"),
        }
    }
}

/// A fault at a point of simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub fault: Fault,
}

/// The instances' host names.
pub const INSTANCES: [&str; 3] = ["i1", "i2", "i3"];
/// The callers: `c1` calls directly, `c2` through the controller's relay.
pub const CALLERS: [&str; 2] = ["c1", "c2"];
pub const CONTROLLER: &str = "ctl";
/// When faults may start, and by when every one is healed.
pub const FAULTS_FROM_MS: u64 = 1_500;
pub const HEALED_BY_MS: u64 = 7_000;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|h| h.to_string()).collect()
}

/// The faults of one run of `scenario`, drawn from `rng`, sorted by time; every fault is
/// healed by [`HEALED_BY_MS`].
pub fn schedule(scenario: Scenario, rng: &mut fastrand::Rng, ttl_ms: u64) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut at = |at_ms: u64, fault: Fault| steps.push(Step { at_ms, fault });
    let pick = |rng: &mut fastrand::Rng| INSTANCES[rng.usize(..INSTANCES.len())].to_string();
    match scenario {
        Scenario::ControllerRestart | Scenario::ClientIdReuse => {
            let times = if scenario == Scenario::ClientIdReuse { 2 } else { rng.u64(1..=2) };
            let mut t = FAULTS_FROM_MS + rng.u64(..1_000);
            for _ in 0..times {
                let down = rng.u64(200..1_500);
                at(t, Fault::Crash(CONTROLLER.into()));
                at(t + down, Fault::Restart(CONTROLLER.into()));
                t += down + rng.u64(500..1_500);
            }
            // Sometimes an instance dies too, and comes back only at the end: the registry
            // must stop listing it within its lease time, whatever the controller went through.
            if rng.bool() {
                let victim = pick(rng);
                at(FAULTS_FROM_MS + rng.u64(..3_000), Fault::Crash(victim.clone()));
                at(HEALED_BY_MS - 500, Fault::Restart(victim));
            }
        }
        Scenario::FrozenInstance => {
            let victim = pick(rng);
            let mut peers = s(&CALLERS);
            peers.push(CONTROLLER.into());
            let t = FAULTS_FROM_MS + rng.u64(..2_000);
            let len = rng.u64(500..3_000);
            at(t, Fault::Hold(peers.clone(), vec![victim.clone()]));
            at(t + len, Fault::Release(peers, vec![victim]));
        }
        Scenario::LeaseRace => {
            let mut t = FAULTS_FROM_MS + rng.u64(..500);
            for _ in 0..2 {
                let victim = pick(rng);
                let len = ttl_ms - 300 + rng.u64(..600);
                let ctl = vec![CONTROLLER.to_string()];
                at(t, Fault::Hold(ctl.clone(), vec![victim.clone()]));
                at(t + len, Fault::Release(ctl, vec![victim]));
                t += len + rng.u64(100..500);
            }
        }
        Scenario::RollingDeploy => {
            let mut t = FAULTS_FROM_MS + rng.u64(..300);
            for i in INSTANCES {
                at(t, Fault::Drain(i.into()));
                // Drained in about a second (see `system::DRAIN`); the new process starts
                // some time after.
                let back = t + 1_200 + rng.u64(..200);
                at(back, Fault::Restart(i.into()));
                t = back + rng.u64(200..400);
            }
        }
        Scenario::FlappingInstance => {
            let victim = pick(rng);
            let callers = s(&CALLERS);
            let mut t = FAULTS_FROM_MS + rng.u64(..300);
            while t < HEALED_BY_MS - 1_500 {
                let down = rng.u64(100..600);
                at(t, Fault::Hold(callers.clone(), vec![victim.clone()]));
                at(t + down, Fault::Release(callers.clone(), vec![victim.clone()]));
                t += down + rng.u64(100..800);
            }
        }
    }
    steps.sort_by_key(|s| s.at_ms);
    debug_assert!(steps.iter().all(|s| s.at_ms <= HEALED_BY_MS));
    steps
}
