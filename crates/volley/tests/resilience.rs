//! Resilience of a `ServiceClient` against instances over tcp loopback: hedged requests cut
//! the tail a slow instance causes, the retry budget caps extra attempts at its share of the
//! calls, outlier ejection keeps a failing or slow instance out until its probe, and peak-EWMA
//! balancing sends calls to the faster instance. Assertions are on counts; where time is the
//! point (hedging), on counts of calls slower than a bound with wide margins.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use volley::balance::{Balance, Outliers};
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registry};
use volley::retry::{Hedge, RetryBudget};
use volley::service_client::ServiceConfig;
use volley::{CallOptions, Code, Method, Server, ServiceClient, Status};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

const WORK: Method<u64, u64> = Method::new("work", "run");

/// How an instance answers.
#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    /// Every call after this delay.
    Slow(Duration),
    /// Every call with this error code.
    Fail(Code),
}

/// One instance: its server and what it saw.
struct Instance {
    server: Server,
    address: String,
    /// Calls its handler started.
    calls: Arc<AtomicU64>,
    /// Calls dropped before they ended (cancelled by the caller).
    dropped: Arc<AtomicU64>,
}

/// Counts a handler that was dropped before it finished.
struct DropGuard(Arc<AtomicU64>, bool);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Relaxed);
        }
    }
}

