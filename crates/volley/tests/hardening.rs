//! Peers that misbehave or vanish, and peers that are not allowed in: read timeouts on stalled
//! half-frames, the connection limit, keepalive, the drain deadline of a shutdown, and tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volley::proto::{Decoder, Limits, Message, PREAMBLE, decode_frame};
use volley::{CallOptions, Client, ClientConfig, Code, Error, Keepalive, Method, Server};

#[path = "support/wait.rs"]
mod wait;
use wait::{wait_for, wait_until};

const ECHO: Method<String, String> = Method::new("hardening", "echo");
const SLEEP: Method<u64, u64> = Method::new("hardening", "sleep");

fn server() -> volley::ServerBuilder {
    server_counting(Default::default())
}

/// [`server`], whose `SLEEP` handlers count themselves into `entered` as they start.
fn server_counting(entered: Arc<AtomicUsize>) -> volley::ServerBuilder {
    Server::builder().handle_fn(&ECHO, Ok).handle(&SLEEP, move |ms: u64| {
        entered.fetch_add(1, Ordering::SeqCst);
        async move {
            // Work that outlasts a drain deadline, on the machine's clock: the clients here
            // are on real sockets, whose deadlines read the machine's coarse clock.
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms)
        }
    })
}

fn tcp(addr: &volley::Address) -> String {
    addr.to_string().trim_start_matches("tcp://").to_string()
}

/// Reads what the server sends until it closes (or `within` passes) and returns the messages.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (Vec<Message>, bool) {
    let mut bytes = Vec::new();
    let closed = tokio::time::timeout(within, s.read_to_end(&mut bytes)).await.is_ok();
    let limits = Limits::default();
    let mut d = Decoder::new(limits);
    let mut buf = volley::bytes::BytesMut::from(&bytes[..]);
    let mut out = Vec::new();
    while let Ok(Some(body)) = d.next_frame(&mut buf) {
        decode_frame(&body, &limits, &mut out).unwrap();
    }
    (out, closed)
}

fn go_away_code(msgs: &[Message]) -> Option<Code> {
    msgs.iter().find_map(|m| match m {
        Message::GoAway { code, .. } => Some(*code),
        _ => None,
    })
}

/// A peer that sends half a frame and stalls is disconnected (with a go-away) after the read
/// timeout, while another client keeps being served the whole time; a connection idle
/// between frames outlives the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_half_frame_peer_is_disconnected_while_others_are_served() {
    let timeout = Duration::from_millis(300);
    let s = server().read_timeout(Some(timeout)).keepalive(None).build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    let good = Client::connect(&addr.to_string()).await.unwrap();
    let idle = Client::connect(&addr.to_string()).await.unwrap();
    assert_eq!(idle.call(&ECHO, "first".into()).await.unwrap(), "first");

    let mut stalled = TcpStream::connect(tcp(&addr)).await.unwrap();
    stalled.write_all(&PREAMBLE).await.unwrap();
    // A frame announcing 100 bytes, of which 10 arrive.
    stalled.write_all(&100u32.to_le_bytes()).await.unwrap();
    stalled.write_all(&[0x01; 10]).await.unwrap();
    let t0 = Instant::now();
    let reader = tokio::spawn(async move { read_until_closed(&mut stalled, Duration::from_secs(20)).await });

    // Meanwhile the other client is served, call after call (each a round trip on the socket).
    let mut served = 0;
    while !reader.is_finished() {
        let r = good.call(&ECHO, format!("call {served}")).await.unwrap();
        assert_eq!(r, format!("call {served}"));
        served += 1;
    }
    let (msgs, closed) = reader.await.unwrap();
    let took = t0.elapsed();
    assert!(closed, "the stalled peer was not disconnected");
    assert!(took >= timeout, "disconnected after {took:?}, before the timeout of {timeout:?}");
    assert!(took < timeout * 10 + Duration::from_secs(2), "disconnected only after {took:?}");
    assert_eq!(go_away_code(&msgs), Some(Code::Protocol), "{msgs:?}");
    assert!(served > 0);
    // The idle client sat between frames for longer than the timeout: still connected.
    assert!(idle.is_connected());
    assert_eq!(idle.call(&ECHO, "still here".into()).await.unwrap(), "still here");
    s.shutdown().await;
}

