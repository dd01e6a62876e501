//! The controller under floods: held watches bounded (a flood of them never makes another
//! caller's call `Overloaded` nor lets a live lease lapse), registrations bounded in size (so
//! `resolve` and `list` always fit in a frame), services with no instance left forgotten, and
//! relays to the registry service itself refused. Each attack has a canary beside it.

use std::collections::BTreeMap;
use std::time::Duration;

use volley::controller::{Controller, ControllerConfig, StoreLimits};
use volley::discovery::InstanceSpec;
use volley::discovery::wire::{
    LIST, REGISTER, RELAY, RESOLVE, RegisterRequest, RelayRequest, SERVICE, Target, WATCH, WatchRequest,
};
use volley::registry::{LeaseConfig, Registry};
use volley::{Client, Code, Error, Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::wait_for;

const PING: Method<u64, u64> = Method::new("bounds-test", "ping");

fn unique(tag: &str) -> String {
    format!("inproc://bounds-{tag}-{}", std::process::id())
}

fn code(e: &Error) -> Option<Code> {
    e.code()
}

fn register_req(service: &str, address: &str, ttl_ms: u64) -> RegisterRequest {
    RegisterRequest {
        lease: 0,
        ttl_ms,
        instances: vec![InstanceSpec::new(service, address)],
        credential: String::new(),
    }
}

/// The flood was 60,000 held watches over 4 connections against the default bound of
/// 50,000 queued requests. Scaled down by 25: 6,000 watches over 4 connections against a
/// bound of 2,000 queued requests for the other calls (with at most 3,000 watches held, 1,024
/// per connection). Beside it: a canary resolving on its own connection, and an instance whose
/// 3 s lease is renewed every second. Before the bounds, the watches filled the queue bound
/// and both got `Overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_flood_leaves_other_callers_and_live_leases_alone() {
    const FLOOD: usize = 6_000;
    const CONNECTIONS: usize = 4;
    let config = ControllerConfig::default()
        .expiry_tick(Duration::from_millis(20))
        .settle(Duration::ZERO)
        .max_queued(2_000)
        .max_watches(3_000);
    let controller = Controller::new(config);
    let addr = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();

    // A live instance, renewing a short lease.
    let registry = Registry::connect(&addr).await.unwrap();
    let instance = Server::builder().handle(&PING, |x: u64| async move { Ok(x) }).build();
    let at = instance.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let mut lease = LeaseConfig::default();
    lease.ttl = Duration::from_secs(3);
    let _registration =
        registry.register(&instance, vec![InstanceSpec::new("live", &at)], lease).await.unwrap();

    // The flood: watches of a service that never changes, each asking to be held 60 s.
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let c = Client::connect(&addr).await.unwrap();
        for k in 0..FLOOD / CONNECTIONS {
            let c = c.clone();
            let w = WatchRequest {
                service: format!("quiet-{}", k % 10),
                epoch: controller.epoch(),
                from_revision: u64::MAX / 2,
                timeout_ms: 60_000,
                client_id: 0,
            };
            flood.spawn(async move { c.call(&WATCH, w).await });
        }
    }
    // Every watch beyond the bounds is answered at once, with the current state.
    let mut answered = 0;
    while answered < FLOOD - 3_000 {
        let r = tokio::time::timeout(Duration::from_secs(60), flood.join_next())
            .await
            .expect("the watches beyond the bounds are answered at once")
            .unwrap()
            .unwrap();
        let r = r.unwrap_or_else(|e| panic!("a watch beyond the bound must be answered, not refused: {e}"));
        assert!(!r.known, "the quiet services are unknown");
        answered += 1;
    }
    let s = controller.stats();
    assert_eq!(s.watches_held, 3_000, "the bound in all is held");
    assert_eq!(s.watches_not_held, (FLOOD - 3_000) as u64);

    // The canary: resolves on its own connection meanwhile, and the live lease renewed.
    let canary = Client::connect(&addr).await.unwrap();
    let renewals_before = controller.stats().lease_renewals;
    let (mut overloaded, mut resolves) = (0, 0);
    wait_for(Duration::from_secs(30), "100 resolves and two renewals during the flood", async || {
        match canary.call(&RESOLVE, "live".to_string()).await {
            Ok(r) => assert_eq!(r.instances.len(), 1, "the live instance stays listed"),
            Err(e) if code(&e) == Some(Code::Overloaded) => overloaded += 1,
            Err(e) => panic!("the canary's resolve failed: {e}"),
        }
        resolves += 1;
        resolves >= 100 && controller.stats().lease_renewals >= renewals_before + 2
    })
    .await;
    assert_eq!(overloaded, 0, "no Overloaded for other callers");
    let s = controller.stats();
    assert_eq!(s.expired_instances, 0, "no live lease lapsed");
    assert_eq!(s.watches_held, 3_000, "the flood is still held");
    flood.abort_all();
    controller.shutdown().await;
}

