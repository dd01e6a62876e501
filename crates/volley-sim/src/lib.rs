//! Deterministic simulation of a Volley system, replayable from a seed.
//!
//! A run builds a system from real Volley parts — a controller over the memory store, three
//! instances of a `#[volley::service]` service, callers with `ServiceClient`s in direct and
//! relayed mode, an observer of the registry — on hosts of a `turmoil` simulation: one thread,
//! a simulated network (latency, partitions, held links, crashes and restarts of a host) and
//! a simulated clock. Volley's `sim` feature carries `tcp://` over turmoil's network and puts
//! calls' deadlines on simulated time. The faults come from the seed; so do the network's
//! latencies and the library's own random choices. After the run the invariants are checked
//! (`check.rs`); the same seed gives the same trace.
//!
//! Replay one seed with its trace: `cargo run -p volley-sim --release -- --scenario NAME --seed N --trace`.

pub mod check;
pub mod faults;
pub mod record;
pub mod system;

use std::time::Duration;

use volley::service_client::Mode;

pub use faults::{Fault, Scenario, Step};
pub use record::Log;

use faults::{CALLERS, INSTANCES};
use system::{CallerSpec, Orders};

/// What one run found.
pub struct Report {
    pub scenario: Scenario,
    pub seed: u64,
    pub log: Log,
    /// The invariants the run broke (empty: none).
    pub violations: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The command that runs this seed again, printing its trace.
    pub fn replay_command(&self) -> String {
        format!(
            "cargo run -p volley-sim --release -- --scenario {} --seed {} --trace",
            self.scenario, self.seed
        )
    }

    /// The failure as a reader needs it: what broke, how to replay it, and the trace.
    pub fn failure(&self) -> String {
        let mut s =
            format!("{} seed {}: {} invariant(s) broken\n", self.scenario, self.seed, self.violations.len());
        for v in self.violations.iter().take(20) {
            s += &format!("  - {v}\n");
        }
        s += &format!("replay: {}\ntrace:\n", self.replay_command());
        for line in &self.log.trace {
            s += line;
            s.push('\n');
        }
        s
    }
}

/// Simulated time per step of the simulation.
const TICK: Duration = Duration::from_millis(5);

/// Runs `scenario` with `seed`.
pub fn run(scenario: Scenario, seed: u64) -> Report {
    // The library's random choices (balancing, jitter, lease ids) come from this thread's
    // generator; every host runs on this thread.
    fastrand::seed(seed);
    volley::transport::enable_simulation();
    let mut rng = fastrand::Rng::with_seed(seed);
    let steps = faults::schedule(scenario, &mut rng, system::TTL.as_millis() as u64);
    let max_latency = Duration::from_millis(rng.u64(2..=10));

    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(TICK)
        .simulation_duration(Duration::from_secs(30))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(max_latency)
        .build();
    let log = record::Shared::default();
    let orders = Orders::default();
    log.event(format!("{scenario} seed {seed}: max latency {max_latency:?}"));
    for s in &steps {
        log.event(format!("planned at {} ms: {}", s.at_ms, s.fault));
    }

    system::controller(&mut sim, &log);
    for n in 1..=INSTANCES.len() as u64 {
        system::instance(&mut sim, &log, &orders, n);
    }
    let sample_ids = scenario == Scenario::ClientIdReuse;
    let spec = |mode, from_ms| CallerSpec { mode, lanes: 3, from_ms, sample_ids, scenario };
    system::caller(&mut sim, &log, CALLERS[0], 1, seed, spec(Mode::Direct, system::WORK_FROM_MS));
    system::caller(&mut sim, &log, CALLERS[1], 2, seed, spec(Mode::Relayed, system::WORK_FROM_MS));
    if scenario == Scenario::ClientIdReuse {
        // Joins after the first restart of the controller began.
        let from =
            steps.iter().find(|s| matches!(s.fault, Fault::Restart(_))).map_or(3_000, |s| s.at_ms + 100);
        system::caller(&mut sim, &log, "c3", 3, seed, spec(Mode::Direct, from));
    }
    system::observer(&mut sim, &log);

    let mut violations = Vec::new();
    let mut next = 0;
    loop {
        let now = sim.elapsed().as_millis() as u64;
        while next < steps.len() && steps[next].at_ms <= now {
            apply(&mut sim, &log, &orders, &steps[next].fault, now);
            next += 1;
        }
        let done = sim.step();
        check::step(&mut log.lock(), sim.elapsed().as_millis() as u64);
        match done {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                violations.push(format!("the run did not finish: {e}"));
                break;
            }
        }
    }
    drop(sim);
    let mut log = log.take();
    log.healed_ms = steps.last().map_or(0, |s| s.at_ms);
    violations.extend(check::violations(&log, scenario));
    Report { scenario, seed, log, violations }
}

fn apply(sim: &mut turmoil::Sim<'_>, log: &record::Shared, orders: &Orders, fault: &Fault, now: u64) {
    log.lock().event(now, format!("fault: {fault}"));
    let pairs = |a: &[String], b: &[String]| {
        a.iter().flat_map(|x| b.iter().map(move |y| (x.clone(), y.clone()))).collect::<Vec<_>>()
    };
    match fault {
        Fault::Crash(h) => {
            sim.crash(h.as_str());
            log.lock().down.entry(h.clone()).or_default().push((now, None));
        }
        Fault::Restart(h) => {
            sim.bounce(h.as_str());
            let mut l = log.lock();
            if let Some(last) = l.down.get_mut(h).and_then(|d| d.last_mut()) {
                last.1.get_or_insert(now);
            }
        }
        Fault::Partition(a, b) => {
            pairs(a, b).into_iter().for_each(|(x, y)| sim.partition(x.as_str(), y.as_str()))
        }
        Fault::Repair(a, b) => pairs(a, b).into_iter().for_each(|(x, y)| sim.repair(x.as_str(), y.as_str())),
        Fault::Hold(a, b) => pairs(a, b).into_iter().for_each(|(x, y)| sim.hold(x.as_str(), y.as_str())),
        Fault::Release(a, b) => {
            pairs(a, b).into_iter().for_each(|(x, y)| sim.release(x.as_str(), y.as_str()))
        }
        Fault::Drain(h) => orders.drain(h),
    }
}