/// Connections over `max_connections` get a go-away `Overloaded` and are closed; the ones
/// within it are served, and a slot freed by a closed connection is usable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_get_overloaded_go_away() {
    let s = server().max_connections(Some(2)).build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    let a = Client::connect(&addr.to_string()).await.unwrap();
    let b = Client::connect(&addr.to_string()).await.unwrap();
    assert_eq!(a.call(&ECHO, "a".into()).await.unwrap(), "a");
    assert_eq!(b.call(&ECHO, "b".into()).await.unwrap(), "b");

    let mut third = TcpStream::connect(tcp(&addr)).await.unwrap();
    third.write_all(&PREAMBLE).await.unwrap();
    let (msgs, closed) = read_until_closed(&mut third, Duration::from_secs(20)).await;
    assert!(closed);
    assert_eq!(go_away_code(&msgs), Some(Code::Overloaded), "{msgs:?}");

    // A client over the limit sees the refusal as an error, not a hang.
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let r = c.call_with(&ECHO, "c".into(), CallOptions::default().timeout(Duration::from_secs(20))).await;
    // Never run if the refusal came before the request was written, else a connection error.
    assert!(matches!(&r, Err(Error::Connection(m) | Error::NotRun(m)) if m.contains("Overloaded")), "{r:?}");

    drop(a);
    // The slot frees once the server notices the close.
    wait_for(Duration::from_secs(20), "a slot to be freed", async || {
        let d = Client::connect(&addr.to_string()).await.unwrap();
        match d.call(&ECHO, "d".into()).await {
            Ok(r) => {
                assert_eq!(r, "d");
                true
            }
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(b.call(&ECHO, "b".into()).await.unwrap(), "b");
    s.shutdown().await;
}

/// A server that accepts and then never answers anything (a dead peer behind a live socket):
/// the client's keepalive declares it dead and the pending call fails with a connection
/// error, once, long before the call's own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_fails_pending_calls_on_a_silent_server() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let black_hole = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(&PREAMBLE).await.unwrap();
        let mut sink = vec![0u8; 4096];
        while s.read(&mut sink).await.unwrap_or(0) > 0 {}
    });
    let k = Keepalive::new(Duration::from_millis(100), Duration::from_millis(200));
    let config = ClientConfig::default().keepalive(Some(k));
    // Before connecting: the keepalive's clock starts with the connection.
    let t0 = Instant::now();
    let c = Client::connect_with(&format!("tcp://{addr}"), config).await.unwrap();
    let r =
        c.call_with(&ECHO, "anyone?".into(), CallOptions::default().timeout(Duration::from_secs(60))).await;
    let took = t0.elapsed();
    assert!(matches!(&r, Err(Error::Connection(m)) if m.contains("keepalive")), "{r:?}");
    assert!(took >= Duration::from_millis(300), "declared dead after {took:?}");
    assert!(took < Duration::from_secs(30), "declared dead only after {took:?}");
    assert_eq!(c.pending_calls(), 0);
    assert!(!c.is_connected());
    black_hole.abort();
}

/// A server whose kernel accepts but which sends nothing, not even its preamble (a frozen
/// process): the connection fails after the connect timeout, and with it both a call that
/// waits for the preamble (it has a time budget to send) and one sent at once (it has none),
/// each once, long before their own deadlines (the first as never run, the second with a
/// connection error). No keepalive is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_sends_no_preamble_fails_the_connection_after_the_connect_timeout() {
    for send_deadlines in [true, false] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut sink = vec![0u8; 4096];
            while s.read(&mut sink).await.unwrap_or(0) > 0 {}
        });
        let config = ClientConfig::default()
            .connect_timeout(Duration::from_millis(300))
            .send_deadlines(send_deadlines);
        // Before connecting: the wait for the preamble starts with the connection.
        let t0 = Instant::now();
        let c = Client::connect_with(&format!("tcp://{addr}"), config).await.unwrap();
        let opts = CallOptions::default().timeout(Duration::from_secs(60));
        let r = c.call_with(&ECHO, "anyone?".into(), opts).await;
        let took = t0.elapsed();
        // A call with a budget to send waits for the preamble, so it was never written: it
        // never ran. One sent at once may have reached the server.
        let ended = match &r {
            Err(Error::NotRun(m)) if send_deadlines => m.contains("no preamble") && m.contains("never sent"),
            Err(Error::Connection(m)) if !send_deadlines => m.contains("no preamble"),
            _ => false,
        };
        assert!(ended, "{send_deadlines}: {r:?}");
        assert!(took >= Duration::from_millis(300), "failed after {took:?}");
        assert!(took < Duration::from_secs(30), "failed only after {took:?}");
        assert_eq!(c.pending_calls(), 0);
        assert!(!c.is_connected());
        frozen.abort();
    }
}

