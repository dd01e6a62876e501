//! Deploys without a lost call: a request its server never ran (it was going away) fails as
//! `NotRun` and a `ServiceClient` sends it to another instance, idempotent or not; a graceful
//! stop takes the server out of the registry first and serves on through its grace; the admin
//! endpoint's `/healthz` and `/readyz`; a listener whose socket dies ends, once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use volley::bytes::BytesMut;
use volley::discovery::InstanceSpec;
use volley::proto::{Decoder, FrameBuilder, Limits, Message, SERVER_PREAMBLE, decode_frame};
use volley::registry::{LeaseConfig, Registry};
use volley::service_client::{ServiceClient, ServiceConfig};
use volley::{Client, Code, Drain, Error, Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::eventually_for;

const SAY: Method<String, String> = Method::new("deploy", "say");

/// A server that is going away: on every connection it reads requests and, once it has read
/// one, answers none of them but a go-away (`ShuttingDown`), then closes. Counts the requests
/// it read.
async fn leaving_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else { return };
            tokio::spawn(go_away_after_a_request(s, counted.clone()));
        }
    });
    (addr, seen)
}

async fn go_away_after_a_request(mut s: TcpStream, seen: Arc<AtomicUsize>) {
    let limits = Limits::default();
    let (mut dec, mut buf, mut msgs) = (Decoder::new(limits), BytesMut::new(), Vec::new());
    if s.write_all(&SERVER_PREAMBLE).await.is_err() {
        return;
    }
    // The decoder reads the client's preamble first, then frames.
    while !msgs.iter().any(|m| matches!(m, Message::Request { .. })) {
        match s.read_buf(&mut buf).await {
            Ok(n) if n > 0 => {}
            _ => return,
        }
        while let Ok(Some(f)) = dec.next_frame(&mut buf) {
            decode_frame(&f, &limits, &mut msgs).unwrap();
        }
    }
    let requests = msgs.iter().filter(|m| matches!(m, Message::Request { .. })).count();
    seen.fetch_add(requests, Ordering::SeqCst);
    let mut fb = FrameBuilder::new(limits);
    fb.go_away(Code::ShuttingDown, "leaving for a deploy");
    let mut segments = Vec::new();
    fb.take_into(&mut segments);
    let _ = s.write_all(&segments.concat()).await;
    let _ = s.shutdown().await;
}

#[tokio::test]
async fn a_request_unanswered_at_a_going_away_fails_as_never_run() {
    let (addr, seen) = leaving_server().await;
    let client = Client::connect(&addr).await.unwrap();
    let err = client.call(&SAY, "hi".to_string()).await.unwrap_err();
    assert!(matches!(err, Error::NotRun(_)), "{err:?}");
    assert!(err.to_string().contains("ShuttingDown"), "{err}");
    assert!(err.is_transient());
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the request did reach the server");
}

/// An echo server of `SAY` on tcp, registered with `registry` as `deploy`.
async fn echo(registry: &str) -> (Server, volley::Address) {
    let server = Server::builder().handle_fn(&SAY, |s: String| Ok(s.to_uppercase())).build();
    let registry = Registry::connect(registry).await.unwrap();
    let (bound, _) = server.listen_and_register("tcp://127.0.0.1:0", &registry).await.unwrap();
    (server, bound)
}

