//! The registry keeps the truth: an address taken by a stray registration comes back, dead
//! instances are ejected and probed, client ids go back when their connection closes,
//! refusals are permanent, and a restarted controller is found again at once.
//! Every test uses its own controller at its own address.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use volley::controller::{Controller, ControllerConfig, MemoryStore};
use volley::discovery::InstanceSpec;
use volley::discovery::wire::{ALLOC_CLIENT_ID, INFO, LIST, REGISTER, RELEASE_CLIENT_ID, RegisterRequest};
use volley::registry::{LeaseConfig, Registry};
use volley::service_client::{Mode, ServiceConfig};
use volley::{Client, Code, Error, ErrorClass, Method, Server, ServiceClient};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

const WHO: Method<u64, String> = Method::new("truth", "who");
const SERVICE: &str = "truth";

fn unique(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), fastrand::u32(..))
}

fn unix_address(tag: &str) -> String {
    format!("unix://{}/volley-truth-{}.sock", std::env::temp_dir().display(), unique(tag))
}

fn instance(name: &str) -> Server {
    let name = name.to_string();
    Server::builder()
        .handle(&WHO, move |_: u64| {
            let n = name.clone();
            async move { Ok(n) }
        })
        .build()
}

async fn controller(addr: &str, config: ControllerConfig) -> (Controller, String) {
    let c = Controller::new(config);
    let bound = c.listen(addr).await.unwrap().to_string();
    (c, bound)
}

fn quick() -> ControllerConfig {
    ControllerConfig::default().expiry_tick(Duration::from_millis(10)).settle(Duration::ZERO)
}