/// The server side: a peer that sends its preamble and then nothing (not even a pong) is
/// pinged, then closed; a volley client on the same server answers pings and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_keepalive_closes_a_peer_that_does_not_answer_pings() {
    let k = Keepalive::new(Duration::from_millis(100), Duration::from_millis(200));
    let s = server().keepalive(Some(k)).build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    let live =
        Client::connect_with(&addr.to_string(), ClientConfig::default().keepalive(None)).await.unwrap();
    let mut mute = TcpStream::connect(tcp(&addr)).await.unwrap();
    mute.write_all(&PREAMBLE).await.unwrap();
    let t0 = Instant::now();
    let (msgs, closed) = read_until_closed(&mut mute, Duration::from_secs(20)).await;
    assert!(closed, "the mute peer was not closed");
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert!(msgs.iter().any(|m| matches!(m, Message::Ping { .. })), "no ping before closing: {msgs:?}");
    assert!(live.is_connected(), "the client answering pings was closed");
    assert_eq!(live.call(&ECHO, "x".into()).await.unwrap(), "x");
    s.shutdown().await;
}

/// Shutdown with a drain deadline: the request that finishes within it is answered; the one
/// that would run past it is answered at the deadline with its own `ShuttingDown` error reply
/// (not just a lost connection); shutdown returns soon after the deadline and reports that it
/// did not drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_deadline_finishes_quick_work_and_drops_the_rest() {
    let entered = Arc::new(AtomicUsize::new(0));
    let s = server_counting(entered.clone()).build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    // Two connections: requests arriving together for one method share a handler turn.
    let c1 = Client::connect(&addr.to_string()).await.unwrap();
    let c2 = Client::connect(&addr.to_string()).await.unwrap();
    let c3 = Client::connect(&addr.to_string()).await.unwrap();
    let opts = CallOptions::default().timeout(Duration::from_secs(120));
    let quick = tokio::spawn(async move { c1.call_with(&SLEEP, 200, opts).await });
    let slow = tokio::spawn(async move { c2.call_with(&SLEEP, 60_000, opts).await });
    let batch_opts = volley::BatchOptions::default().timeout(Duration::from_secs(120));
    let slow_batch =
        tokio::spawn(async move { c3.call_batch_with(&SLEEP, [60_000, 60_000, 60_000], batch_opts).await });
    // All three requests (five items) are in handlers before shutdown starts.
    wait_until(Duration::from_secs(20), "the requests to reach their handlers", || {
        entered.load(Ordering::SeqCst) == 5
    })
    .await;
    let deadline = Duration::from_secs(1);
    let t0 = Instant::now();
    let drained = s.shutdown_with_deadline(deadline).await;
    let took = t0.elapsed();
    assert!(!drained, "a 60 s request cannot drain within 1 s");
    assert!(took >= deadline, "returned after {took:?}");
    assert!(took < Duration::from_secs(15), "returned only after {took:?}");
    assert_eq!(quick.await.unwrap(), Ok(200));
    let r = slow.await.unwrap();
    assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::ShuttingDown), "{r:?}");
    // A batch request is answered as one: every item gets the error.
    let items = slow_batch.await.unwrap();
    assert_eq!(items.len(), 3);
    for r in items {
        assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::ShuttingDown), "{r:?}");
    }
}

