//! The system under simulation, built from real Volley parts on simulated hosts: a controller
//! (memory store), three instances of a service written with `#[volley::service]`, callers
//! with `ServiceClient`s (one direct, one relayed; a third joins late in one scenario), and an
//! observer that reads the registry's listing.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registry};
use volley::retry::{Hedge, RetryBudget};
use volley::service_client::{Mode, ServiceConfig};
use volley::{CallOptions, ClientConfig, Drain, Server, ServiceClient, Status};

use crate::faults::{CONTROLLER, Scenario};
use crate::record::{Call, Shared, now_ms, outcome};

/// The service every instance serves.
#[volley::service]
pub trait Work {
    /// Runs request `id` (recorded per id, so the checks can count runs) and answers the
    /// number of the instance that ran it.
    async fn run(&self, id: u64) -> Result<u64, Status>;
}

struct Worker {
    number: u64,
    name: String,
    log: Shared,
}

impl Work for Worker {
    async fn run(&self, id: u64) -> Result<u64, Status> {
        self.log.lock().run(id, &self.name, now_ms());
        // 2–20 ms of work, fixed per request.
        tokio::time::sleep(Duration::from_millis(2 + id.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 19)).await;
        Ok(self.number)
    }
}

pub const REGISTRY: &str = "tcp://ctl:9000";
/// The lease time of every instance (short, so a run sees leases lapse).
pub const TTL: Duration = Duration::from_secs(2);
/// When the callers start and stop calling; when the observer stops looking.
pub const WORK_FROM_MS: u64 = 1_000;
pub const WORK_UNTIL_MS: u64 = 9_000;
pub const OBSERVE_UNTIL_MS: u64 = 11_000;
/// How a deploy stops an instance.
pub fn drain() -> Drain {
    Drain::default()
        .deregister_within(Duration::from_millis(500))
        .grace(Duration::from_millis(500))
        .deadline(Duration::from_secs(1))
}

/// Orders from the driver to hosts (which instance should drain). An instance waits for its
/// order without polling: the driver wakes the waiting instances when it gives one.
#[derive(Clone, Default)]
pub struct Orders(Arc<(Mutex<BTreeSet<String>>, tokio::sync::Notify)>);

impl Orders {
    pub fn drain(&self, host: &str) {
        self.0.0.lock().unwrap().insert(host.to_string());
        self.0.1.notify_waiters();
    }

    /// Waits until `host` is ordered to drain, and takes the order.
    async fn wait_for_drain(&self, host: &str) {
        loop {
            // Made before the look, so an order given between the two still wakes it.
            let given = self.0.1.notified();
            if self.0.0.lock().unwrap().remove(host) {
                return;
            }
            given.await;
        }
    }
}

fn connection() -> ClientConfig {
    ClientConfig::default().timeout(Duration::from_secs(1)).connect_timeout(Duration::from_millis(500))
}

async fn sleep_until_ms(ms: u64) {
    let now = now_ms();
    if ms > now {
        tokio::time::sleep(Duration::from_millis(ms - now)).await;
    }
}