/// A watch held per connection: the fifth watch of a connection with a bound of four is
/// answered at once, while another connection still gets its watch held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_bounded_per_connection() {
    let controller =
        Controller::new(ControllerConfig::default().settle(Duration::ZERO).max_watches_per_connection(4));
    let addr = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let w = || WatchRequest {
        service: "quiet".into(),
        epoch: controller.epoch(),
        from_revision: 0,
        timeout_ms: 60_000,
        client_id: 0,
    };
    let greedy = Client::connect(&addr).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        let (c, w) = (greedy.clone(), w());
        held.push(tokio::spawn(async move { c.call(&WATCH, w).await }));
    }
    wait_for(Duration::from_secs(30), "four held watches", async || controller.stats().watches_held == 4)
        .await;
    let fifth = tokio::time::timeout(Duration::from_secs(30), greedy.call(&WATCH, w())).await;
    assert!(fifth.expect("answered at once").is_ok());
    assert_eq!(controller.stats().watches_not_held, 1);
    // Another connection's watch is held (answered only by the change below).
    let other = Client::connect(&addr).await.unwrap();
    let (c, req) = (other.clone(), w());
    let held_other = tokio::spawn(async move { c.call(&WATCH, req).await });
    wait_for(Duration::from_secs(30), "the other connection's watch held", async || {
        controller.stats().watches_held == 5
    })
    .await;
    other.call(&REGISTER, register_req("quiet", "tcp://127.0.0.1:9", 60_000)).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(30), held_other).await.unwrap().unwrap().unwrap();
    assert_eq!(r.instances.len(), 1, "a held watch sees the change");
    for h in held {
        assert_eq!(h.await.unwrap().unwrap().instances.len(), 1);
    }
    wait_for(Duration::from_secs(30), "the slots given back", async || controller.stats().watches_held == 0)
        .await;
    controller.shutdown().await;
}

/// Names are 1–255 bytes; an instance's registration at most `max_instance_bytes` (64 KiB);
/// a lease at most 256 instances; a service's instances at most `max_service_bytes`. Each
/// refusal names its bound, and `resolve` and `list` keep working for everyone.
#[tokio::test]
async fn registrations_are_bounded_in_size() {
    let addr = unique("sizes");
    let limits = StoreLimits::default();
    let mut limits_small = limits;
    limits_small.max_service_bytes = 300 << 10;
    let controller =
        Controller::new(ControllerConfig::default().settle(Duration::ZERO).store_limits(limits_small));
    controller.listen(&addr).await.unwrap();
    let c = Client::connect(&addr).await.unwrap();

    c.call(&REGISTER, register_req(&"n".repeat(255), "tcp://h:1", 60_000))
        .await
        .expect("255 bytes is allowed");
    let e = c.call(&REGISTER, register_req(&"n".repeat(256), "tcp://h:1", 60_000)).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::BadRequest), "{e}");
    assert!(e.to_string().contains("256 bytes (at most 255)"), "{e}");

    // 9 MiB of metadata: refused, naming the bound.
    let mut big = register_req("echo", "tcp://h:2", 60_000);
    big.instances[0].metadata = BTreeMap::from([("blob".to_string(), "x".repeat(9 << 20))]);
    let e = c.call(&REGISTER, big).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::TooLarge), "{e}");
    assert!(e.to_string().contains("at most 65536 bytes per instance"), "{e}");

    // 257 instances under one lease: refused.
    let mut many = register_req("many", "tcp://h:0", 60_000);
    many.instances = (0..257).map(|k| InstanceSpec::new("many", format!("tcp://h:{k}"))).collect();
    let e = c.call(&REGISTER, many.clone()).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::TooLarge), "{e}");
    assert!(e.to_string().contains("at most 256 per lease"), "{e}");
    many.instances.pop();
    let ok = c.call(&REGISTER, many).await.expect("256 is allowed");
    // Adding to the full lease is refused too.
    let mut more = register_req("many", "tcp://h:999", 60_000);
    more.lease = ok.lease;
    let e = c.call(&REGISTER, more).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::TooLarge), "{e}");

    // Registrations of 60 KiB each under one service, up to its 300 KiB: the fifth passes it.
    let spec = |k: usize| {
        let mut r = register_req("echo", &format!("tcp://h:{}", 100 + k), 60_000);
        r.instances[0].metadata = BTreeMap::from([("blob".to_string(), "y".repeat(60 << 10))]);
        r
    };
    for k in 0..4 {
        c.call(&REGISTER, spec(k)).await.unwrap_or_else(|e| panic!("registration {k}: {e}"));
    }
    let e = c.call(&REGISTER, spec(4)).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::TooLarge), "{e}");
    assert!(e.to_string().contains("at most 307200 per service"), "{e}");
    // Registering one of them again (same address) replaces it: no growth, allowed.
    c.call(&REGISTER, spec(0)).await.expect("a replacement takes no more room");

    // The canary: resolve and list answer.
    let r = c.call(&RESOLVE, "echo".to_string()).await.unwrap();
    assert_eq!(r.instances.len(), 4);
    let l = c.call(&LIST, ()).await.unwrap();
    assert_eq!(l.omitted, 0);
    assert_eq!(l.services.len(), 3, "the 255-byte name, many, echo");
    controller.shutdown().await;
}