#[tokio::test]
async fn a_service_client_sends_a_never_run_call_to_another_instance_idempotent_or_not() {
    let controller = volley::controller::Controller::new(Default::default());
    let reg_addr = controller.listen("inproc://deploy-never-run").await.unwrap().to_string();
    let (good, _) = echo(&reg_addr).await;
    let (leaving, seen) = leaving_server().await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    // The leaving instance's lease is kept by a server of its own (a registration lives as long
    // as the server it belongs to).
    let keeper = Server::builder().build();
    let spec = vec![InstanceSpec::new("deploy", leaving.clone())];
    let _going = registry.register(&keeper, spec, LeaseConfig::default()).await.unwrap();

    let config = ServiceConfig::default().balance(volley::balance::Balance::RoundRobin);
    let client = ServiceClient::connect_with(&reg_addr, config).await.unwrap();
    // Calls are not idempotent by default: each one is still sent again, because the leaving
    // instance never ran it. At least 20 calls, and on until one went to the leaving instance:
    // while it is still connecting, calls go only to the instance that is connected.
    let t0 = std::time::Instant::now();
    let mut i = 0;
    while i < 20 || (seen.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(20)) {
        let r = client.call(&SAY, format!("call {i}")).await;
        assert_eq!(r.unwrap(), format!("CALL {i}"));
        i += 1;
    }
    assert!(seen.load(Ordering::SeqCst) >= 1, "some calls went to the leaving instance first");
    let stats = client.stats();
    assert!(stats.failovers >= 1, "{stats:?}");
    // Not idempotent: every one of them went again because it never ran, none as a retry.
    assert_eq!(stats.resent_unrun, stats.failovers, "{stats:?}");
    good.shutdown().await;
    keeper.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test]
async fn a_graceful_stop_deregisters_first_and_serves_through_its_grace() {
    let controller = volley::controller::Controller::new(Default::default());
    let reg_addr = controller.listen("inproc://deploy-graceful").await.unwrap().to_string();
    let server = Server::builder().handle_fn(&SAY, |s: String| Ok(s)).admin("127.0.0.1:0").build();
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let (bound, _) = server.listen_and_register("tcp://127.0.0.1:0", &registry).await.unwrap();
    let admin = server.admin_address().unwrap();
    assert_eq!(registry.resolve("deploy").await.unwrap().instances.len(), 1);
    assert_eq!(get(admin, "/readyz").await.0, 200);
    assert!(server.is_ready());

    // A long grace: the checks below happen inside it, however slow the machine.
    let stopping = {
        let server = server.clone();
        tokio::spawn(
            async move { server.stop_gracefully(Drain::default().grace(Duration::from_secs(30))).await },
        )
    };
    let gone = eventually_for(Duration::from_secs(10), async || {
        registry.resolve("deploy").await.map(|r| r.instances.is_empty()).unwrap_or(false)
    })
    .await;
    assert!(gone, "the instance left the registry");
    assert!(!server.is_ready());
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("stopping"), "{body}");
    assert_eq!(get(admin, "/healthz").await.0, 200, "alive while it drains");
    // Still serving: a caller that has not moved yet is answered.
    let direct = Client::connect(&bound.to_string()).await.unwrap();
    assert_eq!(direct.call(&SAY, "late".to_string()).await.unwrap(), "late");
    assert!(!stopping.is_finished());
    stopping.abort();
    server.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test]