async fn instance(registry: &Registry, behaviour: Behaviour) -> Instance {
    let (calls, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (c, d) = (calls.clone(), dropped.clone());
    let server = Server::builder()
        .handle(&WORK, move |x: u64| {
            c.fetch_add(1, Relaxed);
            let guard = DropGuard(d.clone(), false);
            async move {
                // The whole guard moves in (not just the field the block writes).
                let mut guard = guard;
                let r = match behaviour {
                    Behaviour::Ok => Ok(x),
                    Behaviour::Slow(d) => {
                        // Slow work, on the paused clock.
                        tokio::time::sleep(d).await;
                        Ok(x)
                    }
                    Behaviour::Fail(code) => Err(Status::new(code, "failing on purpose")),
                };
                guard.1 = true;
                r
            }
        })
        .build();
    // In process, so that every wait here (slow handlers, hedges, ejection, quarantine, the
    // latency check) is a tokio timer, and the tests run on the paused clock.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!("inproc://resilience-{}-{}", std::process::id(), NEXT.fetch_add(1, Relaxed));
    let address = server.listen(&name).await.unwrap().to_string();
    let spec = InstanceSpec::new(WORK.service(), address.clone());
    registry.register(&server, vec![spec], LeaseConfig::default()).await.unwrap();
    Instance { server, address, calls, dropped }
}

async fn controller(tag: &str) -> (Controller, Registry) {
    let c = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let addr = c.listen(&format!("inproc://resilience-{tag}")).await.unwrap();
    let registry = Registry::connect(&addr.to_string()).await.unwrap();
    (c, registry)
}

async fn stop(instances: Vec<Instance>, controller: Controller) {
    for i in instances {
        i.server.shutdown().await;
    }
    controller.shutdown().await;
}

fn idempotent() -> CallOptions {
    CallOptions::default().idempotent()
}

/// Makes `n` calls, `concurrency` at a time; returns how many took at least `slow`.
async fn slow_calls(client: &ServiceClient, n: usize, concurrency: usize, slow: Duration) -> usize {
    let next = Arc::new(AtomicU64::new(0));
    let tasks = (0..concurrency).map(|_| {
        let (client, next) = (client.clone(), next.clone());
        tokio::spawn(async move {
            let mut slow_ones = 0;
            while next.fetch_add(1, Relaxed) < n as u64 {
                let t0 = Instant::now();
                client.call_with(&WORK, 1, idempotent()).await.unwrap();
                slow_ones += (t0.elapsed() >= slow) as usize;
            }
            slow_ones
        })
    });
    futures_util::future::join_all(tasks).await.into_iter().map(|r| r.unwrap()).sum()
}

#[tokio::test(start_paused = true)]
async fn hedged_calls_do_not_wait_for_the_slow_instance() {
    let (controller, registry) = controller("hedge").await;
    let fast = instance(&registry, Behaviour::Ok).await;
    let slow = instance(&registry, Behaviour::Slow(Duration::from_millis(50))).await;
    const N: usize = 200;
    let plain = ServiceClient::with_registry(registry.clone(), ServiceConfig::default());
    let slow_plain = slow_calls(&plain, N, 4, Duration::from_millis(50)).await;
    // Every call may hedge: the budget's share is one extra attempt per call.
    let config = ServiceConfig::default()
        .hedge(Hedge::After(Duration::from_millis(5)))
        .retry_budget(RetryBudget::default().ratio(1.0));
    let hedged = ServiceClient::with_registry(registry.clone(), config);
    let slow_hedged = slow_calls(&hedged, N, 4, Duration::from_millis(50)).await;
    // Round-robin sends half the calls to the slow instance: unhedged, those take 50 ms.
    assert!(slow_plain >= N * 4 / 10, "unhedged: {slow_plain} of {N} calls slow");
    // Hedged, a call waits 5 ms and then takes the fast instance's reply: a call slower than
    // 50 ms needs a stall of about 45 ms on this machine.
    assert!(slow_hedged <= N / 10, "hedged: {slow_hedged} of {N} calls slow");
    let stats = hedged.stats();
    assert!(stats.hedges >= (N / 4) as u64, "{stats:?}");
    assert_eq!(stats.hedges_refused, 0, "{stats:?}");
    // The losing attempts were cancelled on the slow instance, not left to run.
    wait_until(Duration::from_secs(30), "cancels on the slow instance", || {
        slow.dropped.load(Relaxed) >= (N / 4) as u64
    })
    .await;
    assert_eq!(fast.dropped.load(Relaxed), 0);
    stop(vec![fast, slow], controller).await;
}

/// Two instances that answer `Overloaded` to every call.
async fn two_overloaded(tag: &str) -> (Controller, Registry, Vec<Instance>) {
    let (controller, registry) = controller(tag).await;
    let a = instance(&registry, Behaviour::Fail(Code::Overloaded)).await;
    let b = instance(&registry, Behaviour::Fail(Code::Overloaded)).await;
    (controller, registry, vec![a, b])
}

/// Calls the handlers of `instances` started.
fn total_calls(instances: &[Instance]) -> u64 {
    instances.iter().map(|i| i.calls.load(Relaxed)).sum()
}

#[tokio::test(start_paused = true)]
async fn the_retry_budget_caps_extra_attempts_at_its_share_of_calls() {
    let (controller, registry, instances) = two_overloaded("budget").await;
    let config = ServiceConfig::default().retry_budget(RetryBudget::default().ratio(0.1).min_per_second(0));
    let client = ServiceClient::with_registry(registry.clone(), config);
    const N: u64 = 500;
    for _ in 0..N {
        let e = client.call_with(&WORK, 1, idempotent()).await.unwrap_err();
        assert_eq!(e.code(), Some(Code::Overloaded), "{e}");
    }
    let attempts = total_calls(&instances);
    // Without the budget every call would be tried on 3 instances' worth of attempts (1,500);
    // with it, one retry per ten calls.
    assert!((N + N / 20..=N + N / 10 + 2).contains(&attempts), "{attempts} attempts for {N} calls");
    let stats = client.stats();
    assert_eq!(stats.failovers, attempts - N, "{stats:?}");
    assert!(stats.retries_refused >= N * 8 / 10, "{stats:?}");
    // A call that is not idempotent is never retried.
    let before = total_calls(&instances);
    for _ in 0..50 {
        client.call(&WORK, 1).await.unwrap_err();
    }
    assert_eq!(total_calls(&instances), before + 50);
    stop(instances, controller).await;
}

#[tokio::test(start_paused = true)]
async fn without_a_budget_an_overloaded_reply_is_not_retried() {
    let (controller, registry, instances) = two_overloaded("no-budget").await;
    let client = ServiceClient::with_registry(registry.clone(), ServiceConfig::default());
    for _ in 0..100 {
        client.call_with(&WORK, 1, idempotent()).await.unwrap_err();
    }
    assert_eq!(total_calls(&instances), 100);
    stop(instances, controller).await;
}

/// The ejection state of the instance at `address`.
fn ejected(client: &ServiceClient, address: &str) -> Option<&'static str> {
    let stats = client.instance_stats(WORK.service());
    stats.iter().find(|s| s.address == address).and_then(|s| s.ejected)
}