/// Everything drains in time: `shutdown_with_deadline` says so and every call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_deadline_reports_a_complete_drain() {
    let s = server().build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let c1 = c.clone();
    let call = tokio::spawn(async move { c1.call(&SLEEP, 100).await });
    wait_until(Duration::from_secs(20), "the request to arrive", || s.counters().messages_received >= 1)
        .await;
    assert!(s.shutdown_with_deadline(Duration::from_secs(30)).await);
    assert_eq!(call.await.unwrap(), Ok(100));
}

fn with_token(token: Option<&str>) -> ClientConfig {
    let mut config = ClientConfig::default();
    config.token = token.map(|t| t.as_bytes().to_vec());
    config
}

/// A server with a token: a client without it, or with a wrong one, is refused with
/// `Error::Unauthenticated` and its request never reaches a handler; a client with it is
/// served. Tokens can be rotated (any configured token is accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_need_the_servers_token() {
    let s = server().token("s3cret-old").token("s3cret").build();
    for addr in [
        "tcp://127.0.0.1:0".to_string(),
        format!("unix://{}/volley-auth-{}.sock", std::env::temp_dir().display(), std::process::id()),
    ] {
        let addr = s.listen(&addr).await.unwrap().to_string();
        for (token, ok) in [
            (None, false),
            (Some("wrong"), false),
            (Some("s3cre"), false),
            (Some("s3cret"), true),
            (Some("s3cret-old"), true),
        ] {
            let c = Client::connect_with(&addr, with_token(token)).await.unwrap();
            let r = c.call(&ECHO, "hi".into()).await;
            if ok {
                assert_eq!(r, Ok("hi".to_string()), "{addr} token {token:?}");
            } else {
                assert!(matches!(&r, Err(Error::Unauthenticated(_))), "{addr} token {token:?}: {r:?}");
                // Retrying reconnects and is refused again, the same way.
                let r = c.call(&ECHO, "again".into()).await;
                assert!(matches!(&r, Err(Error::Unauthenticated(_))), "{addr} token {token:?}: {r:?}");
            }
        }
    }
    // Only the authenticated calls reached the handler: 2 tokens × 2 transports.
    s.shutdown().await;
}

/// A raw peer that skips the auth message gets the go-away `Unauthenticated` and the close,
/// and its request is not answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_auth_gets_unauthenticated_go_away() {
    let s = server().token("t").build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    let mut raw = TcpStream::connect(tcp(&addr)).await.unwrap();
    raw.write_all(&PREAMBLE).await.unwrap();
    let mut fb = volley::proto::FrameBuilder::new(Limits::default());
    fb.ping(5);
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    for seg in segs {
        raw.write_all(&seg).await.unwrap();
    }
    let (msgs, closed) = read_until_closed(&mut raw, Duration::from_secs(20)).await;
    assert!(closed);
    assert_eq!(go_away_code(&msgs), Some(Code::Unauthenticated), "{msgs:?}");
    assert!(!msgs.iter().any(|m| matches!(m, Message::Pong { .. })), "served before auth: {msgs:?}");
    s.shutdown().await;
}

/// Without a token configured on the server, clients with and without one are served (old
/// clients keep working; a token is simply ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tokens_serves_everyone() {
    let s = server().build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    for token in [None, Some("anything")] {
        let c = Client::connect_with(&addr, with_token(token)).await.unwrap();
        assert_eq!(c.call(&ECHO, "hi".into()).await, Ok("hi".to_string()));
    }
    s.shutdown().await;
}

const GUARDED: &str = "hardening-guarded";