async fn the_admin_endpoint_answers_healthz_and_readyz() {
    let server = Server::builder().handle_fn(&SAY, |s: String| Ok(s)).admin("127.0.0.1:0").build();
    server.listen("tcp://127.0.0.1:0").await.unwrap();
    let admin = server.admin_address().unwrap();
    assert_eq!(get(admin, "/healthz").await, (200, "ok\n".to_string()));
    assert_eq!(get(admin, "/readyz").await, (200, "ready\n".to_string()));
    let (status, body) = get(admin, "/nothing").await;
    assert_eq!(status, 404);
    assert!(body.contains("/healthz") && body.contains("/readyz"), "{body}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_listener_whose_socket_dies_ends_and_the_server_is_not_ready() {
    let controller = volley::controller::Controller::new(Default::default());
    let reg_addr = controller.listen("inproc://deploy-dead-listener").await.unwrap().to_string();
    let (server, bound) = echo(&reg_addr).await;
    let registry = Registry::connect(&reg_addr).await.unwrap();
    assert_eq!(registry.resolve("deploy").await.unwrap().instances.len(), 1);
    let port = bound.to_string().rsplit(':').next().unwrap().parse::<u16>().unwrap();
    // shutdown(2) on a listening socket makes every accept after it fail with EINVAL: the
    // socket is no listener any more, as when it is closed under the server.
    let fd = listening_fd(port).expect("the listening socket's descriptor");
    assert_eq!(unsafe { libc::shutdown(fd, libc::SHUT_RDWR) }, 0);
    let ended = eventually_for(Duration::from_secs(10), async || !server.failed_listeners().is_empty()).await;
    assert!(ended, "the listener ended");
    assert!(!server.is_ready());
    assert!(server.addresses().is_empty(), "{:?}", server.addresses());
    let gone = eventually_for(Duration::from_secs(10), async || {
        registry.resolve("deploy").await.map(|r| r.instances.is_empty()).unwrap_or(false)
    })
    .await;
    assert!(gone, "a server with no listener left the registry");
    server.shutdown().await;
    controller.shutdown().await;
}

/// The descriptor of this process's socket listening on 127.0.0.1:`port`.
fn listening_fd(port: u16) -> Option<i32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
        // State 0A is LISTEN.
        (local_port == port && f.get(3)? == &"0A").then(|| f.get(9).map(|s| s.to_string()))?
    })?;
    let want = format!("socket:[{inode}]");
    std::fs::read_dir("/proc/self/fd").ok()?.flatten().find_map(|e| {
        let link = std::fs::read_link(e.path()).ok()?;
        (link.to_string_lossy() == want).then(|| e.file_name().to_string_lossy().parse().ok())?
    })
}

/// GET `path` from the admin endpoint: the status and the body.
async fn get(admin: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(admin).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, body)
}

#[tokio::test]
async fn volley_health_answers_per_service_and_a_watch_sees_the_drain() {
    use volley::health::{CHECK, HealthRequest, HealthWatch, Serving, WATCH};
    let server = Server::builder().handle_fn(&SAY, |s: String| Ok(s)).build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    assert_eq!(server.services(), ["deploy"], "volley.health is not one the server offers");
    let client = Client::connect(&bound).await.unwrap();
    let check = async |service: &str| client.call(&CHECK, HealthRequest::service(service)).await;
    assert_eq!(check("").await.unwrap().status, Serving::Serving);
    assert_eq!(check("deploy").await.unwrap().status, Serving::Serving);
    let err = check("nothing").await.unwrap_err();
    assert!(matches!(&err, Error::Remote(s) if s.code == Code::UnknownService), "{err:?}");

    server.set_serving("deploy", false, "its database is down");
    let h = check("deploy").await.unwrap();
    assert_eq!((h.status, h.reason.as_str()), (Serving::NotServing, "its database is down"));
    assert_eq!(check("").await.unwrap().status, Serving::Serving, "the server as a whole serves");

    // A watch from the status the caller knows: held until it changes.
    let watch = |last| HealthWatch { service: "deploy".into(), last: Some(last), timeout_ms: 60_000 };
    let held = {
        let client = client.clone();
        let req = watch(Serving::NotServing);
        tokio::spawn(async move { client.call(&WATCH, req).await })
    };
    server.set_serving("deploy", true, "");
    assert_eq!(held.await.unwrap().unwrap().status, Serving::Serving);

    // A drain answers a held watch at once, and the drain does not wait for the watch.
    let held = {
        let client = client.clone();
        let req = watch(Serving::Serving);
        tokio::spawn(async move { client.call(&WATCH, req).await })
    };
    let stopping = {
        let server = server.clone();
        tokio::spawn(
            async move { server.stop_gracefully(Drain::default().grace(Duration::from_secs(30))).await },
        )
    };
    let h = held.await.unwrap().unwrap();
    assert_eq!(h.status, Serving::Draining);
    assert_eq!(check("deploy").await.unwrap().status, Serving::Draining);
    assert_eq!(server.health("").unwrap().status, Serving::Draining);
    stopping.abort();
    assert!(server.shutdown_within(Duration::from_secs(30)).await, "no health watch holds the stop");
}