/// `list` stops at `max_list_bytes` and says how many services it left out.
#[tokio::test]
async fn a_list_larger_than_its_bound_leaves_services_out_and_says_so() {
    let addr = unique("list");
    let controller =
        Controller::new(ControllerConfig::default().settle(Duration::ZERO).max_list_bytes(4_000));
    controller.listen(&addr).await.unwrap();
    let c = Client::connect(&addr).await.unwrap();
    for k in 0..100 {
        c.call(&REGISTER, register_req(&format!("svc-{k:03}"), "tcp://h:1", 60_000)).await.unwrap();
    }
    let l = c.call(&LIST, ()).await.unwrap();
    assert!(!l.services.is_empty() && l.services.len() < 100, "{} listed", l.services.len());
    assert_eq!(l.services.len() as u64 + l.omitted, 100);
    let bytes = serde_json::to_vec(&l.services).unwrap().len();
    assert!(bytes <= 4_000, "{bytes} bytes listed");
    assert_eq!(l.services[0].name, "svc-000", "in name order, the last left out");
    controller.shutdown().await;
}

/// Services whose instances all lapsed are forgotten after `forget_after`: `list` stops naming
/// them, `resolve` says they are unknown, and a live service beside them stays.
#[tokio::test(start_paused = true)]
async fn services_with_no_instance_left_are_forgotten() {
    const NAMES: usize = 2_000;
    let addr = unique("forget");
    let config = ControllerConfig::default()
        .settle(Duration::ZERO)
        .expiry_tick(Duration::from_millis(100))
        .forget_after(Duration::from_secs(60));
    let controller = Controller::new(config);
    controller.listen(&addr).await.unwrap();
    let c = Client::connect(&addr).await.unwrap();
    let live = c.call(&REGISTER, register_req("live", "tcp://h:1", 10_000)).await.unwrap();
    for k in 0..NAMES {
        c.call(&REGISTER, register_req(&format!("short-{k}"), "tcp://h:1", 50)).await.unwrap();
    }
    let renew = async |c: &Client| {
        let r = volley::discovery::wire::LeaseRequest { lease: live.lease, credential: String::new() };
        assert!(c.call(&volley::discovery::wire::RENEW, r).await.unwrap().known);
    };
    // Lapsed, but not yet forgotten: still known, with no instance. (Paused clock: simulated
    // time passes.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(controller.stats().expired_instances, NAMES as u64);
    let l = c.call(&LIST, ()).await.unwrap();
    assert_eq!(l.services.len(), NAMES + 1);
    assert!(c.call(&RESOLVE, "short-7".to_string()).await.unwrap().known);
    // Past the linger: forgotten.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(8)).await;
        renew(&c).await;
    }
    let l = c.call(&LIST, ()).await.unwrap();
    assert_eq!(l.services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["live"]);
    assert!(!c.call(&RESOLVE, "short-7".to_string()).await.unwrap().known);
    assert_eq!(controller.stats().services_forgotten, NAMES as u64);
    assert_eq!(controller.store().list().await.unwrap().len(), 1, "what /metrics lists too");
    // A name registered again is known again, at a newer revision.
    let again = c.call(&REGISTER, register_req("short-7", "tcp://h:1", 10_000)).await.unwrap();
    let r = c.call(&RESOLVE, "short-7".to_string()).await.unwrap();
    assert!(r.known && r.instances.len() == 1 && r.instances[0].lease == again.lease);
    controller.shutdown().await;
}