/// Connects to the registry, again and again until it answers.
async fn registry(log: &Shared, who: &str) -> Registry {
    let mut tries = 0;
    loop {
        match Registry::connect_with(REGISTRY, connection()).await {
            Ok(r) => return r,
            Err(e) => {
                tries += 1;
                if tries == 1 {
                    log.event(format!("{who} waits for the registry: {}", outcome(&Err(e))));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub fn controller(sim: &mut turmoil::Sim<'_>, log: &Shared) {
    let log = log.clone();
    sim.host(CONTROLLER, move || {
        let log = log.clone();
        async move {
            let config = ControllerConfig::default()
                .expiry_tick(Duration::from_millis(100))
                .settle(TTL)
                .max_watch(Duration::from_secs(1))
                .relay_client(connection());
            let c = Controller::new(config);
            c.listen(REGISTRY).await?;
            log.event("ctl serving");
            // What the controller holds once the run has settled: bounded by what is alive.
            sleep_until_ms(OBSERVE_UNTIL_MS - 500).await;
            let st = c.stats();
            log.event(format!("ctl holds {} client ids, {} watches", st.client_ids_held, st.watches_held));
            log.lock().held = Some((st.client_ids_held, st.watches_held));
            std::future::pending::<()>().await;
            drop(c);
            Ok(())
        }
    });
}

pub fn instance(sim: &mut turmoil::Sim<'_>, log: &Shared, orders: &Orders, number: u64) {
    let (log, orders) = (log.clone(), orders.clone());
    let name = format!("i{number}");
    sim.host(name.clone(), move || {
        let (log, orders, name) = (log.clone(), orders.clone(), name.clone());
        async move {
            let server = Server::builder()
                .serve(WorkServer::new(Worker { number, name: name.clone(), log: log.clone() }))
                .build();
            let addr = server.listen(&format!("tcp://{name}:7000")).await?;
            let registry = registry(&log, &name).await;
            let spec = || vec![InstanceSpec::new(<WorkMethods>::SERVICE, addr.to_string())];
            let lease = LeaseConfig::default().ttl(TTL);
            let _registration = loop {
                match registry.register(&server, spec(), lease.clone()).await {
                    Ok(r) => break r,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            log.event(format!("{name} registered"));
            orders.wait_for_drain(&name).await;
            log.event(format!("{name} drains"));
            let drained = server.stop_gracefully(drain()).await;
            log.event(format!("{name} drained (in time: {drained})"));
            // Down from here until the driver restarts it.
            log.lock().down.entry(name.clone()).or_default().push((now_ms(), None));
            Ok(())
        }
    });
}

/// How a caller is set up.
#[derive(Clone, Copy)]
pub struct CallerSpec {
    pub mode: Mode,
    /// Calls in flight at once.
    pub lanes: u64,
    /// When it starts calling.
    pub from_ms: u64,
    /// Whether it samples its client id (client-id reuse).
    pub sample_ids: bool,
    pub scenario: Scenario,
}

fn service_config(spec: &CallerSpec) -> ServiceConfig {
    let mut c = ServiceConfig::default()
        .mode(spec.mode)
        .client(connection())
        .watch_timeout(Duration::from_secs(1))
        .max_backoff(Duration::from_millis(200))
        .quarantine(Duration::from_secs(1));
    if spec.scenario == Scenario::FlappingInstance {
        c = c.retry_budget(RetryBudget::default()).hedge(Hedge::After(Duration::from_millis(50)));
    }
    c
}

pub fn caller(sim: &mut turmoil::Sim<'_>, log: &Shared, name: &str, index: u64, seed: u64, spec: CallerSpec) {
    let log = log.clone();
    let name = name.to_string();
    sim.client(name.clone(), async move {
        sleep_until_ms(spec.from_ms).await;
        let client = ServiceClient::with_registry(registry(&log, &name).await, service_config(&spec));
        log.event(format!("{name} starts calling (client id {})", client.client_id()));
        let work = WorkClient::new(client.clone());
        let mut lanes = tokio::task::JoinSet::new();
        for lane in 0..spec.lanes {
            let (work, log, name) = (work.clone(), log.clone(), name.clone());
            let mut rng = fastrand::Rng::with_seed(seed ^ (index << 40) ^ (lane << 32));
            lanes.spawn(async move {
                let mut seq = 0u64;
                while now_ms() < WORK_UNTIL_MS {
                    let id = (index << 48) | (lane << 32) | seq;
                    seq += 1;
                    let idempotent = rng.bool();
                    let started_ms = now_ms();
                    log.lock()
                        .start(id, Call { caller: name.clone(), idempotent, started_ms, ends: Vec::new() });
                    let opts =
                        if idempotent { CallOptions::default().idempotent() } else { CallOptions::default() };
                    let r = work.run_with(id, opts).await;
                    let (at, what) = (now_ms(), outcome(&r));
                    {
                        let mut l = log.lock();
                        l.event(at, format!("{name} call {id:x} idem={idempotent} -> {what}"));
                        l.end(id, at, what);
                    }
                    tokio::time::sleep(Duration::from_millis(rng.u64(10..60))).await;
                }
            });
        }
        if spec.sample_ids {
            while now_ms() < WORK_UNTIL_MS {
                let id = client.client_id();
                log.lock().client_ids.push((now_ms(), name.clone(), id));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        while lanes.join_next().await.is_some() {}
        log.event(format!("{name} done"));
        Ok(())
    });
}

/// Reads the controller's list of the service's instances every 100 ms.
pub fn observer(sim: &mut turmoil::Sim<'_>, log: &Shared) {
    let log = log.clone();
    sim.client("obs", async move {
        let registry = registry(&log, "obs").await;
        let mut last: Option<BTreeSet<String>> = None;
        while now_ms() < OBSERVE_UNTIL_MS {
            if let Ok(r) = registry.resolve(<WorkMethods>::SERVICE).await {
                let listed: BTreeSet<String> = r.instances.iter().map(|i| host_of(&i.address)).collect();
                let at = now_ms();
                let mut l = log.lock();
                if last.as_ref() != Some(&listed) {
                    l.event(at, format!("obs lists {listed:?}"));
                    last = Some(listed.clone());
                }
                l.listings.push((at, listed));
                drop(l);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    });
}

/// `tcp://i2:7000` → `i2`.
pub fn host_of(address: &str) -> String {
    let rest = address.strip_prefix("tcp://").unwrap_or(address);
    rest.rsplit_once(':').map_or(rest, |(h, _)| h).to_string()
}