/// (address, lease) of every instance of `SERVICE`.
async fn listed(registry: &Registry) -> Vec<(String, u64)> {
    let l = registry.list().await.unwrap();
    l.services
        .iter()
        .filter(|s| s.name == SERVICE)
        .flat_map(|s| s.instances.iter().map(|i| (i.instance.address.clone(), i.instance.lease)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// One truth per (service, address)
// ---------------------------------------------------------------------------------------------

/// The campaign's case, on tokio's paused clock with the real lease time (10 s): a stray
/// registration of a live server's address under a lease that is never renewed lapses 10 s
/// later; the server's next renewal finds its instance gone and registers again, so the
/// address is listed — under the server's lease — 10 s and 30 s later, and answers calls.
#[tokio::test(start_paused = true)]
async fn an_address_taken_by_a_lease_that_lapses_is_listed_10_and_30_s_later_and_answers() {
    let (c, reg) = controller(&format!("inproc://{}", unique("hijack")), quick()).await;
    let server = instance("real");
    let addr = server.listen(&format!("inproc://{}", unique("real"))).await.unwrap().to_string();
    let registry = Registry::connect(&reg).await.unwrap();
    let reg_real = registry
        .register(&server, vec![InstanceSpec::new(SERVICE, &addr)], LeaseConfig::default())
        .await
        .unwrap();

    let raw = Client::connect(&reg).await.unwrap();
    let stray = RegisterRequest {
        lease: 0,
        ttl_ms: 10_000,
        instances: vec![InstanceSpec::new(SERVICE, &addr).meta("owner", "stray")],
        credential: String::new(),
    };
    let stray_lease = raw.call(&REGISTER, stray).await.unwrap().lease;
    assert_eq!(
        listed(&registry).await,
        [(addr.clone(), stray_lease)],
        "the stray registration took the address"
    );

    let start = tokio::time::Instant::now();
    for at in [10, 30] {
        tokio::time::sleep_until(start + Duration::from_secs(at)).await;
        let now = listed(&registry).await;
        assert_eq!(now.len(), 1, "{at} s: {now:?}");
        assert_eq!(now[0].0, addr, "{at} s");
        assert_ne!(now[0].1, stray_lease, "{at} s: still under the stray lease");
        assert_eq!(now[0].1, reg_real.lease(), "{at} s: under the server's own lease");
        let client = ServiceClient::connect(&reg).await.unwrap();
        assert_eq!(client.call(&WHO, 0).await.unwrap(), "real", "{at} s");
    }
    assert_eq!(reg_real.registrations(), 2, "registered again exactly once");
    server.shutdown().await;
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Dead instances: ejected once, probed later
// ---------------------------------------------------------------------------------------------

/// 200 registrations of tcp ports nothing listens on beside 2 live servers: each dead instance
/// is ejected once; after that, calls go to the live ones only and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_instances_are_ejected_once_and_calls_then_reach_only_the_live_ones() {
    let (c, reg) = controller("tcp://127.0.0.1:0", quick()).await;
    let registry = Registry::connect(&reg).await.unwrap();
    let mut servers = Vec::new();
    for name in ["live1", "live2"] {
        let s = instance(name);
        let a = s.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
        registry.register(&s, vec![InstanceSpec::new(SERVICE, a)], LeaseConfig::default()).await.unwrap();
        servers.push(s);
    }
    let mut dead = HashSet::new();
    while dead.len() < 200 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        dead.insert(format!("tcp://{}", l.local_addr().unwrap()));
    }
    let raw = Client::connect(&reg).await.unwrap();
    for a in &dead {
        let req = RegisterRequest {
            lease: 0,
            ttl_ms: 120_000,
            instances: vec![InstanceSpec::new(SERVICE, a)],
            credential: String::new(),
        };
        raw.call(&REGISTER, req).await.unwrap();
    }
    // Long enough that no probe is due during the test.
    let config = ServiceConfig::default().mode(Mode::Direct).quarantine(Duration::from_secs(60));
    let client = ServiceClient::connect_with(&reg, config).await.unwrap();
    assert_eq!(client.instances(SERVICE).await.unwrap().len(), 202);
    wait_for(Duration::from_secs(30), "every dead instance to be ejected", async || {
        let _ = client.call(&WHO, 0).await;
        client.stats().instances_dropped == 200
    })
    .await;
    let mut answered = HashSet::new();
    for i in 0..1000 {
        answered.insert(client.call(&WHO, 0).await.unwrap_or_else(|e| panic!("call {i}: {e}")));
    }
    assert_eq!(answered, HashSet::from(["live1".to_string(), "live2".to_string()]));
    assert_eq!(client.stats().instances_dropped, 200, "each dead instance ejected once");
    assert_eq!(client.cached_instances(SERVICE).unwrap().len(), 202, "still listed: the registry lists them");
    for s in servers {
        s.shutdown().await;
    }
    c.shutdown().await;
}

/// An instance listed while another already serves is connected to in the background before
/// any call goes to it: a dead address listed later is ejected without a single attempt, and a
/// live one enters rotation once its connection is made. No call fails meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_listed_later_gets_calls_only_once_connected() {
    let (c, reg) = controller(&unix_address("warm-reg"), quick()).await;
    let registry = Registry::connect(&reg).await.unwrap();
    let live = instance("live");
    let live_addr = live.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    registry
        .register(&live, vec![InstanceSpec::new(SERVICE, live_addr)], LeaseConfig::default())
        .await
        .unwrap();
    let client =
        ServiceClient::connect_with(&reg, ServiceConfig::default().quarantine(Duration::from_secs(60)))
            .await
            .unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "live");

    let dead = unix_address("warm-dead");
    let raw = Client::connect(&reg).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 120_000,
        instances: vec![InstanceSpec::new(SERVICE, &dead)],
        credential: String::new(),
    };
    raw.call(&REGISTER, req).await.unwrap();
    // No call is made meanwhile: only the background connection can find it dead.
    wait_for(Duration::from_secs(20), "the dead instance to be listed and ejected", async || {
        client.stats().instances_dropped == 1
    })
    .await;
    let stats = client.instance_stats(SERVICE);
    let dead_stats = stats.iter().find(|i| i.address == dead).expect("the dead instance is listed");
    assert_eq!((dead_stats.attempts, dead_stats.ejected), (0, Some("unreachable")), "{stats:?}");

    let late = instance("late");
    let late_addr = late.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    registry
        .register(&late, vec![InstanceSpec::new(SERVICE, &late_addr)], LeaseConfig::default())
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(20),
        "a connection to the instance listed later, before any call",
        async || {
            let stats = client.instance_stats(SERVICE);
            stats.iter().any(|i| i.address == late_addr && i.connected_to.is_some())
        },
    )
    .await;
    let mut answered = HashSet::new();
    for i in 0..100 {
        answered.insert(client.call(&WHO, 0).await.unwrap_or_else(|e| panic!("call {i}: {e}")));
    }
    assert_eq!(answered, HashSet::from(["live".to_string(), "late".to_string()]));
    late.shutdown().await;
    live.shutdown().await;
    c.shutdown().await;
}

