//! What a Volley system does as time passes, on tokio's paused clock: leases that lapse or are
//! renewed, deadlines that fire at their time, hedges sent only after their delay, the retry
//! budget's reserve refilled by the second, drains that deregister before they stop, and
//! watches that bring a new instance into rotation. Everything is in process (`inproc://`), so
//! every wait is a tokio timer and the clock jumps over it: the times asserted are the library's
//! own, exactly, however loaded the machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::discovery::wire::{REGISTER, RegisterRequest};
use volley::registry::{LeaseConfig, Registry};
use volley::retry::{Hedge, RetryBudget};
use volley::service_client::ServiceConfig;
use volley::{CallOptions, Client, Code, Drain, Error, Method, Server, ServiceClient, Status};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

/// `WORK(ms)`: answers `ms` after `ms` milliseconds (a tokio timer: simulated time here).
const WORK: Method<u64, u64> = Method::new("over_time", "work");
/// `FAIL`: answers `Overloaded` at once.
const FAIL: Method<u64, u64> = Method::new("over_time", "fail");

fn unique(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("inproc://over-time-{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Relaxed))
}

/// A server whose handlers count the calls they start into `calls`.
fn server(calls: Arc<AtomicU64>) -> Server {
    let c = calls.clone();
    Server::builder()
        .handle(&WORK, move |ms: u64| {
            c.fetch_add(1, Relaxed);
            async move {
                // The work's time, on the paused clock.
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ms)
            }
        })
        .handle(&FAIL, move |_: u64| {
            calls.fetch_add(1, Relaxed);
            async move { Err::<u64, _>(Status::new(Code::Overloaded, "refusing on purpose")) }
        })
        .build()
}

/// A controller's settings that expire leases within 10 ms of their end and do not settle.
fn quick() -> ControllerConfig {
    ControllerConfig::default().expiry_tick(Duration::from_millis(10)).settle(Duration::ZERO)
}

/// A controller with the `quick` settings.
async fn controller() -> (Controller, String) {
    let c = Controller::new(quick());
    let addr = c.listen(&unique("ctl")).await.unwrap().to_string();
    (c, addr)
}

/// A server listening in process and registered with `registry` under `lease`.
struct Instance {
    server: Server,
    address: String,
    calls: Arc<AtomicU64>,
    registration: volley::registry::Registration,
}

async fn instance(registry: &Registry, lease: LeaseConfig) -> Instance {
    let calls = Arc::new(AtomicU64::new(0));
    let server = server(calls.clone());
    let address = server.listen(&unique("i")).await.unwrap().to_string();
    let registration =
        registry.register(&server, vec![InstanceSpec::new(WORK.service(), &address)], lease).await.unwrap();
    Instance { server, address, calls, registration }
}

/// The addresses the controller lists for the service.
async fn listed(registry: &Registry) -> Vec<String> {
    let r = registry.resolve(WORK.service()).await.unwrap();
    let mut a: Vec<String> = r.instances.iter().map(|i| i.address.clone()).collect();
    a.sort();
    a
}

// ---------------------------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------------------------

/// A lease nobody renews keeps its instance listed for its whole time-to-live and no longer:
/// listed 10 ms before it ends, gone 30 ms after (the expiry tick is 10 ms).
#[tokio::test(start_paused = true)]
async fn a_lease_nobody_renews_is_listed_for_its_ttl_and_not_after() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let raw = Client::connect(&ctl).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 5_000,
        instances: vec![InstanceSpec::new(WORK.service(), "tcp://10.0.0.1:7000")],
        credential: String::new(),
    };
    let t0 = Instant::now();
    raw.call(&REGISTER, req).await.unwrap();
    tokio::time::sleep_until(t0 + Duration::from_millis(4_990)).await;
    assert_eq!(listed(&registry).await, ["tcp://10.0.0.1:7000"], "listed until its time is up");
    tokio::time::sleep_until(t0 + Duration::from_millis(5_030)).await;
    assert_eq!(listed(&registry).await, Vec::<String>::new(), "listed past its time");
    c.shutdown().await;
}