#[tokio::test(start_paused = true)]
async fn a_failing_instance_gets_no_calls_from_its_ejection_until_its_probe() {
    let (controller, registry) = controller("outlier").await;
    let good = instance(&registry, Behaviour::Ok).await;
    let bad = instance(&registry, Behaviour::Fail(Code::Internal)).await;
    let outliers = Outliers::default().consecutive_failures(3).latency_factor(0.0);
    let config = ServiceConfig::default().outliers(outliers).quarantine(Duration::from_secs(2));
    let client = ServiceClient::with_registry(registry.clone(), config);
    // Round-robin: every other call reaches the bad instance, until its third failure.
    client.call(&WORK, 1).await.unwrap_or_default(); // resolves the service
    let mut errors = bad.calls.load(Relaxed);
    while ejected(&client, &bad.address).is_none() {
        errors += client.call(&WORK, 1).await.is_err() as u64;
        assert!(errors <= 3, "ejected after 3 failures in a row");
    }
    assert_eq!(ejected(&client, &bad.address), Some("failing"));
    assert_eq!(bad.calls.load(Relaxed), 3);
    // Out of rotation: calls made while it stays out all go to the good instance.
    let mut while_out = 0;
    wait_for(Duration::from_secs(60), "the probe to readmit the instance", async || {
        if ejected(&client, &bad.address).is_none() {
            return true;
        }
        let before = bad.calls.load(Relaxed);
        client.call(&WORK, 1).await.unwrap();
        if ejected(&client, &bad.address).is_some() {
            while_out += 1;
            assert_eq!(bad.calls.load(Relaxed), before, "a call reached the ejected instance");
        }
        false
    })
    .await;
    assert!(while_out >= 20, "only {while_out} calls while it was out");
    assert_eq!(bad.calls.load(Relaxed), 3, "the probe is not a call");
    // Back after the probe (it answers, with errors): calls reach it again, and it is ejected
    // again after three more failures.
    // The machine's clock: these calls wait on no timer, so the paused one would not move.
    let t0 = std::time::Instant::now();
    while bad.calls.load(Relaxed) < 6 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the readmitted instance got no calls");
        let _ = client.call(&WORK, 1).await;
    }
    assert_eq!(bad.calls.load(Relaxed), 6);
    assert_eq!(ejected(&client, &bad.address), Some("failing"));
    assert!(client.stats().outliers_ejected >= 2);
    stop(vec![good, bad], controller).await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_far_slower_than_its_peers_is_ejected() {
    let (controller, registry) = controller("slow-outlier").await;
    let a = instance(&registry, Behaviour::Ok).await;
    let b = instance(&registry, Behaviour::Ok).await;
    let slow = instance(&registry, Behaviour::Slow(Duration::from_millis(100))).await;
    let outliers = Outliers::default()
        .consecutive_failures(0)
        .latency_factor(5.0)
        .min_latency(Duration::from_millis(20))
        .check_every(Duration::from_millis(50));
    let config = ServiceConfig::default().outliers(outliers).quarantine(Duration::from_secs(60));
    let client = ServiceClient::with_registry(registry.clone(), config);
    let t0 = Instant::now();
    while ejected(&client, &slow.address).is_none() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the slow instance was never ejected");
        let _ = futures_util::future::join_all((0..6).map(|_| client.call(&WORK, 1))).await;
    }
    assert_eq!(ejected(&client, &slow.address), Some("slow"));
    let before = slow.calls.load(Relaxed);
    for _ in 0..100 {
        client.call(&WORK, 1).await.unwrap();
    }
    assert_eq!(slow.calls.load(Relaxed), before, "calls reached the ejected instance");
    // Only the outlier: the two fast instances stay in.
    assert_eq!(ejected(&client, &a.address), None);
    assert_eq!(ejected(&client, &b.address), None);
    stop(vec![a, b, slow], controller).await;
}

#[tokio::test(start_paused = true)]
async fn peak_ewma_balancing_prefers_the_faster_instance() {
    let (controller, registry) = controller("ewma").await;
    // On the paused clock an instant answer takes no time at all; the fast instance takes the
    // tenth of a millisecond a real one would.
    let fast = instance(&registry, Behaviour::Slow(Duration::from_micros(100))).await;
    let slow = instance(&registry, Behaviour::Slow(Duration::from_millis(20))).await;
    let config = ServiceConfig::default().balance(Balance::PeakEwma);
    let client = ServiceClient::with_registry(registry.clone(), config);
    const N: usize = 400;
    slow_calls(&client, N, 8, Duration::MAX).await;
    let (f, s) = (fast.calls.load(Relaxed), slow.calls.load(Relaxed));
    assert_eq!(f + s, N as u64);
    // Round-robin would send each half; the balancer sends the slow one a few calls to
    // measure it, then few more.
    assert!(s <= N as u64 / 10, "fast {f}, slow {s}");
    let stats = client.instance_stats(WORK.service());
    let slow_stats = stats.iter().find(|i| i.address == slow.address).unwrap();
    assert!(slow_stats.latency.is_some_and(|l| l >= Duration::from_millis(10)), "{stats:?}");
    stop(vec![fast, slow], controller).await;
}