/// A controller listing a live instance ("live") and one at a unix address nothing listens on
/// yet, and a ServiceClient (probes from 100 ms) that has ejected the dead one.
async fn one_live_one_ejected(reg_tag: &str, late_tag: &str) -> (Controller, Server, String, ServiceClient) {
    let (c, reg) = controller(&unix_address(reg_tag), quick()).await;
    let registry = Registry::connect(&reg).await.unwrap();
    let live = instance("live");
    let live_addr = live.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    registry
        .register(&live, vec![InstanceSpec::new(SERVICE, live_addr)], LeaseConfig::default())
        .await
        .unwrap();
    let late_addr = unix_address(late_tag);
    let raw = Client::connect(&reg).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 120_000,
        instances: vec![InstanceSpec::new(SERVICE, &late_addr)],
        credential: String::new(),
    };
    raw.call(&REGISTER, req).await.unwrap();
    let config = ServiceConfig::default().quarantine(Duration::from_millis(100));
    let client = ServiceClient::connect_with(&reg, config).await.unwrap();
    wait_for(Duration::from_secs(10), "the dead instance to be ejected", async || {
        assert_eq!(client.call(&WHO, 0).await.unwrap(), "live");
        client.stats().instances_dropped == 1
    })
    .await;
    (c, live, late_addr, client)
}

/// An instance that refuses connections is ejected; when a server starts at its address, a
/// probe finds it and calls reach it again — without a registry change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_instance_is_probed_and_back_in_rotation_once_it_answers() {
    let (c, live, late_addr, client) = one_live_one_ejected("probe-reg", "late").await;
    let late = instance("late");
    late.listen(&late_addr).await.unwrap();
    // Probes: after ~0.1, 0.2, 0.4 ... s (at most 1.6 s apart).
    wait_for(Duration::from_secs(20), "calls to reach the instance that came up", async || {
        client.call(&WHO, 0).await.unwrap() == "late"
    })
    .await;
    assert_eq!(client.stats().instances_dropped, 1, "probes that failed did not count as new ejections");
    late.shutdown().await;
    live.shutdown().await;
    c.shutdown().await;
}

/// An ejected instance whose probe is answered "not serving" (`volley.health`) stays out: it
/// is back in rotation only once it says it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_instance_that_says_it_is_not_serving_stays_out_until_it_serves() {
    let (c, live, late_addr, client) = one_live_one_ejected("probe-health-reg", "late-unhealthy").await;
    let late = instance("late");
    late.set_serving(SERVICE, false, "warming its cache");
    late.listen(&late_addr).await.unwrap();
    wait_for(Duration::from_secs(20), "two probes to reach the instance", async || {
        let _ = client.call(&WHO, 0).await;
        late.counters().messages_received >= 2
    })
    .await;
    for i in 0..200 {
        assert_eq!(client.call(&WHO, 0).await.unwrap(), "live", "call {i} went to an instance not serving");
    }
    late.set_serving(SERVICE, true, "");
    wait_for(Duration::from_secs(20), "calls to reach the instance once it serves", async || {
        client.call(&WHO, 0).await.unwrap() == "late"
    })
    .await;
    late.shutdown().await;
    live.shutdown().await;
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Client ids tied to their connection
// ---------------------------------------------------------------------------------------------

fn id_controller(range: std::ops::RangeInclusive<u32>) -> Controller {
    Controller::with_store(Arc::new(MemoryStore::with_client_id_range(range)), quick())
}