/// A registration renews its lease a third of a lease time apart: over a minute of 1 s leases
/// the instance never leaves the list, and it was registered once and renewed about 180 times.
#[tokio::test(start_paused = true)]
async fn a_renewed_lease_keeps_its_instance_listed_for_many_lease_times() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let i = instance(&registry, LeaseConfig::default().ttl(Duration::from_secs(1))).await;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        assert_eq!(listed(&registry).await, std::slice::from_ref(&i.address), "at {:?}", t0.elapsed());
        // Looked at four times a second (paused clock: simulated time passes).
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(i.registration.registrations(), 1, "never registered again: the lease never lapsed");
    let renewals = i.registration.renewals();
    assert!((170..=185).contains(&renewals), "{renewals} renewals in 60 s of 1 s leases");
    i.server.shutdown().await;
    c.shutdown().await;
}

/// A server that shuts down revokes its lease: it is gone from the list at once, not a lease
/// time later.
#[tokio::test(start_paused = true)]
async fn a_server_that_shuts_down_is_delisted_at_once_not_when_its_lease_lapses() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let i = instance(&registry, LeaseConfig::default().ttl(Duration::from_secs(30))).await;
    assert_eq!(listed(&registry).await, std::slice::from_ref(&i.address));
    let t0 = Instant::now();
    i.server.shutdown().await;
    let took = wait_for(Duration::from_secs(60), "the instance to leave the list", async || {
        listed(&registry).await.is_empty()
    })
    .await;
    assert!(t0.elapsed() < Duration::from_secs(1), "delisted after {took:?}: the lease lapsed instead");
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Deadlines
// ---------------------------------------------------------------------------------------------

/// Forty calls with deadlines from 10 ms to 400 ms to a handler that takes a minute: each ends
/// with `Timeout` of its own deadline, at that deadline (within a millisecond), and none is left
/// waiting.
#[tokio::test(start_paused = true)]
async fn each_deadline_fires_at_its_own_time() {
    let s = server(Arc::default());
    let addr = s.listen(&unique("deadlines")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    let calls = (1..=40u64).map(|k| {
        let client = client.clone();
        let deadline = Duration::from_millis(10 * k);
        async move {
            let t0 = Instant::now();
            let r = client.call_with(&WORK, 60_000, CallOptions::default().timeout(deadline)).await;
            (deadline, r, t0.elapsed())
        }
    });
    for (deadline, r, took) in futures_util::future::join_all(calls).await {
        assert_eq!(r, Err(Error::Timeout(deadline)));
        assert!(
            took >= deadline && took <= deadline + Duration::from_millis(1),
            "{deadline:?} fired at {took:?}"
        );
    }
    assert_eq!(client.pending_calls(), 0);
    s.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Hedging and the retry budget
// ---------------------------------------------------------------------------------------------

/// Two instances, hedging after 30 ms: calls answered in 10 ms send no hedge at all; calls that
/// take 50 ms each send exactly one, and still end when the first attempt answers (50 ms), not
/// when the hedge would (80 ms).
#[tokio::test(start_paused = true)]
async fn a_hedge_goes_out_after_its_delay_and_only_then() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let config = ServiceConfig::default()
        .hedge(Hedge::After(Duration::from_millis(30)))
        .retry_budget(RetryBudget::default().ratio(1.0));
    let client = ServiceClient::with_registry(registry.clone(), config);
    let idem = CallOptions::default().idempotent();
    for _ in 0..50 {
        assert_eq!(client.call_with(&WORK, 10, idem).await, Ok(10));
    }
    assert_eq!(client.stats().hedges, 0, "a call answered before the hedge delay hedged");
    for _ in 0..50 {
        let t0 = Instant::now();
        assert_eq!(client.call_with(&WORK, 50, idem).await, Ok(50));
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(50) && took < Duration::from_millis(60), "took {took:?}");
    }
    let stats = client.stats();
    assert_eq!((stats.hedges, stats.hedges_refused), (50, 0), "{stats:?}");
    // Each slow call ran twice: once per instance.
    assert_eq!(a.calls.load(Relaxed) + b.calls.load(Relaxed), 50 + 100);
    for i in [a, b] {
        i.server.shutdown().await;
    }
    c.shutdown().await;
}

