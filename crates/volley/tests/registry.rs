//! The registry end to end: leases, watches, the registry going down and coming back,
//! instances dying under load, key routing, direct against relayed mode, client ids,
//! scatter-gather. Every test uses its own controller at its own address.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use volley::balance::{Balance, HashRing, key_hash};
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::discovery::wire::{LIST, REGISTER, RegisterRequest};
use volley::registry::{LeaseConfig, Registry};
use volley::service_client::{Mode, ServiceConfig, merge_sorted};
use volley::{CallOptions, Client, Code, Error, Method, Server, ServiceClient, Status};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

/// `who`: the name of the instance that answered.
const WHO: Method<u64, String> = Method::new("reg-test", "who");
/// `double`: x * 2, after a pause of `HANDLER_DELAY` (so calls are in flight).
const DOUBLE: Method<u64, u64> = Method::new("reg-test", "double");
/// `top(k)`: this instance's k best scores, best first.
const TOP: Method<u32, Scores> = Method::new("reg-test", "top");

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Scores(Vec<u64>);
volley::wire!(Scores);
/// `fail`: always an application error.
const FAIL: Method<u64, u64> = Method::new("reg-test", "fail");
const SERVICE: &str = "reg-test";

const HANDLER_DELAY: Duration = Duration::from_millis(2);

fn unique(tag: &str) -> String {
    format!("{tag}-{}", std::process::id())
}

fn unix_address(tag: &str) -> String {
    format!("unix://{}/volley-registry-{}.sock", std::env::temp_dir().display(), unique(tag))
}

/// A controller for tests: lapsed leases are found within 10 ms; no settling unless asked.
fn controller_config(settle: Duration) -> ControllerConfig {
    ControllerConfig::default().expiry_tick(Duration::from_millis(10)).settle(settle)
}

async fn start_controller(addr: &str, settle: Duration) -> (Controller, String) {
    let c = Controller::new(controller_config(settle));
    let bound = c.listen(addr).await.unwrap();
    (c, bound.to_string())
}

fn service_config(mode: Mode) -> ServiceConfig {
    ServiceConfig::default()
        .mode(mode)
        .watch_timeout(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(50))
}

/// An instance of `reg-test` named `name`; `hits` counts `double` executions.
fn instance(name: &str, hits: Arc<AtomicU64>) -> Server {
    let name = name.to_string();
    let top_name = name.clone();
    Server::builder()
        .handle(&WHO, move |_: u64| {
            let n = name.clone();
            async move { Ok(n) }
        })
        .handle(&DOUBLE, move |x: u64| {
            let hits = hits.clone();
            async move {
                hits.fetch_add(1, Relaxed);
                // So that calls are in flight (on the machine's clock where the instances are
                // on real sockets, on the paused one where they are in process).
                tokio::time::sleep(HANDLER_DELAY).await;
                Ok(x * 2)
            }
        })
        .handle(&TOP, move |k: u32| {
            // Instance "i<n>" has the scores n, n+10, n+20, ... (best first: descending).
            let base: u64 = top_name.trim_start_matches(|c: char| !c.is_ascii_digit()).parse().unwrap_or(0);
            async move { Ok(Scores((0..k as u64).map(|j| base + 10 * j).rev().collect())) }
        })
        .handle(&FAIL, |_: u64| async move { Err::<u64, _>(Status::app("always fails")) })
        .build()
}

async fn register(
    registry: &Registry,
    server: &Server,
    addr: &str,
    lease: LeaseConfig,
) -> volley::registry::Registration {
    registry.register(server, vec![InstanceSpec::new(SERVICE, addr)], lease).await.unwrap()
}

fn cached_addresses(client: &ServiceClient) -> HashSet<String> {
    client.cached_instances(SERVICE).unwrap_or_default().into_iter().map(|i| i.address).collect()
}

async fn listed_count(registry: &Registry, service: &str) -> usize {
    let listing = registry.list().await.unwrap();
    listing.services.iter().find(|s| s.name == service).map_or(0, |s| s.instances.len())
}

// ---------------------------------------------------------------------------------------------
// Leases and watches
// ---------------------------------------------------------------------------------------------