/// With a registration credential on the controller: registering, renewing or deregistering
/// without it (or with a wrong one) is refused with a typed error and leaves the existing
/// instance exactly as it was; a holder of the credential registers under the same name as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_without_the_credential_is_refused_and_leaves_the_instance_alone() {
    use volley::controller::{Controller, ControllerConfig};
    use volley::discovery::InstanceSpec;
    use volley::discovery::wire::{DEREGISTER, LeaseRequest, RENEW};
    use volley::registry::{LeaseConfig, Registry};

    let config = ControllerConfig::default().registration_credential("reg-s3cret");
    let controller = Controller::new(config);
    let reg_addr = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();

    let owner = Registry::connect(&reg_addr).await.unwrap();
    owner.set_registration_credential("reg-s3cret");
    let a = server().build();
    let a_addr = a.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let reg_a = owner
        .register(&a, vec![InstanceSpec::new(GUARDED, a_addr.clone())], LeaseConfig::default())
        .await
        .unwrap();
    let before = owner.resolve(GUARDED).await.unwrap();
    assert_eq!(before.instances.len(), 1);

    // An intruder: no credential, then a wrong one, trying to take the name.
    let intruder = Registry::connect(&reg_addr).await.unwrap();
    let b = server().build();
    let b_addr = b.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    for cred in ["", "reg-s3cre", "guess"] {
        intruder.set_registration_credential(cred);
        let r = intruder
            .register(&b, vec![InstanceSpec::new(GUARDED, b_addr.clone())], LeaseConfig::default())
            .await;
        assert!(matches!(&r, Err(Error::Unauthenticated(_))), "credential {cred:?}: {:?}", r.err());
        // Renewing or revoking the owner's lease, raw.
        let raw = Client::connect(&reg_addr).await.unwrap();
        let lease = LeaseRequest { lease: reg_a.lease(), credential: cred.into() };
        let r = raw.call(&DEREGISTER, lease.clone()).await;
        assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::Unauthenticated), "{r:?}");
        let r = raw.call(&RENEW, lease).await;
        assert_eq!(r.as_ref().err().and_then(Error::code), Some(Code::Unauthenticated), "{r:?}");
    }
    let after = owner.resolve(GUARDED).await.unwrap();
    assert_eq!(after.instances, before.instances, "the refused calls changed the registry");
    assert_eq!(after.revision, before.revision);

    // The credential's holder adds a second instance under the same name, as before.
    let c = server().build();
    let c_addr = c.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    owner
        .register(&c, vec![InstanceSpec::new(GUARDED, c_addr.clone())], LeaseConfig::default())
        .await
        .unwrap();
    let mut addrs: Vec<String> =
        owner.resolve(GUARDED).await.unwrap().instances.into_iter().map(|i| i.address).collect();
    addrs.sort();
    let mut want = vec![a_addr, c_addr];
    want.sort();
    assert_eq!(addrs, want);
    // And its own deregistration (at shutdown) works.
    a.shutdown().await;
    let left: Vec<String> =
        owner.resolve(GUARDED).await.unwrap().instances.into_iter().map(|i| i.address).collect();
    assert_eq!(left.len(), 1, "{left:?}");
    c.shutdown().await;
    b.shutdown().await;
    controller.shutdown().await;
}

const WHO_ASKS: Method<(), String> = Method::new("hardening", "who_asks");

/// A handler can name the peer it serves (what refusals log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_see_the_peer_address() {
    let s = Server::builder()
        .handle(&WHO_ASKS, |()| async move {
            Ok(volley::current_peer().map(|p| p.to_string()).unwrap_or_default())
        })
        .build();
    let addr = s.listen("tcp://127.0.0.1:0").await.unwrap();
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let peer = c.call(&WHO_ASKS, ()).await.unwrap();
    assert!(peer.starts_with("tcp://127.0.0.1:"), "{peer:?}");
    assert_ne!(peer, addr.to_string(), "the client's address, not the server's");
    s.shutdown().await;
}

/// The bytes of docs/PROTOCOL.md §12.4, from the encoder.
#[test]
fn auth_exchange_bytes_match_the_protocol_document() {
    let frame = |build: &dyn Fn(&mut volley::proto::FrameBuilder)| {
        let mut fb = volley::proto::FrameBuilder::new(Limits::default());
        build(&mut fb);
        let mut segs = Vec::new();
        fb.take_into(&mut segs);
        segs.concat()
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ");
    assert_eq!(hex(&frame(&|fb| fb.auth(b"s3cret"))), "09 00 00 00 0a 06 00 73 33 63 72 65 74");
    let refusal = frame(&|fb| fb.go_away(Code::Unauthenticated, "the token presented is not accepted"));
    assert_eq!(refusal.len(), 46);
    assert_eq!(hex(&refusal[..12]), "2a 00 00 00 07 0b 00 23 00 00 00 74");
}