/// With no share of calls (ratio 0), the budget's reserve alone lets a client retry: 5 retries
/// a second, at most a second's worth held. Ten calls a second for ten seconds to instances
/// that refuse everything make 100 calls and about 5 + 50 retries — not one per call.
#[tokio::test(start_paused = true)]
async fn the_budgets_reserve_refills_by_the_second() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let config = ServiceConfig::default().retry_budget(RetryBudget::default().ratio(0.0).min_per_second(5));
    let client = ServiceClient::with_registry(registry.clone(), config);
    for _ in 0..100 {
        let e = client.call_with(&FAIL, 0, CallOptions::default().idempotent()).await.unwrap_err();
        assert_eq!(e.code(), Some(Code::Overloaded), "{e}");
        // Ten calls a second, on the paused clock: the reserve refills with simulated time.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = a.calls.load(Relaxed) + b.calls.load(Relaxed);
    assert!((100 + 50..=100 + 56).contains(&attempts), "{attempts} attempts for 100 calls");
    for i in [a, b] {
        i.server.shutdown().await;
    }
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Drains and shutdowns
// ---------------------------------------------------------------------------------------------

/// A graceful stop takes its steps in order: the instance leaves the list first, the server
/// keeps answering through the grace, the call still running at the go-away finishes, and the
/// stop reports a complete drain after grace + that call's remaining time, not sooner.
#[tokio::test(start_paused = true)]
async fn a_graceful_stop_deregisters_then_serves_through_its_grace_then_drains() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let i = instance(&registry, LeaseConfig::default().ttl(Duration::from_secs(30))).await;
    let client = Client::connect(&i.address).await.unwrap();
    let long = {
        let client = client.clone();
        tokio::spawn(async move {
            client.call_with(&WORK, 1_500, CallOptions::default().timeout(Duration::from_secs(60))).await
        })
    };
    wait_until(Duration::from_secs(10), "the long call to start", || i.calls.load(Relaxed) == 1).await;
    let t0 = Instant::now();
    let drain = Drain::default()
        .deregister_within(Duration::from_secs(1))
        .grace(Duration::from_millis(500))
        .deadline(Duration::from_secs(5));
    let stop = {
        let server = i.server.clone();
        tokio::spawn(async move { server.stop_gracefully(drain).await })
    };
    wait_for(Duration::from_secs(10), "the instance to leave the list", async || {
        listed(&registry).await.is_empty()
    })
    .await;
    assert!(t0.elapsed() < Duration::from_millis(500), "deregistered only after {:?}", t0.elapsed());
    // Within the grace, the server still answers new calls.
    assert_eq!(client.call(&WORK, 1).await, Ok(1));
    assert!(t0.elapsed() < Duration::from_millis(500));
    assert!(stop.await.unwrap(), "everything drained within the deadline");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1_490) && took < Duration::from_millis(1_600),
        "stopped after {took:?}"
    );
    assert_eq!(long.await.unwrap(), Ok(1_500), "the call running at the go-away finished");
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Watches
// ---------------------------------------------------------------------------------------------