/// Inproc only, on the paused clock: lease times, the expiry tick and renewals are tokio timers.
#[tokio::test(start_paused = true)]
async fn lease_expiry_removes_an_instance_and_renewal_keeps_one() {
    let (controller, addr) = start_controller(&format!("inproc://{}", unique("lease")), Duration::ZERO).await;
    let registry = Registry::connect(&addr).await.unwrap();
    // Long enough that the live server (renewing every ttl/3) keeps its one registration
    // through a scheduling stall on a busy machine.
    let ttl = Duration::from_millis(1000);

    // A "crashed" server: registered once, never renewed.
    let raw = Client::connect(&addr).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: ttl.as_millis() as u64,
        instances: vec![InstanceSpec::new("lapsing", "tcp://127.0.0.1:1")],
        credential: String::new(),
    };
    let t0 = tokio::time::Instant::now();
    let registered = raw.call(&REGISTER, req).await.unwrap();
    assert_eq!(registered.ttl_ms, 1000);
    assert_eq!(listed_count(&registry, "lapsing").await, 1);

    // A live server under the same lease time, renewing.
    let server = instance("i1", Arc::default());
    let bound = server.listen(&format!("inproc://{}", unique("lease-live"))).await.unwrap();
    let live = registry
        .register(
            &server,
            vec![InstanceSpec::new("renewed", bound.to_string())],
            LeaseConfig::default().ttl(ttl),
        )
        .await
        .unwrap();

    let gone_after = wait_for(Duration::from_secs(3), "the lapsed instance to go", async || {
        listed_count(&registry, "lapsing").await == 0
    })
    .await;
    let since_register = t0.elapsed();
    assert!(since_register >= ttl, "removed after {since_register:?}, before the lease time {ttl:?}");
    assert!(
        // The expiry tick is 10 ms; the rest is room for a noisy machine.
        since_register < ttl + Duration::from_millis(500),
        "removed only after {since_register:?} ({gone_after:?})"
    );

    // Five renewals (more than a lease time) later, the renewed one is still there, on its
    // first registration.
    wait_for(Duration::from_secs(20), "five renewals", async || live.renewals() >= 5).await;
    assert_eq!(listed_count(&registry, "renewed").await, 1);
    assert_eq!(live.registrations(), 1);

    server.shutdown().await;
    assert_eq!(listed_count(&registry, "renewed").await, 0, "graceful shutdown deregisters at once");
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_delivers_added_and_removed_instances_within_the_lease_time() {
    let (controller, addr) = start_controller(&format!("inproc://{}", unique("watch")), Duration::ZERO).await;
    let registry = Registry::connect(&addr).await.unwrap();
    let ttl = Duration::from_millis(500);
    let lease = LeaseConfig::default().ttl(ttl);

    let a = instance("i1", Arc::default());
    let a_addr = a.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    register(&registry, &a, &a_addr, lease.clone()).await;

    let client = ServiceClient::connect_with(&addr, service_config(Mode::Direct)).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "i1");
    assert_eq!(cached_addresses(&client), HashSet::from([a_addr.clone()]));

    // Added.
    let b = instance("i2", Arc::default());
    let b_addr = b.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let b_reg = register(&registry, &b, &b_addr, lease.clone()).await;
    let added = wait_until(ttl, "the added instance to reach the client", || {
        cached_addresses(&client).contains(&b_addr)
    })
    .await;

    // Removed by deregistration (graceful).
    b_reg.deregister().await;
    let removed = wait_until(ttl, "the deregistered instance to leave the client", || {
        !cached_addresses(&client).contains(&b_addr)
    })
    .await;

    // Removed by a lapsed lease (a server that died without a word).
    let raw = Client::connect(&addr).await.unwrap();
    let c_addr = "tcp://127.0.0.1:9".to_string();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: ttl.as_millis() as u64,
        instances: vec![InstanceSpec::new(SERVICE, c_addr.clone())],
        credential: String::new(),
    };
    raw.call(&REGISTER, req).await.unwrap();
    wait_until(ttl, "the third instance to reach the client", || cached_addresses(&client).contains(&c_addr))
        .await;
    let t_crash = Instant::now();
    wait_until(ttl * 2, "the lapsed instance to leave the client", || {
        !cached_addresses(&client).contains(&c_addr)
    })
    .await;
    let lapsed = t_crash.elapsed();
    // The expiry tick is 10 ms; the rest is room for a noisy machine.
    assert!(lapsed <= ttl + Duration::from_millis(500), "lapse reached the client after {lapsed:?}");

    let stats = client.stats();
    assert_eq!(stats.lookups, 1, "changes came by watch, not by look-ups");
    assert!(stats.watches >= 3, "{stats:?}");
    eprintln!("watch: added after {added:?}, deregistered after {removed:?}, lapsed after {lapsed:?}");

    drop(client);
    a.shutdown().await;
    b.shutdown().await;
    controller.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The registry down and back
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_calls_go_on_from_the_cache_and_registrations_are_rebuilt_when_it_is_back() {
    let reg_addr = unix_address("restart");
    let (controller, _) = start_controller(&reg_addr, Duration::ZERO).await;
    // Renewed often, so the restart is noticed at once; the ttl is long enough that a renewal
    // delayed on a loaded machine does not lapse the lease (that would register a third time).
    let lease = LeaseConfig::default()
        .ttl(Duration::from_secs(2))
        .renew_every(Some(Duration::from_millis(100)))
        .retry_every(Some(Duration::from_millis(30)));
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let mut servers = Vec::new();
    let mut regs = Vec::new();
    for name in ["i1", "i2"] {
        let s = instance(name, Arc::default());
        let a = s.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
        regs.push(register(&registry, &s, &a, lease.clone()).await);
        servers.push(s);
    }
    let client = ServiceClient::connect_with(&reg_addr, service_config(Mode::Direct)).await.unwrap();
    for i in 0..20 {
        assert_eq!(client.call(&DOUBLE, i).await.unwrap(), i * 2);
    }
    assert_eq!(cached_addresses(&client).len(), 2);

    // Down.
    let old_epoch = controller.epoch();
    controller.shutdown().await;
    assert!(Registry::connect(&reg_addr).await.is_err(), "the registry should be unreachable");
    // Calls for a while (by count, not time, so a loaded machine makes as many).
    let t0 = Instant::now();
    let mut calls = 0u64;
    while calls < 40 || t0.elapsed() < Duration::from_millis(600) {
        assert_eq!(client.call(&DOUBLE, calls).await, Ok(calls * 2), "call {calls} with the registry down");
        calls += 1;
    }
    let mut answered_by = HashSet::new();
    for _ in 0..10 {
        answered_by.insert(client.call(&WHO, 0).await.unwrap());
    }
    assert!(calls > 20, "only {calls} calls");
    assert_eq!(answered_by.len(), 2, "both cached instances kept serving: {answered_by:?}");
    assert_eq!(cached_addresses(&client).len(), 2, "an unreachable registry does not wipe the cache");
    assert_eq!(client.stats().lookups, 1);

    // Back (a new controller, same address, empty store).
    let (controller2, _) = start_controller(&reg_addr, Duration::from_millis(300)).await;
    assert_ne!(controller2.epoch(), old_epoch);
    let fresh = Registry::connect(&reg_addr).await.unwrap();
    let rebuilt = wait_for(Duration::from_secs(3), "both servers to register again", async || {
        listed_count(&fresh, SERVICE).await == 2
    })
    .await;
    // (The registry may list a server a moment before its keeper has read the answer.)
    wait_until(Duration::from_secs(1), "the keepers to see their new leases", || {
        regs.iter().all(|r| r.registrations() >= 2)
    })
    .await;
    for r in &regs {
        assert_eq!(r.registrations(), 2, "registered exactly once more after the restart");
    }
    // The client's watch reconnected: a server added now reaches it.
    let s3 = instance("i3", Arc::default());
    let a3 = s3.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    register(&fresh, &s3, &a3, lease.clone()).await;
    wait_until(Duration::from_secs(3), "the watch to resume", || cached_addresses(&client).contains(&a3))
        .await;
    assert_eq!(client.call(&DOUBLE, 21).await, Ok(42));
    eprintln!("{calls} calls from the cache while down; registrations rebuilt {rebuilt:?} after the restart");

    drop(client);
    for s in servers {
        s.shutdown().await;
    }
    s3.shutdown().await;
    controller2.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// An instance dies under load
// ---------------------------------------------------------------------------------------------

/// An instance on a thread and runtime of its own, so that it can be killed: dropping the
/// runtime drops every task and socket at once, with no go-away and no deregistration.
struct Killable {
    addr: String,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Killable {
    fn start(name: &str, registry_addr: &str, hits: Arc<AtomicU64>) -> Killable {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let (name, registry_addr) = (name.to_string(), registry_addr.to_string());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let server = instance(&name, hits);
                let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
                let registry = Registry::connect(&registry_addr).await.unwrap();
                // A long lease: the registry keeps listing the dead instance throughout the test,
                // so it is the client that must notice and drop it.
                register(&registry, &server, &addr, LeaseConfig::default().ttl(Duration::from_secs(30)))
                    .await;
                ready_tx.send(addr).unwrap();
                let _ = kill_rx.await;
                // No shutdown: the server and its tasks just stop existing with the runtime.
                drop(server);
            });
            drop(rt);
        });
        let addr = ready_rx.recv().unwrap();
        Killable { addr, kill: Some(kill_tx), thread: Some(thread) }
    }

    fn kill(&mut self) {
        let _ = self.kill.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap();
    }
}