/// 40,000 ids — the whole range — taken by 200 connections, which then close: every id is
/// free again soon after (the goal is one second; bounded here at ten for a loaded machine),
/// and all 40,000 can be handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_thousand_ids_from_connections_that_close_are_all_free_again() {
    const N: u32 = 40_000;
    let c = id_controller(1..=N);
    let addr = c.listen(&unix_address("ids")).await.unwrap().to_string();
    let alloc_all = async |conns: usize| {
        let mut clients = Vec::new();
        let mut ids = HashSet::new();
        for _ in 0..conns {
            let client = Client::connect(&addr).await.unwrap();
            let calls = (0..N as usize / conns).map(|_| client.call(&ALLOC_CLIENT_ID, ()));
            for id in futures_util::future::join_all(calls).await {
                assert!(ids.insert(id.unwrap()), "an id handed out twice");
            }
            clients.push(client);
        }
        (clients, ids)
    };
    let (clients, ids) = alloc_all(200).await;
    assert_eq!(ids.len(), N as usize);
    assert_eq!(c.stats().client_ids_held, N as u64);
    let extra = Client::connect(&addr).await.unwrap();
    let full = extra.call(&ALLOC_CLIENT_ID, ()).await;
    assert_eq!(full.as_ref().err().and_then(Error::code), Some(Code::Overloaded), "{full:?}");

    drop(clients);
    let freed =
        wait_for(Duration::from_secs(10), "every id to be free", async || c.stats().client_ids_held == 0)
            .await;
    eprintln!("40,000 client ids free {freed:?} after their 200 connections closed");
    let (again, ids) = alloc_all(4).await;
    assert_eq!(ids.len(), N as usize, "all handed out again");
    drop((again, extra));
    c.shutdown().await;
}

/// An id held by an open connection is never handed out again, and only its holder releases
/// it; closing the holder frees exactly its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_is_not_handed_out_while_its_connection_is_open_and_only_its_holder_releases_it() {
    let c = id_controller(1..=3);
    let addr = c.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut holders = Vec::new();
    for _ in 0..3 {
        let h = Client::connect(&addr).await.unwrap();
        let id = h.call(&ALLOC_CLIENT_ID, ()).await.unwrap();
        holders.push((h, id));
    }
    let other = Client::connect(&addr).await.unwrap();
    assert!(other.call(&ALLOC_CLIENT_ID, ()).await.is_err(), "all three are held");
    let (a, a_id) = &holders[0];
    let b_id = holders[1].1;
    assert!(!a.call(&RELEASE_CLIENT_ID, b_id).await.unwrap(), "released someone else's id");
    assert!(other.call(&ALLOC_CLIENT_ID, ()).await.is_err(), "b's id is still held");
    assert!(a.call(&RELEASE_CLIENT_ID, *a_id).await.unwrap(), "its own");
    assert_eq!(other.call(&ALLOC_CLIENT_ID, ()).await.unwrap(), *a_id);
    drop(holders.remove(1));
    let got =
        wait_for(Duration::from_secs(10), "b's id to be free", async || c.stats().client_ids_held == 2).await;
    assert_eq!(other.call(&ALLOC_CLIENT_ID, ()).await.unwrap(), b_id, "free {got:?} after b closed");
    assert!(other.call(&ALLOC_CLIENT_ID, ()).await.is_err());
    c.shutdown().await;
}

/// A `Registry` keeps its id across a controller restart: it claims it on the new connection,
/// so the restarted controller does not hand it to anyone else; dropping the `Registry` frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_claims_its_id_again_on_a_restarted_controller_and_frees_it_when_dropped() {
    let addr = unix_address("claim");
    let (first, _) = controller(&addr, quick()).await;
    let registry = Registry::connect(&addr).await.unwrap();
    let id = registry.client_id();
    assert_eq!(
        first.stats().client_ids_held,
        1,
        "held by the registry's connection, not the first-contact one"
    );
    first.shutdown().await;
    // The new controller has exactly that id to give.
    let second = id_controller(id..=id);
    second.listen(&addr).await.unwrap();
    wait_for(Duration::from_secs(10), "the registry to reach the new controller", async || {
        registry.list().await.is_ok()
    })
    .await;
    assert_eq!(second.stats().client_ids_held, 1);
    let stranger = Client::connect(&addr).await.unwrap();
    let r = stranger.call(&ALLOC_CLIENT_ID, ()).await;
    assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::Overloaded), "{r:?}");
    drop(registry);
    wait_for(Duration::from_secs(10), "the id to be free", async || second.stats().client_ids_held == 0)
        .await;
    assert_eq!(stranger.call(&ALLOC_CLIENT_ID, ()).await.unwrap(), id);
    second.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// A controller that goes away and comes back
// ---------------------------------------------------------------------------------------------