/// A caller's watch brings an instance registered later into rotation: within its watch's
/// answer (well under a second of simulated time) calls reach it, and round-robin then
/// shares them evenly.
#[tokio::test(start_paused = true)]
async fn an_instance_registered_later_gets_calls_once_the_watch_reports_it() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let client = ServiceClient::with_registry(registry.clone(), ServiceConfig::default());
    for _ in 0..10 {
        client.call(&WORK, 1).await.unwrap();
    }
    assert_eq!(a.calls.load(Relaxed), 10);
    let b = instance(&registry, LeaseConfig::default()).await;
    let t0 = Instant::now();
    wait_for(Duration::from_secs(60), "a call to reach the new instance", async || {
        client.call(&WORK, 1).await.unwrap();
        b.calls.load(Relaxed) > 0
    })
    .await;
    assert!(t0.elapsed() < Duration::from_secs(1), "the new instance was found after {:?}", t0.elapsed());
    let (a0, b0) = (a.calls.load(Relaxed), b.calls.load(Relaxed));
    for _ in 0..100 {
        client.call(&WORK, 1).await.unwrap();
    }
    let (da, db) = (a.calls.load(Relaxed) - a0, b.calls.load(Relaxed) - b0);
    assert!((40..=60).contains(&da) && da + db == 100, "{da} and {db} of 100 calls");
    for i in [a, b] {
        i.server.shutdown().await;
    }
    c.shutdown().await;
}

/// An instance whose server stops leaves rotation: after its lease is revoked every call of a
/// hundred reaches the other instance, and none fails.
#[tokio::test(start_paused = true)]
async fn an_instance_that_stops_gets_no_more_calls_and_none_fails() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let client = ServiceClient::with_registry(registry.clone(), ServiceConfig::default());
    for _ in 0..20 {
        client.call(&WORK, 1).await.unwrap();
    }
    assert!(a.calls.load(Relaxed) > 0 && b.calls.load(Relaxed) > 0);
    b.server.stop_gracefully(Drain::default().grace(Duration::from_millis(200))).await;
    let before = b.calls.load(Relaxed);
    for _ in 0..100 {
        assert_eq!(client.call(&WORK, 1).await, Ok(1));
    }
    assert_eq!(b.calls.load(Relaxed), before, "calls reached the stopped instance");
    a.server.shutdown().await;
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Controller restarts
// ---------------------------------------------------------------------------------------------

/// A controller that restarts (losing every lease) lists the instance again as soon as the
/// registration's next renewal finds its lease unknown — well within one lease time — and the
/// registration registered exactly once more.
#[tokio::test(start_paused = true)]
async fn after_a_controller_restart_the_instance_is_listed_again_within_a_lease_time() {
    let addr = unique("restart");
    let c = Controller::new(quick());
    c.listen(&addr).await.unwrap();
    let registry = Registry::connect(&addr).await.unwrap();
    let i = instance(&registry, LeaseConfig::default().ttl(Duration::from_secs(3))).await;
    c.shutdown().await;
    drop(c);
    let c = Controller::new(quick());
    c.listen(&addr).await.unwrap();
    let t0 = Instant::now();
    let observer = Registry::connect(&addr).await.unwrap();
    let took = wait_for(Duration::from_secs(60), "the instance to be listed again", async || {
        observer
            .resolve(WORK.service())
            .await
            .is_ok_and(|r| r.instances.iter().any(|x| x.address == i.address))
    })
    .await;
    assert!(took < Duration::from_secs(3), "listed again only after {took:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(i.registration.registrations(), 2, "registered once more");
    i.server.shutdown().await;
    c.shutdown().await;
}

/// A direct caller keeps calling its instances while their controller is down for five
/// seconds: every one of a hundred calls spread over the outage succeeds.
#[tokio::test(start_paused = true)]
async fn direct_calls_go_on_while_the_controller_is_down() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let client = ServiceClient::with_registry(registry.clone(), ServiceConfig::default());
    assert_eq!(client.call(&WORK, 1).await, Ok(1));
    c.shutdown().await;
    for k in 0..100 {
        assert_eq!(client.call(&WORK, 1).await, Ok(1), "call {k} while the controller is down");
        // Calls spread over the outage (paused clock).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(a.calls.load(Relaxed) + b.calls.load(Relaxed), 101);
    assert!(a.calls.load(Relaxed) >= 40 && b.calls.load(Relaxed) >= 40, "both instances kept their share");
    for i in [a, b] {
        i.server.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Deadlines across the relay and against hedges
// ---------------------------------------------------------------------------------------------

/// A relayed call (through the controller) to a handler slower than its deadline ends with
/// `Timeout` at the deadline, and the relay answers the next call at once.
#[tokio::test(start_paused = true)]
async fn a_relayed_call_ends_at_its_deadline() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let i = instance(&registry, LeaseConfig::default()).await;
    let config = ServiceConfig::default().mode(volley::service_client::Mode::Relayed);
    let client = ServiceClient::with_registry(registry.clone(), config);
    assert_eq!(client.call(&WORK, 1).await, Ok(1));
    let deadline = Duration::from_millis(300);
    let t0 = Instant::now();
    let r = client.call_with(&WORK, 60_000, CallOptions::default().timeout(deadline)).await;
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::Timeout(_)))
            || r.as_ref().err().and_then(Error::code) == Some(Code::DeadlineExceeded),
        "{r:?}"
    );
    assert!(took >= deadline && took < deadline + Duration::from_millis(20), "ended after {took:?}");
    let t1 = Instant::now();
    assert_eq!(client.call(&WORK, 5).await, Ok(5));
    assert!(t1.elapsed() < Duration::from_millis(10), "the next call waited {:?}", t1.elapsed());
    i.server.shutdown().await;
    c.shutdown().await;
}