/// A relay to the registry service (the controller's own relay, or a controller registered as
/// an instance) is refused at once: nesting one relay in another held a call per level.
#[tokio::test]
async fn relays_to_the_registry_service_are_refused() {
    let addr = unique("selfrelay");
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    controller.listen(&addr).await.unwrap();
    let c = Client::connect(&addr).await.unwrap();
    // Even with the registry service registered at the controller's own address.
    c.call(&REGISTER, register_req(SERVICE, &addr, 60_000)).await.unwrap();
    let inner = RelayRequest {
        service: SERVICE.into(),
        method: "resolve".into(),
        idempotent: true,
        target: Target::Any,
        timeout_ms: 0,
        payload: volley::bytes::Bytes::from_static(b"\"x\""),
    };
    let e = tokio::time::timeout(Duration::from_secs(30), c.call(&RELAY, inner)).await.unwrap().unwrap_err();
    assert_eq!(code(&e), Some(Code::BadRequest), "{e}");
    assert!(e.to_string().contains("is not relayed"), "{e}");
    assert_eq!(controller.stats().relayed_calls, 0, "nothing was forwarded");
    // The canary: a relay to an ordinary service goes through.
    let instance = Server::builder().handle(&PING, |x: u64| async move { Ok(x + 1) }).build();
    let at = unique("selfrelay-ping");
    instance.listen(&at).await.unwrap();
    c.call(&REGISTER, register_req("bounds-test", &at, 60_000)).await.unwrap();
    let mut payload = volley::bytes::BytesMut::new();
    volley::Wire::encode(&41u64, &mut payload).unwrap();
    let ok = RelayRequest {
        service: "bounds-test".into(),
        method: "ping".into(),
        idempotent: true,
        target: Target::Any,
        timeout_ms: 0,
        payload: payload.freeze(),
    };
    match c.call(&RELAY, ok).await.unwrap() {
        volley::discovery::wire::RelayReply::Ok(p) => {
            assert_eq!(<u64 as volley::Wire>::decode(p).unwrap(), 42)
        }
        other => panic!("{other:?}"),
    }
    controller.shutdown().await;
}

/// Relayed calls in flight are bounded: beyond `max_relays`, one is refused `Overloaded` at
/// once, and others go through again when the held ones end.
#[tokio::test]
async fn relays_in_flight_are_bounded() {
    const SLOW: Method<u64, u64> = Method::new("bounds-slow", "slow");
    let addr = unique("relaybound");
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO).max_relays(2));
    controller.listen(&addr).await.unwrap();
    let c = Client::connect(&addr).await.unwrap();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let instance = Server::builder()
        .handle(&SLOW, move |x: u64| {
            let g = g.clone();
            async move {
                let _ = g.acquire().await.unwrap();
                Ok(x)
            }
        })
        .build();
    let at = unique("relaybound-slow");
    instance.listen(&at).await.unwrap();
    c.call(&REGISTER, register_req("bounds-slow", &at, 60_000)).await.unwrap();
    let req = || {
        let mut payload = volley::bytes::BytesMut::new();
        volley::Wire::encode(&7u64, &mut payload).unwrap();
        RelayRequest {
            service: "bounds-slow".into(),
            method: "slow".into(),
            idempotent: true,
            target: Target::Any,
            timeout_ms: 60_000,
            payload: payload.freeze(),
        }
    };
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (c, r) = (c.clone(), req());
            tokio::spawn(async move { c.call(&RELAY, r).await })
        })
        .collect();
    wait_for(Duration::from_secs(30), "two relays forwarded", async || controller.stats().relayed_calls == 2)
        .await;
    let e = c.call(&RELAY, req()).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::Overloaded), "{e}");
    assert!(e.to_string().contains("bound of 2"), "{e}");
    assert_eq!(controller.stats().relays_refused, 1);
    // The canary: a resolve is served meanwhile.
    assert_eq!(c.call(&RESOLVE, "bounds-slow".to_string()).await.unwrap().instances.len(), 1);
    gate.add_permits(2);
    for h in held {
        assert!(matches!(h.await.unwrap().unwrap(), volley::discovery::wire::RelayReply::Ok(_)));
    }
    controller.shutdown().await;
}