#[tokio::test]
async fn a_server_whose_lease_is_not_confirmed_is_not_ready_until_it_registers_again() {
    use volley::controller::Controller;
    let first = Controller::new(Default::default());
    let reg_addr = first.listen("inproc://deploy-lease-ready").await.unwrap().to_string();
    let server = Server::builder().handle_fn(&SAY, |s: String| Ok(s)).admin("127.0.0.1:0").build();
    server.listen("tcp://127.0.0.1:0").await.unwrap();
    let registry = Registry::connect(&reg_addr).await.unwrap();
    let spec = vec![InstanceSpec::new("deploy", server.addresses()[0].to_string())];
    let lease = LeaseConfig::default().ttl(Duration::from_millis(400));
    let registration = registry.register(&server, spec, lease).await.unwrap();
    let admin = server.admin_address().unwrap();
    assert!(server.is_ready());

    // The controller goes away: once the lease's time has passed unconfirmed, callers
    // resolving the service cannot find this server, so it is not ready.
    first.shutdown().await;
    let unready = eventually_for(Duration::from_secs(20), async || !server.is_ready()).await;
    assert!(unready, "not ready once its lease is not confirmed");
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("lease"), "{body}");
    assert_eq!(server.health("deploy").unwrap().status, volley::health::Serving::NotServing);
    assert_eq!(get(admin, "/healthz").await.0, 200, "alive all along");

    // A controller again at the same address: the instances are registered again.
    let second = Controller::new(Default::default());
    second.listen("inproc://deploy-lease-ready").await.unwrap();
    let ready = eventually_for(Duration::from_secs(20), async || server.is_ready()).await;
    assert!(ready, "ready again: {:?}", server.not_ready_because());
    assert!(registration.registrations() >= 2);
    server.shutdown().await;
    second.shutdown().await;
}

/// A connection that fails while requests are still queued in the client behind a write that
/// cannot finish: those were never written, so they fail as `NotRun` (a `ServiceClient` sends
/// them elsewhere, idempotent or not). The bundle the write was working on may have reached the
/// server: its calls fail as connection errors.
#[tokio::test]
async fn calls_never_written_before_their_connection_failed_fail_as_never_run() {
    const BIG: Method<volley::bytes::Bytes, volley::bytes::Bytes> = Method::new("deploy", "big");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let (close, closed) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(&SERVER_PREAMBLE).await.unwrap();
        // It never reads; closed with unread bytes, the kernel resets the connection.
        let _ = closed.await;
        drop(s);
    });
    let client = Client::connect(&addr).await.unwrap();
    let wave = |n: usize| -> Vec<_> {
        (0..n)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.call(&BIG, vec![7u8; 64 << 10].into()).await })
            })
            .collect()
    };
    // 300 × 64 KiB: more than the kernel's socket buffers hold, so the write blocks.
    let first = wave(300);
    let writing =
        eventually_for(Duration::from_secs(30), async || client.counters().bytes_sent >= 1 << 20).await;
    assert!(writing, "the client started writing");
    // One runtime thread: after these turns every call has queued its request, and the writer
    // is blocked on the full socket. The second wave queues behind it.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let second = wave(100);
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    close.send(()).unwrap();
    let mut outcomes = std::collections::BTreeMap::<&str, usize>::new();
    for call in first {
        match call.await.unwrap() {
            Err(Error::NotRun(_)) => *outcomes.entry("first: not run").or_default() += 1,
            Err(Error::Connection(_)) => *outcomes.entry("first: may have run").or_default() += 1,
            other => panic!("{other:?}"),
        }
    }
    for call in second {
        match call.await.unwrap() {
            Err(Error::NotRun(why)) => {
                assert!(why.contains("never sent"), "{why}");
                *outcomes.entry("second: not run").or_default() += 1;
            }
            other => panic!("a call queued behind the blocked write: {other:?} ({outcomes:?})"),
        }
    }
    assert_eq!(outcomes.values().sum::<usize>(), 400, "every call ended once: {outcomes:?}");
}