/// A call whose deadline comes before its hedge delay sends no hedge: it ends at its deadline
/// with one attempt.
#[tokio::test(start_paused = true)]
async fn a_deadline_before_the_hedge_delay_sends_no_hedge() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let config = ServiceConfig::default()
        .hedge(Hedge::After(Duration::from_millis(200)))
        .retry_budget(RetryBudget::default().ratio(1.0));
    let client = ServiceClient::with_registry(registry.clone(), config);
    let opts = CallOptions::default().idempotent().timeout(Duration::from_millis(100));
    for _ in 0..20 {
        let r = client.call_with(&WORK, 1_000, opts).await;
        assert!(r.is_err(), "{r:?}");
    }
    assert_eq!(client.stats().hedges, 0);
    assert_eq!(a.calls.load(Relaxed) + b.calls.load(Relaxed), 20, "one attempt per call");
    for i in [a, b] {
        i.server.shutdown().await;
    }
    c.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Ejection and probes
// ---------------------------------------------------------------------------------------------

/// An instance listed at an address where nothing serves is left out after the first failed
/// connection, calls all go to the live one and none fails; once a server listens there, a
/// probe brings it back within its quarantine (jittered, at most 1.25 × 1 s after the failure,
/// or a later probe's) and calls reach it.
#[tokio::test(start_paused = true)]
async fn an_unreachable_instance_is_probed_back_once_it_serves() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let live = instance(&registry, LeaseConfig::default()).await;
    let dead_addr = unique("dead");
    let raw = Client::connect(&ctl).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 600_000,
        instances: vec![InstanceSpec::new(WORK.service(), &dead_addr)],
        credential: String::new(),
    };
    raw.call(&REGISTER, req).await.unwrap();
    let config = ServiceConfig::default().quarantine(Duration::from_secs(1));
    let client = ServiceClient::with_registry(registry.clone(), config);
    for k in 0..50 {
        assert_eq!(client.call(&WORK, 1).await, Ok(1), "call {k}");
    }
    assert_eq!(live.calls.load(Relaxed), 50, "every call reached the live instance");
    assert!(client.stats().instances_dropped >= 1);
    // Now something serves there.
    let calls = Arc::new(AtomicU64::new(0));
    let revived = server(calls.clone());
    revived.listen(&dead_addr).await.unwrap();
    let t0 = Instant::now();
    wait_for(Duration::from_secs(120), "a call to reach the revived instance", async || {
        client.call(&WORK, 1).await.unwrap();
        calls.load(Relaxed) > 0
    })
    .await;
    // The first probe is due at most 1.25 s after the failure; one failed probe more doubles
    // the pause (at most 2.5 s).
    assert!(t0.elapsed() < Duration::from_secs(4), "back only after {:?}", t0.elapsed());
    revived.shutdown().await;
    live.server.shutdown().await;
    c.shutdown().await;
}