/// A client whose watch the controller would not hold (its bound is 0 here) polls again after
/// a pause, not at once: over 3 s with a 2 s watch timeout it asks a handful of times (the
/// pause is 1 s), where asking again at once would make thousands of calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_watch_is_not_held_pauses_before_the_next() {
    use volley::ServiceClient;
    use volley::service_client::{Mode, ServiceConfig};
    let addr = unique("pause");
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO).max_watches(0));
    controller.listen(&addr).await.unwrap();
    let instance = Server::builder().handle(&PING, |x: u64| async move { Ok(x) }).build();
    let at = unique("pause-ping");
    instance.listen(&at).await.unwrap();
    let c = Client::connect(&addr).await.unwrap();
    c.call(&REGISTER, register_req("bounds-test", &at, 60_000)).await.unwrap();
    let config = ServiceConfig::default().mode(Mode::Direct).watch_timeout(Duration::from_secs(2));
    let client = ServiceClient::connect_with(&addr, config).await.unwrap();
    assert_eq!(client.call(&PING, 5).await.unwrap(), 5);
    let before = controller.stats().watches;
    // Real time: on a paused clock a client that asked again at once would keep the runtime
    // busy, so time would never pass and the test would hang instead of failing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = controller.stats().watches - before;
    assert!((1..=10).contains(&asked), "{asked} watches in 3 s");
    assert_eq!(controller.stats().watches_held, 0);
    assert_eq!(client.call(&PING, 6).await.unwrap(), 6, "calls go on");
    controller.shutdown().await;
}

/// Under the adaptive concurrency limit (256 at first), 600 held watches are outside it: all
/// are held, and a canary's resolves and a live lease's renewals are never refused. Counted
/// under the limit, the watches beyond 256 and every other call were answered `Overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_watches_are_outside_the_adaptive_limit() {
    const HELD: usize = 600;
    let config = ControllerConfig::default()
        .expiry_tick(Duration::from_millis(20))
        .settle(Duration::ZERO)
        .concurrency_limit(Some(volley::ConcurrencyLimit::default()));
    let controller = Controller::new(config);
    let addr = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let registry = Registry::connect(&addr).await.unwrap();
    let instance = Server::builder().handle(&PING, |x: u64| async move { Ok(x) }).build();
    let at = instance.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let _registration = registry
        .register(&instance, vec![InstanceSpec::new("live", &at)], LeaseConfig::default())
        .await
        .unwrap();

    let flooder = Client::connect(&addr).await.unwrap();
    let mut flood = tokio::task::JoinSet::new();
    for k in 0..HELD {
        let (c, epoch) = (flooder.clone(), controller.epoch());
        let w = WatchRequest {
            service: format!("quiet-{}", k % 10),
            epoch,
            from_revision: u64::MAX / 2,
            timeout_ms: 60_000,
            client_id: 0,
        };
        flood.spawn(async move { c.call(&WATCH, w).await });
    }
    wait_for(Duration::from_secs(30), "every watch to be held", async || {
        if let Some(Ok(r)) = flood.try_join_next() {
            panic!("a watch was answered instead of held: {r:?}");
        }
        controller.stats().watches_held == HELD as u64
    })
    .await;
    let canary = Client::connect(&addr).await.unwrap();
    for i in 0..100 {
        let r = canary.call(&RESOLVE, "live".to_string()).await;
        assert_eq!(r.unwrap_or_else(|e| panic!("resolve {i}: {e}")).instances.len(), 1);
    }
    flood.abort_all();
    instance.shutdown().await;
    controller.shutdown().await;
}