#[derive(Default)]
struct Tally {
    issued: AtomicU64,
    ended: AtomicU64,
    ok: AtomicU64,
    ok_after_kill: AtomicU64,
    idempotent_errors: AtomicU64,
    connection_errors: AtomicU64,
    other_errors: AtomicU64,
    hung: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_instances_under_load_loses_no_call() {
    let (controller, reg_addr) =
        start_controller(&format!("inproc://{}", unique("kill")), Duration::ZERO).await;
    let (hits_a, hits_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut a = Killable::start("i1", &reg_addr, hits_a.clone());
    let mut b = Killable::start("i2", &reg_addr, hits_b.clone());

    let config = service_config(Mode::Direct).quarantine(Duration::from_secs(30));
    let client = ServiceClient::connect_with(&reg_addr, config).await.unwrap();
    assert_eq!(client.instances(SERVICE).await.unwrap().len(), 2);

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let seen_tags = Arc::new(parking_lot::Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    // An odd number of callers: round robin hands out instances in call order, so with an even
    // number every wave would send the idempotent (even) callers to one instance and the others
    // to the other, and the instance killed could have only one kind in flight.
    for caller in 0..63u64 {
        let (client, tally, stop, killed, seen) =
            (client.clone(), tally.clone(), stop.clone(), killed.clone(), seen_tags.clone());
        tasks.push(tokio::spawn(async move {
            let idempotent = caller % 2 == 0;
            let opts = if idempotent { CallOptions::default().idempotent() } else { CallOptions::default() };
            let mut seq = 0u64;
            while !stop.load(Relaxed) {
                let tag = (caller << 32) | seq;
                seq += 1;
                tally.issued.fetch_add(1, Relaxed);
                let r =
                    tokio::time::timeout(Duration::from_secs(10), client.call_with(&DOUBLE, tag, opts)).await;
                tally.ended.fetch_add(1, Relaxed);
                match r {
                    Err(_) => {
                        tally.hung.fetch_add(1, Relaxed);
                    }
                    Ok(Ok(v)) => {
                        assert_eq!(v, tag * 2, "a reply for another call");
                        assert!(seen.lock().insert(tag), "call {tag} answered twice");
                        tally.ok.fetch_add(1, Relaxed);
                        if killed.load(Relaxed) {
                            tally.ok_after_kill.fetch_add(1, Relaxed);
                        }
                    }
                    Ok(Err(e)) => {
                        if idempotent {
                            tally.idempotent_errors.fetch_add(1, Relaxed);
                            eprintln!("idempotent call failed: {e}");
                        } else if matches!(e, Error::Connection(_)) {
                            tally.connection_errors.fetch_add(1, Relaxed);
                        } else {
                            tally.other_errors.fetch_add(1, Relaxed);
                            eprintln!("unexpected error: {e}");
                        }
                    }
                }
            }
        }));
    }
    // Past the first waves, so that both kinds of call are in flight on each instance.
    wait_for(Duration::from_secs(20), "load on both instances", async || {
        hits_a.load(Relaxed) > 200 && hits_b.load(Relaxed) > 200
    })
    .await;
    b.kill();
    killed.store(true, Relaxed);
    let hits_a_at_kill = hits_a.load(Relaxed);
    wait_for(Duration::from_secs(20), "calls to go on after the kill", async || {
        tally.ok_after_kill.load(Relaxed) > 100
    })
    .await;
    stop.store(true, Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    let t = &*tally;
    let (issued, ended, ok) = (t.issued.load(Relaxed), t.ended.load(Relaxed), t.ok.load(Relaxed));
    let conn_errors = t.connection_errors.load(Relaxed);
    let stats = client.stats();
    eprintln!(
        "issued {issued}, ok {ok} ({} after the kill), connection errors {conn_errors}, failovers {}",
        t.ok_after_kill.load(Relaxed),
        stats.failovers
    );
    assert_eq!(t.hung.load(Relaxed), 0, "calls hung");
    assert_eq!(issued, ended, "calls never ended");
    assert_eq!(ok + conn_errors + t.idempotent_errors.load(Relaxed) + t.other_errors.load(Relaxed), issued);
    assert_eq!(seen_tags.lock().len() as u64, ok);
    assert_eq!(t.idempotent_errors.load(Relaxed), 0, "idempotent calls must fail over");
    assert_eq!(
        t.other_errors.load(Relaxed),
        0,
        "non-idempotent calls end with a connection error or a reply"
    );
    assert!(conn_errors > 0, "no non-idempotent call was in flight on the killed instance?");
    assert!(stats.failovers > 0, "no idempotent call was retried: {stats:?}");
    assert_eq!(stats.instances_dropped, 1, "{stats:?}");
    assert!(t.ok_after_kill.load(Relaxed) > 100, "calls did not go on after the kill");
    assert!(hits_a.load(Relaxed) > hits_a_at_kill, "the survivor took no load after the kill");
    // Every reply came from an execution (a failed-over call may also have run on b).
    assert!(hits_a.load(Relaxed) + hits_b.load(Relaxed) >= ok);
    assert_eq!(
        cached_addresses(&client),
        HashSet::from([a.addr.clone(), b.addr.clone()]),
        "the registry still lists both (long lease)"
    );

    drop(client);
    a.kill();
    controller.shutdown().await;
}

/// `stall(x)`: on an instance named "stuck", never answers in time; elsewhere x + 1.
const STALL: Method<u64, u64> = Method::new("reg-test", "stall");

/// An instance shut down with a drain deadline answers the calls it drops `ShuttingDown`: an
/// idempotent call fails over to another instance and succeeds, another call gets the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_at_a_drain_deadline_fail_over_when_idempotent() {
    let (controller, reg_addr) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let serve = |stuck: bool| {
        Server::builder()
            .handle(&STALL, move |x: u64| async move {
                if stuck {
                    std::future::pending::<()>().await;
                }
                Ok(x + 1)
            })
            .build()
    };
    let stuck = serve(true);
    let a = stuck.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    register(&registry, &stuck, &a, LeaseConfig::default()).await;
    let client = ServiceClient::connect_with(&reg_addr, service_config(Mode::Direct)).await.unwrap();
    let opts = CallOptions::default().timeout(Duration::from_secs(30));
    // Both calls reach the only instance, the stuck one.
    let (c1, c2) = (client.clone(), client.clone());
    let idempotent = tokio::spawn(async move { c1.call_with(&STALL, 1, opts.idempotent()).await });
    let plain = tokio::spawn(async move { c2.call_with(&STALL, 2, opts).await });
    wait_until(Duration::from_secs(10), "both calls in the stuck handler", || {
        stuck.counters().messages_received >= 2
    })
    .await;
    let healthy = serve(false);
    let b = healthy.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    register(&registry, &healthy, &b, LeaseConfig::default()).await;
    wait_until(Duration::from_secs(5), "the healthy instance", || cached_addresses(&client).len() == 2).await;

    assert!(!stuck.shutdown_with_deadline(Duration::from_millis(300)).await);
    assert_eq!(idempotent.await.unwrap(), Ok(2), "the idempotent call did not fail over");
    let r = plain.await.unwrap();
    assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::ShuttingDown), "{r:?}");
    assert!(client.stats().failovers >= 1, "{:?}", client.stats());

    drop(client);
    healthy.shutdown().await;
    controller.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Key routing
// ---------------------------------------------------------------------------------------------

#[test]
fn adding_a_fifth_instance_to_four_moves_about_a_fifth_of_the_keys() {
    let names: Vec<String> = (1..=5).map(|i| format!("tcp://10.0.0.{i}:7411")).collect();
    let four = HashRing::new(names[..4].iter().map(|n| (n.as_str(), 1)));
    let five = HashRing::new(names.iter().map(|n| (n.as_str(), 1)));
    let mut moved = 0;
    for k in 0..10_000u64 {
        let h = key_hash(&k.to_le_bytes());
        let (before, after) = (four.node(h).unwrap(), five.node(h).unwrap());
        assert_eq!(four.node(h), four.node(h), "same key, same node");
        if before != after {
            assert_eq!(after, 4, "a key moved between old instances");
            moved += 1;
        }
    }
    let share = moved as f64 / 10_000.0;
    eprintln!("4 -> 5 instances: {moved} of 10000 keys moved");
    assert!((0.15..=0.25).contains(&share), "{moved} of 10000 keys moved");
}

/// Inproc only, on the paused clock: the fifth instance reaches the client by its watch.
#[tokio::test(start_paused = true)]
async fn keyed_calls_keep_their_instance_and_a_fifth_instance_takes_about_a_fifth() {
    let (controller, reg_addr) =
        start_controller(&format!("inproc://{}", unique("keys")), Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let mut servers = Vec::new();
    for i in 1..=4 {
        let s = instance(&format!("i{i}"), Arc::default());
        let a = s.listen(&format!("inproc://{}", unique(&format!("keys-i{i}")))).await.unwrap().to_string();
        register(&registry, &s, &a, LeaseConfig::default()).await;
        servers.push(s);
    }
    let client = ServiceClient::connect_with(&reg_addr, service_config(Mode::Direct)).await.unwrap();
    let route = |client: ServiceClient| async move {
        let mut owner = HashMap::new();
        for k in 0..10_000u64 {
            owner.insert(k, client.call_keyed(&WHO, &k, 0).await.unwrap());
        }
        owner
    };
    let first = route(client.clone()).await;
    assert_eq!(first, route(client.clone()).await, "the same key reached another instance");
    let per_instance = first.values().fold(HashMap::new(), |mut m, n| {
        *m.entry(n.clone()).or_insert(0) += 1;
        m
    });
    assert_eq!(per_instance.len(), 4, "{per_instance:?}");

    let s5 = instance("i5", Arc::default());
    let a5 = s5.listen(&format!("inproc://{}", unique("keys-i5"))).await.unwrap().to_string();
    register(&registry, &s5, &a5, LeaseConfig::default()).await;
    wait_until(Duration::from_secs(2), "the fifth instance", || cached_addresses(&client).len() == 5).await;
    let second = route(client.clone()).await;
    let moved: Vec<_> = first.iter().filter(|(k, n)| &second[k] != *n).collect();
    assert!(moved.iter().all(|(k, _)| second[k] == "i5"), "keys moved between old instances");
    let share = moved.len() as f64 / 10_000.0;
    eprintln!("4 -> 5 instances, through the client: {} of 10000 keys moved", moved.len());
    assert!((0.15..=0.25).contains(&share), "{} of 10000 keys moved", moved.len());
    assert_eq!(client.stats().lookups, 1);

    drop(client);
    for s in servers {
        s.shutdown().await;
    }
    s5.shutdown().await;
    controller.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Direct against relayed
// ---------------------------------------------------------------------------------------------

/// Every message sent by anyone in the test was also received: counters have caught up (a writer
/// counts a frame once its write returns, which may be a moment after the peer read it).
fn settled(
    clients: &[&ServiceClient],
    controller: &Controller,
    servers: &[Server],
    registry: &Registry,
) -> bool {
    let c = controller.stats();
    let r = registry.stats().transport;
    let (mut sent, mut received) = (
        c.server.messages_sent + c.relay.messages_sent + r.messages_sent,
        c.server.messages_received + c.relay.messages_received + r.messages_received,
    );
    for t in clients.iter().map(|c| c.stats().transport()).chain(servers.iter().map(|s| s.counters())) {
        sent += t.messages_sent;
        received += t.messages_received;
    }
    sent == received
}

/// Messages sent by every party: the client, the controller (its server and its relay
/// connections), the instances.
fn messages_sent(client: &ServiceClient, controller: &Controller, servers: &[Server]) -> u64 {
    let c = controller.stats();
    client.stats().transport().messages_sent
        + c.server.messages_sent
        + c.relay.messages_sent
        + servers.iter().map(|s| s.counters().messages_sent).sum::<u64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_mode_sends_at_most_half_the_messages_of_relayed_mode() {
    let (controller, reg_addr) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let mut servers = Vec::new();
    for name in ["i1", "i2"] {
        let s = instance(name, Arc::default());
        let a = s.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
        // Long leases and watches: no control traffic inside the measured window.
        register(&registry, &s, &a, LeaseConfig::default().ttl(Duration::from_secs(60))).await;
        servers.push(s);
    }
    const CALLS: u64 = 2000;
    let mut totals = HashMap::new();
    // Kept alive to the end: a client that goes away sends messages (cancel its watch, give
    // its id back) that would land in the next mode's window.
    let mut clients = Vec::new();
    for mode in [Mode::Direct, Mode::Relayed] {
        let config = service_config(mode).watch_timeout(Duration::from_secs(60));
        let client = ServiceClient::connect_with(&reg_addr, config).await.unwrap();
        // Warm up: resolve, connect (direct); connect the relay's pool (relayed).
        for i in 0..4 {
            assert_eq!(client.call(&DOUBLE, i).await.unwrap(), i * 2);
        }
        if mode == Mode::Direct {
            // The first watch (a long poll) is under way before the window opens.
            wait_until(Duration::from_secs(2), "the first watch", || client.stats().watches == 1).await;
        }
        let everyone = || clients.iter().chain([&client]).collect::<Vec<_>>();
        wait_until(Duration::from_secs(10), "the counters to settle", || {
            settled(&everyone(), &controller, &servers, &registry)
        })
        .await;
        let before = messages_sent(&client, &controller, &servers);
        let registry_before = client.stats().registry_messages();
        let calls = (0..50u64).map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..CALLS / 50 {
                    let x = t * 1000 + i;
                    assert_eq!(client.call(&DOUBLE, x).await.unwrap(), x * 2);
                }
            })
        });
        for c in calls.collect::<Vec<_>>() {
            c.await.unwrap();
        }
        wait_until(Duration::from_secs(10), "the counters to settle", || {
            settled(&everyone(), &controller, &servers, &registry)
        })
        .await;
        let sent = messages_sent(&client, &controller, &servers) - before;
        let registry_messages = client.stats().registry_messages() - registry_before;
        match mode {
            Mode::Direct => assert_eq!(registry_messages, 0, "direct mode asked the registry per call"),
            Mode::Relayed => {
                assert_eq!(registry_messages, 2 * CALLS, "every relayed call is a request and a reply")
            }
            other => unreachable!("{other:?} is not measured"),
        }
        totals.insert(mode, sent);
        clients.push(client);
    }
    let (direct, relayed) = (totals[&Mode::Direct], totals[&Mode::Relayed]);
    eprintln!(
        "{CALLS} calls: direct {direct} messages, relayed {relayed} (ratio {:.3})",
        direct as f64 / relayed as f64
    );
    assert!(direct >= 2 * CALLS, "direct: {direct} messages for {CALLS} calls");
    assert!(direct * 2 <= relayed, "direct {direct} vs relayed {relayed}");

    for s in servers {
        s.shutdown().await;
    }
    controller.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Client ids
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_get_ten_thousand_distinct_client_ids() {
    let (controller, reg_addr) =
        start_controller(&format!("inproc://{}", unique("ids")), Duration::ZERO).await;
    let mut clients = Vec::with_capacity(10_000);
    for _ in 0..100 {
        let batch = (0..100).map(|_| {
            let a = reg_addr.clone();
            tokio::spawn(async move { ServiceClient::connect(&a).await.unwrap() })
        });
        for c in batch.collect::<Vec<_>>() {
            clients.push(c.await.unwrap());
        }
    }
    let ids: HashSet<u32> = clients.iter().map(|c| c.client_id()).collect();
    assert_eq!(ids.len(), 10_000);
    assert!(!ids.contains(&0));

    // Over tcp too, where the ids are on the wire.
    let (tcp_controller, tcp_addr) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let mut tcp_ids = HashSet::new();
    for _ in 0..50 {
        let c = ServiceClient::connect(&tcp_addr).await.unwrap();
        assert!(tcp_ids.insert(c.client_id()));
        // First contact: the id asked for over one connection and claimed on the client's own.
        assert_eq!(c.stats().registry_messages(), 4, "first contact: two requests, two replies");
    }
    drop(clients);
    tcp_controller.shutdown().await;
    controller.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Scatter-gather, errors, the embedded registry
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scatter_gather_reaches_every_instance_and_merges_top_k_in_both_modes() {
    let (controller, reg_addr) =
        start_controller(&format!("inproc://{}", unique("scatter")), Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let mut servers = Vec::new();
    for i in 1..=3 {
        let s = instance(&format!("i{i}"), Arc::default());
        let a =
            s.listen(&format!("inproc://{}", unique(&format!("scatter-i{i}")))).await.unwrap().to_string();
        register(&registry, &s, &a, LeaseConfig::default()).await;
        servers.push(s);
    }
    for mode in [Mode::Direct, Mode::Relayed] {
        let client = ServiceClient::connect_with(&reg_addr, service_config(mode)).await.unwrap();
        let gathered = client.scatter(&WHO, 0).await.unwrap();
        let names: HashSet<String> = gathered.into_iter().map(|g| g.result.unwrap()).collect();
        assert_eq!(names, HashSet::from(["i1".into(), "i2".into(), "i3".into()]), "{mode:?}");

        let top = client
            .scatter_merge(&TOP, 4, |g| {
                merge_sorted(g.into_iter().map(|g| g.result.unwrap().0).collect(), 5, |a, b| b.cmp(a))
            })
            .await
            .unwrap();
        assert_eq!(top, vec![33, 32, 31, 23, 22], "{mode:?}");

        // Each instance's error comes back in its own slot.
        let failed = client.scatter(&FAIL, 0).await.unwrap();
        assert_eq!(failed.len(), 3);
        for g in failed {
            assert_eq!(g.result.unwrap_err().code(), Some(Code::Application), "{mode:?}");
        }
    }
    for s in servers {
        s.shutdown().await;
    }
    controller.shutdown().await;
}

/// Inproc only, on the paused clock (the instance's `double` takes its pause there).
#[tokio::test(start_paused = true)]
async fn errors_are_typed_and_the_same_in_both_modes() {
    let (controller, reg_addr) =
        start_controller(&format!("inproc://{}", unique("errors")), Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let s = instance("i1", Arc::default());
    let a = s.listen(&format!("inproc://{}", unique("errors-i1"))).await.unwrap().to_string();
    let reg = register(&registry, &s, &a, LeaseConfig::default()).await;
    const NOBODY: Method<u64, u64> = Method::new("nobody-serves-this", "m");
    for mode in [Mode::Direct, Mode::Relayed] {
        let client = ServiceClient::connect_with(&reg_addr, service_config(mode)).await.unwrap();
        assert_eq!(client.call(&NOBODY, 1).await, Err(Error::UnknownService("nobody-serves-this".into())));
        assert_eq!(client.call(&FAIL, 1).await.unwrap_err().code(), Some(Code::Application), "{mode:?}");
        assert_eq!(client.call(&DOUBLE, 4).await, Ok(8), "{mode:?}");
    }
    // A known service whose every instance left.
    let client = ServiceClient::connect_with(&reg_addr, service_config(Mode::Relayed)).await.unwrap();
    reg.deregister().await;
    assert_eq!(client.call(&DOUBLE, 1).await, Err(Error::NoInstances { service: SERVICE.into() }));
    s.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balancing_spreads_calls_and_counters_match_the_wire() {
    let (controller, reg_addr) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let mut servers = Vec::new();
    for (name, weight) in [("i1", 1), ("i2", 3)] {
        let s = instance(name, Arc::default());
        let a = s.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
        let spec = InstanceSpec::new(SERVICE, a).weight(weight).meta("zone", name);
        registry.register(&s, vec![spec], LeaseConfig::default()).await.unwrap();
        servers.push(s);
    }
    for balance in [Balance::RoundRobin, Balance::LeastOutstanding] {
        let config = service_config(Mode::Direct).balance(balance);
        let client = ServiceClient::connect_with(&reg_addr, config).await.unwrap();
        // The spread is measured once both instances are connected: while one is still
        // connecting, calls go to the one that is (balance/pool.rs, warming).
        client.call(&WHO, 0).await.unwrap();
        wait_until(Duration::from_secs(20), "connections to both instances", || {
            let stats = client.instance_stats(SERVICE);
            stats.len() == 2 && stats.iter().all(|i| i.connected_to.is_some())
        })
        .await;
        let mut count = HashMap::new();
        for _ in 0..400 {
            *count.entry(client.call(&WHO, 0).await.unwrap()).or_insert(0) += 1;
        }
        match balance {
            // Weighted round-robin is exact.
            Balance::RoundRobin => assert_eq!((count["i1"], count["i2"]), (100, 300), "{count:?}"),
            // One caller at a time: nothing is ever outstanding, so both are used.
            Balance::LeastOutstanding => assert!(count["i1"] > 50 && count["i2"] > 50, "{count:?}"),
            other => unreachable!("{other:?} is not measured"),
        }
        let instances = client.instances(SERVICE).await.unwrap();
        assert!(instances.iter().all(|i| i.metadata.contains_key("zone")));
    }

    // Relayed over tcp: the counted registry messages are the messages on the wire.
    let client = ServiceClient::connect_with(&reg_addr, service_config(Mode::Relayed)).await.unwrap();
    for i in 0..100 {
        assert_eq!(client.call(&DOUBLE, i).await.unwrap(), i * 2);
    }
    let st = client.stats();
    assert_eq!(st.registry_messages_sent, st.registry_transport.messages_sent);
    assert_eq!(st.registry_messages_received, st.registry_transport.messages_received);
    assert_eq!(st.registry_messages(), 4 + 200, "{st:?}");
    assert_eq!(controller.stats().relayed_calls, 100);

    // `volley ls` material.
    let listing = registry.list().await.unwrap();
    assert_eq!(listing.services.len(), 1);
    assert_eq!(listing.services[0].instances.len(), 2);
    assert!(listing.services[0].instances.iter().all(|i| i.expires_in_ms > 0 && i.lease_ttl_ms == 10_000));
    let raw = Client::connect(&reg_addr).await.unwrap();
    let again = raw.call(&LIST, ()).await.unwrap();
    let instances = |l: &volley::discovery::Listing| -> Vec<volley::discovery::Instance> {
        l.services.iter().flat_map(|s| s.instances.iter().map(|i| i.instance.clone())).collect()
    };
    assert_eq!((again.epoch, instances(&again)), (listing.epoch, instances(&listing)));

    for s in servers {
        s.shutdown().await;
    }
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_embedded_registry_needs_nothing_else() {
    // The only test in this binary that uses the default address.
    let server = instance("solo", Arc::default());
    let addr = server.listen(&format!("inproc://{}", unique("embedded"))).await.unwrap();
    let registry = Registry::connect(volley::discovery::DEFAULT_REGISTRY).await.unwrap();
    register(&registry, &server, &addr.to_string(), LeaseConfig::default()).await;
    let client = ServiceClient::connect(volley::discovery::DEFAULT_REGISTRY).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "solo");
    assert_ne!(client.client_id(), registry.client_id());
    let controller = volley::controller::embedded().await.unwrap().expect("the embedded controller runs");
    assert!(controller.is_serving());
    server.shutdown().await;
    // The watch brought the (empty) update and was issued again...
    wait_until(Duration::from_secs(2), "the update", || client.stats().watches >= 2).await;
    // ...and the client kept its last good list.
    assert_eq!(client.instances(SERVICE).await.unwrap().len(), 1);
    assert_eq!(listed_count(&registry, SERVICE).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_cannot_be_reached_are_skipped_even_for_non_idempotent_calls() {
    let (controller, reg_addr) =
        start_controller(&format!("inproc://{}", unique("skip")), Duration::ZERO).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    // Listed but unreachable, under a lease nobody revokes: a tcp port with no listener (the
    // connect fails before anything is sent) and an inproc server that has shut down.
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("tcp://{}", l.local_addr().unwrap())
    };
    let gone = instance("gone", Arc::default());
    let gone_addr = gone.listen(&format!("inproc://{}", unique("skip-gone"))).await.unwrap().to_string();
    let raw = Client::connect(&reg_addr).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 60_000,
        instances: vec![InstanceSpec::new(SERVICE, closed_port), InstanceSpec::new(SERVICE, gone_addr)],
        credential: String::new(),
    };
    raw.call(&REGISTER, req).await.unwrap();
    let live = instance("live", Arc::default());
    let live_addr = live.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    register(&registry, &live, &live_addr, LeaseConfig::default()).await;

    let client = ServiceClient::connect_with(&reg_addr, service_config(Mode::Direct)).await.unwrap();
    assert_eq!(client.instances(SERVICE).await.unwrap().len(), 3);
    // The inproc one was reachable once (its connection exists), then it went away.
    for _ in 0..6 {
        let _ = client.call(&WHO, 0).await;
    }
    gone.shutdown().await;
    for i in 0..30 {
        assert_eq!(client.call(&WHO, i).await.unwrap(), "live", "call {i}");
    }
    let stats = client.stats();
    assert_eq!(stats.instances_dropped, 2, "{stats:?}");
    assert_eq!(stats.failovers, 0, "nothing was retried after being sent: {stats:?}");
    assert_eq!(cached_addresses(&client).len(), 3, "still listed by the registry");
    live.shutdown().await;
    controller.shutdown().await;
}

/// The batch API through the registry: a batch spreads its chunks over the instances (one chunk
/// per pick of the balancing policy), every instance serves some, and the results come back in
/// input order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_three_instances_uses_all_three() {
    let (controller, reg) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let registry = Registry::connect(&reg).await.unwrap();
    let mut servers = Vec::new();
    let mut hits = Vec::new();
    let mut registrations = Vec::new();
    for i in 0..3 {
        let h = Arc::new(AtomicU64::new(0));
        let server = instance(&format!("i{i}"), h.clone());
        let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
        registrations.push(register(&registry, &server, &addr, LeaseConfig::default()).await);
        servers.push(server);
        hits.push(h);
    }
    let client = ServiceClient::connect_with(&reg, service_config(Mode::Direct)).await.unwrap();
    assert_eq!(client.instances(SERVICE).await.unwrap().len(), 3);
    let n = 3 * 128 * 4;
    let results = client.call_batch(&DOUBLE, 0..n as u64).await;
    assert_eq!(results.len(), n);
    for (x, r) in results.into_iter().enumerate() {
        assert_eq!(r, Ok(2 * x as u64), "item {x}");
    }
    let served: Vec<u64> = hits.iter().map(|h| h.load(Relaxed)).collect();
    assert_eq!(served.iter().sum::<u64>(), n as u64, "{served:?}");
    assert!(served.iter().all(|&s| s >= 128), "every instance served at least a chunk: {served:?}");
    drop(registrations);
    for s in servers {
        s.shutdown().await;
    }
    controller.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Several controllers
// ---------------------------------------------------------------------------------------------

/// `Registry` and `ServiceClient` given `A,B`: everything goes to A while it is up; when A goes,
/// the server's keeper and the client's watch move to B (the server registers again there,
/// since B's in-memory store never saw it), the client keeps calling, and a server that
/// registers with B afterwards reaches the client through B. A client that starts while A is
/// down connects to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_and_servers_given_two_controllers_fail_over_when_the_first_goes() {
    let (a, a_addr) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let (b, b_addr) = start_controller("tcp://127.0.0.1:0", Duration::ZERO).await;
    let both = format!("{a_addr},{b_addr}");
    let lease = LeaseConfig::default()
        .ttl(Duration::from_millis(600))
        .renew_every(Some(Duration::from_millis(100)))
        .retry_every(Some(Duration::from_millis(30)));
    let registry = Registry::connect(&both).await.unwrap();
    assert_eq!(registry.controllers(), [a_addr.clone(), b_addr.clone()]);
    assert_eq!(registry.current_controller(), a_addr);
    let s1 = instance("i1", Arc::default());
    let s1_addr = s1.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let reg1 = register(&registry, &s1, &s1_addr, lease.clone()).await;
    let client = ServiceClient::connect_with(&both, service_config(Mode::Direct)).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "i1");
    let on_b = Registry::connect(&b_addr).await.unwrap();
    assert_eq!(listed_count(&on_b, SERVICE).await, 0, "everything went to A so far");
    assert_eq!(registry.stats().failovers, 0);

    a.shutdown().await;
    // The keeper's next renewal fails over to B, which does not know the lease: the server
    // registers again, with B.
    // (B lists the instance a moment before the keeper has counted its reply: wait for both.)
    wait_for(Duration::from_secs(10), "the server to register with B", async || {
        listed_count(&on_b, SERVICE).await == 1 && reg1.registrations() >= 2
    })
    .await;
    assert!(registry.stats().failovers >= 1);
    assert_eq!(registry.current_controller(), b_addr);
    for i in 0..20 {
        assert_eq!(client.call(&DOUBLE, i).await, Ok(i * 2), "call {i} after A went");
    }

    // A server that registers with B only is pushed to the client through B.
    let s2 = instance("i2", Arc::default());
    let s2_addr = s2.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let _reg2 = register(&on_b, &s2, &s2_addr, lease.clone()).await;
    wait_until(Duration::from_secs(10), "the client to learn of i2 through B", || {
        cached_addresses(&client).contains(&s2_addr)
    })
    .await;
    assert_eq!(client.registry().current_controller(), b_addr);
    assert!(client.registry().stats().failovers >= 1);
    let mut answered_by = HashSet::new();
    for _ in 0..20 {
        answered_by.insert(client.call(&WHO, 0).await.unwrap());
    }
    assert_eq!(answered_by, HashSet::from(["i1".to_string(), "i2".to_string()]));

    // A new client, with A still down, starts on B.
    let late = ServiceClient::connect_with(&both, service_config(Mode::Direct)).await.unwrap();
    assert_eq!(late.registry().current_controller(), b_addr);
    assert!(late.call(&WHO, 0).await.is_ok());
    // A list with nothing answering fails with a connection error, not a hang.
    a_down_b_down_fails(&a_addr).await;

    for s in [&s1, &s2] {
        s.shutdown().await;
    }
    b.shutdown().await;
}

async fn a_down_b_down_fails(a_addr: &str) {
    let nowhere = format!("{a_addr},{}", unix_address("nobody-listens"));
    match Registry::connect(&nowhere).await {
        Err(Error::Connection(_)) => {}
        Err(e) => panic!("expected a connection error, got {e}"),
        Ok(_) => panic!("connected to a list of controllers that are all down"),
    }
}