/// Retries and hedges get what is left of the call's time, never a fresh timeout: an
/// idempotent call with a 100 ms deadline to two instances that both take 150 ms, hedged after
/// 30 ms, ends with `Timeout` at 100 ms — not at 130 ms (a fresh timeout for the hedge) or later.
#[tokio::test(start_paused = true)]
async fn a_hedge_gets_what_is_left_of_the_calls_time() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let config = ServiceConfig::default()
        .hedge(Hedge::After(Duration::from_millis(30)))
        .retry_budget(RetryBudget::default().ratio(1.0));
    let client = ServiceClient::with_registry(registry.clone(), config);
    assert_eq!(client.call(&WORK, 1).await, Ok(1), "resolved and connected");
    let deadline = Duration::from_millis(100);
    for _ in 0..10 {
        let t0 = Instant::now();
        let r = client.call_with(&WORK, 150, CallOptions::default().idempotent().timeout(deadline)).await;
        let took = t0.elapsed();
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert!(took >= deadline && took < deadline + Duration::from_millis(5), "ended after {took:?}");
    }
    assert_eq!(client.stats().hedges, 10, "each call hedged once");
    for i in [a, b] {
        i.server.shutdown().await;
    }
    c.shutdown().await;
}

/// An instance whose lease lapses (registered by hand, never renewed, its server still up)
/// leaves a caller's rotation once the controller drops it and the caller's watch says so:
/// after its lease time plus a second, no call reaches it.
#[tokio::test(start_paused = true)]
async fn an_instance_whose_lease_lapses_leaves_the_callers_rotation() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let kept = instance(&registry, LeaseConfig::default()).await;
    let lapsing_calls = Arc::new(AtomicU64::new(0));
    let lapsing = server(lapsing_calls.clone());
    let addr = lapsing.listen(&unique("lapsing")).await.unwrap().to_string();
    let raw = Client::connect(&ctl).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 2_000,
        instances: vec![InstanceSpec::new(WORK.service(), &addr)],
        credential: String::new(),
    };
    let t0 = Instant::now();
    raw.call(&REGISTER, req).await.unwrap();
    let client = ServiceClient::with_registry(registry.clone(), ServiceConfig::default());
    for _ in 0..20 {
        client.call(&WORK, 1).await.unwrap();
    }
    assert!(lapsing_calls.load(Relaxed) >= 5, "the instance was in rotation");
    tokio::time::sleep_until(t0 + Duration::from_secs(3)).await;
    let before = lapsing_calls.load(Relaxed);
    for _ in 0..50 {
        assert_eq!(client.call(&WORK, 1).await, Ok(1));
    }
    assert_eq!(lapsing_calls.load(Relaxed), before, "calls reached an instance whose lease lapsed");
    lapsing.shutdown().await;
    kept.server.shutdown().await;
    c.shutdown().await;
}