/// While the controller is down, a client calling it in a loop dials it at most 20 times a
/// second; once it is back, the next attempt (at most a quarter of a second later) connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_to_a_controller_that_is_down_are_paced() {
    let addr = unix_address("paced");
    let (c, _) = controller(&addr, quick()).await;
    let registry = Registry::connect(&addr).await.unwrap();
    c.shutdown().await;
    let before = registry.stats().reconnects;
    let t0 = Instant::now();
    let mut calls = 0u64;
    while t0.elapsed() < Duration::from_secs(1) {
        let e = registry.list().await.expect_err("the controller is down");
        assert!(e.is_transient(), "{e}");
        calls += 1;
        tokio::task::yield_now().await;
    }
    let attempts = registry.stats().reconnects - before;
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        attempts >= 1 && attempts as f64 <= 20.0 * secs + 1.0,
        "{attempts} attempts in {secs:.2} s ({calls} calls)"
    );
    assert!(calls > attempts * 10, "calls in between fail at once ({calls} calls, {attempts} attempts)");
    let (c2, _) = controller(&addr, quick()).await;
    let back =
        wait_for(Duration::from_secs(5), "the registry to reconnect", async || registry.list().await.is_ok())
            .await;
    eprintln!("{attempts} attempts in {secs:.2} s while down; reconnected {back:?} after the restart");
    c2.shutdown().await;
}

/// A server notices its controller went away and registers with the restarted one as soon as
/// it can connect — long before its next renewal (10 s away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_registers_with_a_restarted_controller_at_once_not_at_its_next_renewal() {
    let addr = unix_address("restart");
    let (c, _) = controller(&addr, quick()).await;
    let registry = Registry::connect(&addr).await.unwrap();
    let server = instance("s");
    let s_addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let lease =
        LeaseConfig::default().ttl(Duration::from_secs(30)).renew_every(Some(Duration::from_secs(10)));
    let reg = registry.register(&server, vec![InstanceSpec::new(SERVICE, &s_addr)], lease).await.unwrap();
    c.shutdown().await;
    // The server's registry noticed: it tried to reconnect to the stopped controller.
    wait_until(Duration::from_secs(20), "the registry to try to reconnect", || {
        registry.stats().reconnects > 0
    })
    .await;
    let (c2, _) = controller(&addr, quick()).await;
    let t0 = Instant::now();
    let fresh = Registry::connect(&addr).await.unwrap();
    let took = wait_for(Duration::from_secs(5), "the server to register again", async || {
        listed(&fresh).await.iter().any(|(a, _)| a == &s_addr)
    })
    .await;
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(reg.renewals(), 0, "no renewal was due");
    eprintln!("registered with the restarted controller {took:?} after it started");
    let client =
        ServiceClient::connect_with(&addr, ServiceConfig::default().mode(Mode::Relayed)).await.unwrap();
    assert_eq!(client.call(&WHO, 0).await.unwrap(), "s");
    server.shutdown().await;
    c2.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Refusals are permanent; the controller says what it requires
// ---------------------------------------------------------------------------------------------

/// A wrong registration credential is a permanent refusal, a controller that is down a
/// transient failure; `info` tells whether registering needs the credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_credential_is_permanent_and_info_says_a_credential_is_required() {
    let config = quick().registration_credential("right");
    let (c, reg) = controller("tcp://127.0.0.1:0", config).await;
    let registry = Registry::connect(&reg).await.unwrap();
    registry.set_registration_credential("wrong");
    let s = instance("s");
    let a = s.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let e = registry
        .register(&s, vec![InstanceSpec::new(SERVICE, a)], LeaseConfig::default())
        .await
        .err()
        .unwrap();
    assert!(matches!(e, Error::Unauthenticated(_)) && e.class() == ErrorClass::Permanent, "{e}");
    let raw = Client::connect(&reg).await.unwrap();
    let info = raw.call(&INFO, ()).await.unwrap();
    assert!(info.registration_credential && !info.token && !info.durable, "{info:?}");
    assert!(raw.call(&LIST, ()).await.is_ok(), "reading needs no credential");
    c.shutdown().await;
    let down = Registry::connect(&reg).await.err().unwrap();
    assert!(down.is_transient(), "{down}");
    let (open, reg2) = controller("tcp://127.0.0.1:0", quick()).await;
    let info = Client::connect(&reg2).await.unwrap().call(&INFO, ()).await.unwrap();
    assert!(!info.registration_credential, "{info:?}");
    s.shutdown().await;
    open.shutdown().await;
}
