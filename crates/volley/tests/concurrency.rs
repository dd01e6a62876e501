//! Many concurrent callers sharing one client: every caller gets its own reply (no cross-talk
//! between request ids), and on byte transports the requests leave bundled into far fewer
//! frames than messages.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use volley::{Client, Method, Server};

/// Replies with a value derived from the request, so a reply to the wrong caller shows.
const ECHO: Method<u64, u64> = Method::new("concurrency", "echo");
/// Same, but replies out of arrival order (a number of yields that depends on the value).
const SHUFFLE: Method<u64, u64> = Method::new("concurrency", "shuffle");

const CALLERS: u64 = 1000;

fn answer(x: u64) -> u64 {
    x.wrapping_mul(2_654_435_761).wrapping_add(17)
}

fn server() -> (Server, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let counted = served.clone();
    let server = Server::builder()
        .handle(&ECHO, move |x: u64| {
            counted.fetch_add(1, Ordering::Relaxed);
            async move { Ok(answer(x)) }
        })
        .handle(&SHUFFLE, |x: u64| async move {
            // Replies out of order on the wire: each handler gives way its own number of
            // times (0–49) before it answers, so handlers that started together end apart —
            // without waiting on any clock.
            for _ in 0..(x * 7919) % 50 {
                tokio::task::yield_now().await;
            }
            Ok(answer(x))
        })
        .build();
    (server, served)
}

fn unix_address(tag: &str) -> String {
    format!("unix://{}/volley-concurrency-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id())
}

/// Starts `CALLERS` tasks that all call `m` at once on clones of `client`; checks that each
/// one got the answer to its own request. Returns how many succeeded.
async fn hammer(client: &Client, m: Method<u64, u64>) -> usize {
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS as usize));
    let mut tasks = Vec::with_capacity(CALLERS as usize);
    for i in 0..CALLERS {
        let client = client.clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let r = client.call(&m, i).await;
            (i, r)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let (i, r) = t.await.expect("caller task panicked");
        let got = r.unwrap_or_else(|e| panic!("caller {i}: {e}"));
        assert_eq!(got, answer(i), "caller {i} got someone else's reply");
        ok += 1;
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_callers_one_tcp_connection_get_their_own_replies() {
    let (server, served) = server();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();

    let ok =
        tokio::time::timeout(Duration::from_secs(10), hammer(&client, ECHO)).await.expect("1000 calls hung");
    assert_eq!(ok, CALLERS as usize);
    assert_eq!(served.load(Ordering::Relaxed), CALLERS as usize);

    let c = client.counters();
    assert_eq!(c.messages_sent, CALLERS, "one message per request: {c:?}");
    assert_eq!(c.messages_received, CALLERS, "one message per reply: {c:?}");
    assert!(c.frames_sent >= 1 && c.frames_sent <= c.messages_sent, "{c:?}");
    // All of it went over the one connection the client opened.
    let s = server.counters();
    assert_eq!(s.messages_received, c.messages_sent, "{s:?} vs {c:?}");
    assert_eq!(s.frames_received, c.frames_sent, "{s:?} vs {c:?}");
    assert_eq!(s.messages_sent, c.messages_received, "{s:?} vs {c:?}");
    assert_eq!(client.pending_calls(), 0);

    // Replies that complete out of order still reach the right callers.
    let ok = tokio::time::timeout(Duration::from_secs(10), hammer(&client, SHUFFLE))
        .await
        .expect("1000 shuffled calls hung");
    assert_eq!(ok, CALLERS as usize);
    assert_eq!(client.pending_calls(), 0);

    drop(client);
    server.shutdown().await;
}

/// Bundling on the send side of a client: 1000 callers calling at once on one connection
/// leave in far fewer frames than messages. Five rounds, so that one lucky round does not
/// decide the outcome.
///
/// Regression test: on a multi-threaded runtime the outbox writer used to run right after each
/// producer that woke it (tokio's LIFO slot), drain the one message queued so far and write it
/// alone — 1,300..4,200 frames for these 5,000 requests. Yielding once between wake-up and
/// draining brings it to a few dozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_callers_requests_are_bundled() {
    const ROUNDS: u64 = 5;
    let (server, _) = server();
    let tcp = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let unix = server.listen(&unix_address("bundling")).await.unwrap();
    for bound in [tcp, unix] {
        let client = Client::connect(&bound.to_string()).await.unwrap();
        for _ in 0..ROUNDS {
            let ok = tokio::time::timeout(Duration::from_secs(10), hammer(&client, ECHO))
                .await
                .expect("1000 calls hung");
            assert_eq!(ok, CALLERS as usize);
        }
        let c = client.counters();
        assert!(c.messages_sent >= ROUNDS * CALLERS, "{bound}: {c:?}");
        assert!(
            c.frames_sent * 4 <= c.messages_sent,
            "{bound}: requests were not bundled: {} frames for {} messages",
            c.frames_sent,
            c.messages_sent
        );
        // The server answers each batch it reads in one go, so its replies are bundled as
        // well as the requests were.
        assert!(c.frames_received * 4 <= c.messages_received, "{bound}: replies were not bundled: {c:?}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_callers_one_unix_connection_get_their_own_replies() {
    let (server, served) = server();
    let bound = server.listen(&unix_address("echo")).await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();

    for m in [ECHO, SHUFFLE] {
        let ok =
            tokio::time::timeout(Duration::from_secs(10), hammer(&client, m)).await.expect("1000 calls hung");
        assert_eq!(ok, CALLERS as usize, "{m:?}");
    }
    assert_eq!(served.load(Ordering::Relaxed), CALLERS as usize);
    let c = client.counters();
    assert_eq!(c.messages_sent, 2 * CALLERS, "{c:?}");
    assert_eq!(c.messages_received, 2 * CALLERS, "{c:?}");
    assert_eq!(server.counters().messages_received, c.messages_sent);
    assert_eq!(client.pending_calls(), 0);

    drop(client);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_callers_inproc_get_their_own_replies() {
    let (server, served) = server();
    let bound = server.listen("inproc://concurrency-thousand-callers").await.unwrap();
    let client = Client::connect(&bound.to_string()).await.unwrap();

    for m in [ECHO, SHUFFLE] {
        let ok =
            tokio::time::timeout(Duration::from_secs(10), hammer(&client, m)).await.expect("1000 calls hung");
        assert_eq!(ok, CALLERS as usize, "{m:?}");
    }
    assert_eq!(served.load(Ordering::Relaxed), CALLERS as usize);

    drop(client);
    server.shutdown().await;
}

/// A request that names its caller: client number and call number.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Tagged {
    client: u32,
    call: u32,
}
volley::wire!(Tagged);

const TAGGED: Method<Tagged, u64> = Method::new("concurrency", "tagged");

/// Several clients (separate connections) at once against one server: replies never cross
/// connections either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_tcp_clients_at_once_do_not_cross_talk() {
    let server = Server::builder()
        .handle(&TAGGED, |t: Tagged| async move { Ok(((t.client as u64) << 32) | t.call as u64) })
        .build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();

    let mut tasks = Vec::new();
    for client_no in 0..8u32 {
        let client = Client::connect(&bound.to_string()).await.unwrap();
        for call in 0..125u32 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let req = Tagged { client: client_no, call };
                let got = client.call(&TAGGED, req).await.unwrap();
                assert_eq!(got, ((client_no as u64) << 32) | call as u64, "{req:?}");
            }));
        }
    }
    assert_eq!(tasks.len(), 1000);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t).await.expect("call hung").expect("caller panicked");
    }
    server.shutdown().await;
}