/// Calls to a controller that is down fail at once (they do not wait out a timeout), and once
/// it is back the registry connection is made again within the reconnect pause's cap (250 ms).
#[tokio::test(start_paused = true)]
async fn a_registry_reconnects_within_its_pause_cap_once_the_controller_is_back() {
    let addr = unique("back");
    let c = Controller::new(quick());
    c.listen(&addr).await.unwrap();
    let registry = Registry::connect(&addr).await.unwrap();
    registry.resolve(WORK.service()).await.unwrap();
    c.shutdown().await;
    drop(c);
    for _ in 0..20 {
        let t0 = Instant::now();
        assert!(registry.resolve(WORK.service()).await.is_err(), "the controller is down");
        assert!(
            t0.elapsed() < Duration::from_millis(10),
            "a call to a down controller waited {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // callers' pace (paused clock)
    }
    let c = Controller::new(quick());
    c.listen(&addr).await.unwrap();
    let back = wait_for(Duration::from_secs(10), "the registry to answer again", async || {
        registry.resolve(WORK.service()).await.is_ok()
    })
    .await;
    assert!(back <= Duration::from_millis(260), "answered again only after {back:?}");
    c.shutdown().await;
}

/// The expiry tick bounds how late a lapsed lease is dropped: with a 500 ms tick, a 1 s lease
/// is still listed at 0.99 s and gone by 1.51 s.
#[tokio::test(start_paused = true)]
async fn a_lapsed_lease_is_dropped_within_one_expiry_tick() {
    let c = Controller::new(
        ControllerConfig::default().expiry_tick(Duration::from_millis(500)).settle(Duration::ZERO),
    );
    let ctl = c.listen(&unique("tick")).await.unwrap().to_string();
    let registry = Registry::connect(&ctl).await.unwrap();
    let raw = Client::connect(&ctl).await.unwrap();
    let req = RegisterRequest {
        lease: 0,
        ttl_ms: 1_000,
        instances: vec![InstanceSpec::new(WORK.service(), "tcp://10.0.0.2:7000")],
        credential: String::new(),
    };
    let t0 = Instant::now();
    raw.call(&REGISTER, req).await.unwrap();
    tokio::time::sleep_until(t0 + Duration::from_millis(990)).await;
    assert_eq!(listed(&registry).await.len(), 1, "dropped before its lease ended");
    let gone = wait_for(Duration::from_secs(30), "the lapsed lease to be dropped", async || {
        listed(&registry).await.is_empty()
    })
    .await;
    let at = t0.elapsed();
    assert!(at <= Duration::from_millis(1_510), "dropped only at {at:?} ({gone:?} after 0.99 s)");
    c.shutdown().await;
}

/// With an empty budget (no share, no reserve) a hedge is refused, counted, and the call keeps
/// waiting on its first attempt: every call takes its full 50 ms and runs once.
#[tokio::test(start_paused = true)]
async fn a_hedge_the_budget_refuses_is_counted_and_the_call_waits_for_its_first_attempt() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let a = instance(&registry, LeaseConfig::default()).await;
    let b = instance(&registry, LeaseConfig::default()).await;
    let config = ServiceConfig::default()
        .hedge(Hedge::After(Duration::from_millis(10)))
        .retry_budget(RetryBudget::default().ratio(0.0).min_per_second(0));
    let client = ServiceClient::with_registry(registry.clone(), config);
    for _ in 0..20 {
        let t0 = Instant::now();
        assert_eq!(client.call_with(&WORK, 50, CallOptions::default().idempotent()).await, Ok(50));
        assert!(t0.elapsed() >= Duration::from_millis(50), "answered after {:?}", t0.elapsed());
    }
    let stats = client.stats();
    assert_eq!((stats.hedges, stats.hedges_refused), (0, 20), "{stats:?}");
    assert_eq!(a.calls.load(Relaxed) + b.calls.load(Relaxed), 20, "one attempt per call");
    for i in [a, b] {
        i.server.shutdown().await;
    }
    c.shutdown().await;
}

/// A server that is not registered anywhere skips the wait for its deregistration: a graceful
/// stop takes its grace (300 ms) and no more.
#[tokio::test(start_paused = true)]
async fn a_graceful_stop_of_an_unregistered_server_takes_only_its_grace() {
    let s = server(Arc::default());
    let addr = s.listen(&unique("unregistered")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    assert_eq!(client.call(&WORK, 1).await, Ok(1));
    let drain = Drain::default()
        .deregister_within(Duration::from_secs(5))
        .grace(Duration::from_millis(300))
        .deadline(Duration::from_secs(5));
    let t0 = Instant::now();
    assert!(s.stop_gracefully(drain).await, "nothing was running");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(350),
        "stopped after {took:?}"
    );
}

/// A failing instance is out of rotation for its quarantine (1 s, jittered ±25 %) after the
/// failure that ejected it: no call reaches it before 0.75 s, and calls reach it again (it is
/// probed back) by 1.25 s plus one pause of the probe clock.
#[tokio::test(start_paused = true)]
async fn an_ejected_instance_is_out_for_its_quarantine_and_no_longer() {
    let (c, ctl) = controller().await;
    let registry = Registry::connect(&ctl).await.unwrap();
    let good = instance(&registry, LeaseConfig::default()).await;
    let bad_calls = Arc::new(AtomicU64::new(0));
    let counted = bad_calls.clone();
    let bad = Server::builder()
        .handle(&WORK, move |_: u64| {
            counted.fetch_add(1, Relaxed);
            async move { Err::<u64, _>(Status::new(Code::Internal, "failing on purpose")) }
        })
        .build();
    let bad_addr = bad.listen(&unique("bad")).await.unwrap().to_string();
    let spec = vec![InstanceSpec::new(WORK.service(), &bad_addr)];
    let _registered = registry.register(&bad, spec, LeaseConfig::default()).await.unwrap();
    let outliers = volley::balance::Outliers::default().consecutive_failures(1).latency_factor(0.0);
    let config = ServiceConfig::default().outliers(outliers).quarantine(Duration::from_secs(1));
    let client = ServiceClient::with_registry(registry.clone(), config);
    // Round-robin: the first call that reaches the bad instance fails and ejects it.
    while bad_calls.load(Relaxed) == 0 {
        let _ = client.call(&WORK, 1).await;
    }
    let ejected_at = Instant::now();
    let stats = client.instance_stats(WORK.service());
    let out = stats.iter().find(|s| s.address == bad_addr).and_then(|s| s.ejected);
    assert_eq!(out, Some("failing"), "{stats:?}");
    let first_back = loop {
        let r = client.call(&WORK, 1).await;
        if bad_calls.load(Relaxed) > 1 {
            break ejected_at.elapsed();
        }
        assert_eq!(r, Ok(1), "only the live instance answers while the other is out");
        assert!(ejected_at.elapsed() < Duration::from_secs(10), "never back in rotation");
        // Calls every 10 ms (paused clock) until one reaches it again.
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(first_back >= Duration::from_millis(750), "back after {first_back:?}, before its quarantine");
    assert!(first_back <= Duration::from_millis(1_300), "back only after {first_back:?}");
    bad.shutdown().await;
    good.server.shutdown().await;
    c.shutdown().await;
}

/// A shutdown with a 1 s drain deadline: the call that ends within it is answered, the one
/// that would run for a minute is answered `ShuttingDown` at the deadline, and the shutdown
/// returns then, saying it did not drain.
#[tokio::test(start_paused = true)]
async fn a_shutdown_deadline_answers_what_outlasts_it_with_shutting_down_at_the_deadline() {
    let started = Arc::new(AtomicU64::new(0));
    let s = server(started.clone());
    let addr = s.listen(&unique("deadline")).await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    let opts = CallOptions::default().timeout(Duration::from_secs(120));
    let quick = tokio::spawn({
        let client = client.clone();
        async move { client.call_with(&WORK, 200, opts).await }
    });
    let slow = tokio::spawn({
        let client = client.clone();
        async move {
            let r = client.call_with(&WORK, 60_000, opts).await;
            (r, Instant::now())
        }
    });
    wait_until(Duration::from_secs(10), "both calls to reach their handler", || started.load(Relaxed) == 2)
        .await;
    let t0 = Instant::now();
    assert!(!s.shutdown_with_deadline(Duration::from_secs(1)).await, "a minute's call cannot drain in 1 s");
    let took = t0.elapsed();
    assert_eq!(quick.await.unwrap(), Ok(200));
    let (r, ended) = slow.await.unwrap();
    assert!(took >= Duration::from_secs(1) && took < Duration::from_millis(1_100), "returned after {took:?}");
    assert!(
        ended - t0 < Duration::from_millis(1_100),
        "the slow call ended {:?} after the shutdown began",
        ended - t0
    );
    assert!(
        matches!(&r, Err(e) if e.code() == Some(Code::ShuttingDown) || matches!(e, Error::Closed | Error::NotRun(_))),
        "{r:?}"
    );
}
