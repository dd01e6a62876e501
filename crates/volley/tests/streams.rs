//! Server streams (PROTOCOL.md §9.9) end to end: items in order over tcp and unix, the credit
//! window bounding the producer, cancel and deadline stopping it, a server that dies ending the
//! stream with an error, and a server without the feature refused before anything is sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use volley::bytes::BytesMut;
use volley::proto::{Decoder, FrameBuilder, Limits, Message, decode_frame, preamble};
use volley::{Client, Code, Error, Method, Server, Status, StreamMethod, StreamOptions};

const COUNT: StreamMethod<u64, u64> = StreamMethod::new("streams", "count");
const FOREVER: StreamMethod<u64, u64> = StreamMethod::new("streams", "forever");
const PANICS: StreamMethod<u64, u64> = StreamMethod::new("streams", "panics");
const ECHO: Method<u64, u64> = Method::new("streams", "echo");

/// What the server's producers did: items pulled from them, and producers dropped.
#[derive(Default)]
struct Produced {
    items: AtomicU64,
    dropped: AtomicU64,
}

/// Counts the producer's end (its stream dropped, whatever the reason).
struct OnDrop(Arc<Produced>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// `0..n`, counting every item pulled, and its own drop.
fn counted(
    produced: Arc<Produced>,
    items: impl Iterator<Item = u64> + Send + 'static,
) -> impl Stream<Item = Result<u64, Status>> + Send + 'static {
    let (p, guard) = (produced.clone(), OnDrop(produced));
    futures_util::stream::iter(items).map(move |i| {
        let _keep = &guard;
        p.items.fetch_add(1, Ordering::SeqCst);
        Ok(i)
    })
}

#[path = "support/wait.rs"]
mod wait;
use wait::eventually;

fn server(produced: &Arc<Produced>) -> Server {
    let (p1, p2) = (produced.clone(), produced.clone());
    Server::builder()
        .handle_stream(&COUNT, move |n| {
            let s = counted(p1.clone(), 0..n);
            async move { Ok(s) }
        })
        .handle_stream(&FOREVER, move |pause_ms| {
            let s = counted(p2.clone(), 0..).then(move |i| async move {
                if pause_ms > 0 {
                    // A producer that takes its time between items, on the machine's clock:
                    // these streams cross real sockets.
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                }
                i
            });
            async move { Ok(s) }
        })
        .handle_stream(&PANICS, |after| async move {
            Ok(futures_util::stream::iter(0..).map(move |i| {
                assert!(i < after, "the producer fails mid-stream");
                Ok(i)
            }))
        })
        .handle_fn(&ECHO, Ok)
        .build()
}

async fn serve(produced: &Arc<Produced>, addr: &str) -> (Server, Client) {
    let server = server(produced);
    let addr = server.listen(addr).await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    (server, client)
}

#[tokio::test]
async fn items_arrive_in_order_and_the_stream_ends_over_tcp_and_unix() {
    let dir = std::env::temp_dir().join(format!("volley-streams-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unix = format!("unix://{}", dir.join("s.sock").display());
    for addr in ["tcp://127.0.0.1:0", unix.as_str()] {
        let produced = Arc::new(Produced::default());
        let (server, client) = serve(&produced, addr).await;
        let got: Vec<u64> =
            client.open_stream(&COUNT, 10_000).await.unwrap().map(|r| r.unwrap()).collect().await;
        assert_eq!(got, (0..10_000).collect::<Vec<_>>(), "{addr}");
        // An empty stream ends at once; the connection still serves calls.
        assert_eq!(client.open_stream(&COUNT, 0).await.unwrap().count().await, 0);
        assert_eq!(client.call(&ECHO, 7).await.unwrap(), 7);
        let stats = server.stream_stats();
        assert_eq!((stats.opened, stats.items, stats.ended("done")), (2, 10_000, 2), "{addr}");
        server.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A consumer that takes a few items and then waits holds the producer to the credit it
/// granted (its window and the grants it made), whatever the producer could make; once it
/// reads again, every item arrives.
#[tokio::test]
async fn the_credit_window_bounds_the_producer_of_a_slow_consumer() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    const N: u64 = 200_000;
    const WINDOW: u32 = 16;
    let mut s = client.open_stream_with(&COUNT, N, StreamOptions::default().window(WINDOW)).await.unwrap();
    // Ten items a moment apart, like a slow reader.
    for i in 0..10 {
        assert_eq!(s.next().await.unwrap().unwrap(), i);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Taken 10: the window, plus one grant of half a window after 8. A window of real time in
    // which a producer that ignored its credit would run past it (over a real socket, whose
    // buffers would take it).
    let granted = u64::from(WINDOW + WINDOW / 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pulled = produced.items.load(Ordering::SeqCst);
    assert!(pulled <= granted, "the producer made {pulled} items with {granted} granted");
    assert!(pulled >= 10);
    // Then it reads at full speed: the rest arrives, in order.
    let mut next = 10;
    while let Some(item) = s.next().await {
        assert_eq!(item.unwrap(), next);
        next += 1;
    }
    assert_eq!(next, N);
    assert_eq!(produced.items.load(Ordering::SeqCst), N);
    server.shutdown().await;
}

/// Dropping the stream mid-way sends a cancel: the server drops its producer within a round
/// trip or so, and counts the stream as cancelled.
#[tokio::test]
async fn a_cancel_from_the_client_stops_the_producer() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    let mut s = client.open_stream(&FOREVER, 1).await.unwrap();
    for i in 0..5 {
        assert_eq!(s.next().await.unwrap().unwrap(), i);
    }
    assert_eq!(produced.dropped.load(Ordering::SeqCst), 0, "the producer runs while the stream is read");
    drop(s);
    assert!(
        eventually(Duration::from_secs(10), || produced.dropped.load(Ordering::SeqCst) == 1).await,
        "the producer was not dropped"
    );
    assert!(eventually(Duration::from_secs(10), || server.stream_stats().ended("cancelled") == 1).await);
    // The connection serves on.
    assert_eq!(client.call(&ECHO, 3).await.unwrap(), 3);
    server.shutdown().await;
}

/// The stream's timeout reaches the server as its budget: a client that does not even poll
/// finds the producer stopped by the server's own deadline, and the stream ends with a
/// time-out for the caller.
#[tokio::test]
async fn a_deadline_ends_the_stream_on_both_sides() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    let timeout = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let mut s =
        client.open_stream_with(&FOREVER, 5, StreamOptions::default().timeout(timeout)).await.unwrap();
    // The server side, without the client's help: it is not polled meanwhile.
    assert!(
        eventually(Duration::from_secs(10), || server.stream_stats().ended("deadline") == 1).await,
        "the server's deadline did not end the stream"
    );
    assert_eq!(produced.dropped.load(Ordering::SeqCst), 1);
    assert!(started.elapsed() >= timeout);
    // The client side: its items, then the time-out, then the end.
    let mut items = 0;
    let end = loop {
        match s.next().await {
            Some(Ok(_)) => items += 1,
            Some(Err(e)) => break e,
            None => panic!("the stream ended without its time-out"),
        }
    };
    assert!(matches!(end, Error::Timeout(t) if t == timeout), "{end:?} after {items} items");
    assert!(s.next().await.is_none());

    // And a client that reads on past its deadline ends there too, however fast items come.
    let mut s =
        client.open_stream_with(&FOREVER, 0, StreamOptions::default().timeout(timeout)).await.unwrap();
    let t0 = tokio::time::Instant::now();
    let end = loop {
        match s.next().await {
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("the stream ended without its time-out"),
        }
    };
    assert!(matches!(end, Error::Timeout(_)), "{end:?}");
    assert!(t0.elapsed() >= timeout && t0.elapsed() < timeout * 20, "{:?}", t0.elapsed());
    server.shutdown().await;
}

/// A producer that panics ends the stream with `Panicked`, after the items before it.
#[tokio::test]
async fn a_producer_that_fails_ends_the_stream_with_its_error() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    let results: Vec<_> = client.open_stream(&PANICS, 3).await.unwrap().collect().await;
    assert_eq!(results.len(), 4, "{results:?}");
    assert!(results[..3].iter().all(Result::is_ok));
    assert!(matches!(&results[3], Err(Error::Remote(s)) if s.code == Code::Panicked), "{results:?}");
    assert_eq!(server.stream_stats().ended("error"), 1);
    server.shutdown().await;
}

/// A stream method opened under a name the server does not have, and a call to a stream
/// method, get clear errors; neither hurts the connection.
#[tokio::test]
async fn wrong_shapes_and_names_are_answered_with_errors() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    const NONE: StreamMethod<u64, u64> = StreamMethod::new("streams", "nothing");
    const ECHO_AS_STREAM: StreamMethod<u64, u64> = StreamMethod::new("streams", "echo");
    const COUNT_AS_CALL: Method<u64, u64> = Method::new("streams", "count");
    let first = |s: volley::Streaming<u64>| async move { s.collect::<Vec<_>>().await };
    let r = first(client.open_stream(&NONE, 1).await.unwrap()).await;
    assert!(matches!(&r[..], [Err(Error::Remote(s))] if s.code == Code::UnknownMethod), "{r:?}");
    let r = first(client.open_stream(&ECHO_AS_STREAM, 1).await.unwrap()).await;
    assert!(matches!(&r[..], [Err(Error::Remote(s))] if s.code == Code::BadRequest), "{r:?}");
    let r = client.call(&COUNT_AS_CALL, 1).await;
    assert!(
        matches!(&r, Err(Error::Remote(s)) if s.code == Code::BadRequest && s.message.contains("stream")),
        "{r:?}"
    );
    assert_eq!(client.call(&ECHO, 9).await.unwrap(), 9);
    server.shutdown().await;
}

/// A fake server: sends `features` in its preamble, answers each request with its payload,
/// and on a stream open sends two items and then closes the connection (a crash, as the
/// client sees it). Reports every kind it read.
async fn fake_server(features: u8) -> (String, Arc<parking_lot::Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let kinds = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = kinds.clone();
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else { return };
        s.write_all(&preamble::preamble(features)).await.unwrap();
        let limits = Limits::default();
        let (mut dec, mut buf) = (Decoder::new(limits), BytesMut::new());
        loop {
            match s.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return,
            }
            let mut msgs = Vec::new();
            while let Some(body) = dec.next_frame(&mut buf).unwrap() {
                decode_frame(&body, &limits, &mut msgs).unwrap();
            }
            let mut fb = FrameBuilder::new(limits);
            let mut crash = false;
            for m in msgs {
                match m {
                    Message::Request { id, payload, .. } => {
                        seen.lock().push(0x01);
                        fb.reply_bytes(id, payload).unwrap();
                    }
                    Message::StreamOpen { id, .. } => {
                        seen.lock().push(0x10);
                        for i in 0..2u64 {
                            fb.stream_item::<()>(id, |b| {
                                b.extend_from_slice(&i.to_le_bytes());
                                Ok(())
                            })
                            .unwrap();
                        }
                        crash = true;
                    }
                    _ => {}
                }
            }
            let mut out = Vec::new();
            fb.take_into(&mut out);
            s.write_all(&out.concat()).await.unwrap();
            if crash {
                return; // the socket closes with the task
            }
        }
    });
    (addr, kinds)
}

/// A server that dies mid-stream ends it with a connection error, never a hang.
#[tokio::test]
async fn a_server_crash_ends_the_stream_with_an_error() {
    let (addr, _) = fake_server(preamble::SERVER_PREAMBLE[5]).await;
    let client = Client::connect(&addr).await.unwrap();
    let s = client.open_stream(&COUNT, 10).await.unwrap();
    let results = tokio::time::timeout(Duration::from_secs(20), s.collect::<Vec<_>>()).await.expect("a hang");
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[0].as_ref().unwrap(), &0);
    assert_eq!(results[1].as_ref().unwrap(), &1);
    assert!(matches!(&results[2], Err(Error::Connection(_))), "{results:?}");
}

/// A server whose preamble does not announce streams (one of an earlier revision) is sent no
/// stream message: the client refuses the stream locally, and calls work as before.
#[tokio::test]
async fn a_server_without_the_feature_is_sent_no_stream() {
    let (addr, kinds) = fake_server(0x01).await;
    let client = Client::connect(&addr).await.unwrap();
    assert_eq!(client.call(&ECHO, 5).await.unwrap(), 5);
    let r = client.open_stream(&COUNT, 10).await;
    assert!(matches!(&r, Err(Error::Usage(m)) if m.contains("STREAMS")), "{r:?}");
    assert_eq!(client.call(&ECHO, 6).await.unwrap(), 6);
    assert_eq!(*kinds.lock(), vec![0x01, 0x01], "only the calls reached the server");
}

/// A client of an earlier revision (its preamble announces nothing) sees the new feature bit
/// and keeps working: it ignores it.
#[tokio::test]
async fn a_client_that_knows_no_streams_is_served_as_before() {
    let produced = Arc::new(Produced::default());
    let server = server(&produced);
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let mut s = tokio::net::TcpStream::connect(addr.to_string().trim_start_matches("tcp://")).await.unwrap();
    let mut fb = FrameBuilder::new(Limits::default());
    fb.request_bytes(
        1,
        0,
        &volley::Extensions::NONE,
        ("streams", "echo"),
        42u64.to_le_bytes().to_vec().into(),
    )
    .unwrap();
    let mut out = vec![volley::bytes::Bytes::from_static(&preamble::PREAMBLE)];
    fb.take_into(&mut out);
    s.write_all(&out.concat()).await.unwrap();
    let (mut dec, mut buf, mut msgs) = (Decoder::new(Limits::default()), BytesMut::new(), Vec::new());
    while msgs.is_empty() {
        assert!(s.read_buf(&mut buf).await.unwrap() > 0);
        while let Some(body) = dec.next_frame(&mut buf).unwrap() {
            decode_frame(&body, &Limits::default(), &mut msgs).unwrap();
        }
    }
    assert_eq!(dec.peer_features() & preamble::FEATURE_STREAMS, preamble::FEATURE_STREAMS);
    assert!(matches!(&msgs[0], Message::Reply { id: 1, payload } if payload[..] == 42u64.to_le_bytes()));
    server.shutdown().await;
}

/// Streams that send as fast as they can do not starve single calls on the same connection:
/// a canary's calls keep being answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_do_not_starve_calls() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..16 {
        let (client, stop) = (client.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut s = client.open_stream(&FOREVER, 0).await.unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                s.next().await.unwrap().unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut worst = Duration::ZERO;
    for i in 0..50 {
        let t0 = tokio::time::Instant::now();
        assert_eq!(client.call(&ECHO, i).await.unwrap(), i);
        worst = worst.max(t0.elapsed());
        // Calls spread over half a second of the machine's clock, beside streams on a real
        // socket: the worst wait among them is the measure.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for r in readers {
        total += r.await.unwrap();
    }
    assert!(total > 1000, "the streams moved only {total} items");
    assert!(worst < Duration::from_secs(2), "a call waited {worst:?} behind the streams");
    server.shutdown().await;
}

/// A stream method in a service trait: `Result<ItemStream<Item>, Status>`, served by the
/// generated server and opened by the generated client, beside a plain method.
#[volley::service(name = "log")]
pub trait Log {
    /// The lines from `from` on.
    async fn tail(&self, from: u64) -> Result<volley::service::ItemStream<String>, Status>;
    async fn lines(&self) -> Result<u64, Status>;
}

struct Lines(Vec<String>);

impl Log for Lines {
    async fn tail(&self, from: u64) -> Result<volley::service::ItemStream<String>, Status> {
        let Some(lines) = self.0.get(from as usize..) else {
            return Err(Status::new(Code::BadRequest, format!("no line {from}")));
        };
        let lines: Vec<String> = lines.to_vec();
        Ok(futures_util::stream::iter(lines).map(Ok).boxed())
    }

    async fn lines(&self) -> Result<u64, Status> {
        Ok(self.0.len() as u64)
    }
}

#[tokio::test]
async fn a_service_trait_serves_and_opens_streams() {
    let lines = Lines((0..100).map(|i| format!("line {i}")).collect());
    let server = Server::builder().serve(LogServer::new(lines)).build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let log = LogClient::new(Client::connect(&addr.to_string()).await.unwrap());
    assert_eq!(log.lines().await.unwrap(), 100);
    let tail: Vec<String> = log.tail(97).await.unwrap().map(Result::unwrap).collect().await;
    assert_eq!(tail, ["line 97", "line 98", "line 99"]);
    let opts = StreamOptions::default().window(4);
    assert_eq!(log.tail_with(0, opts).await.unwrap().count().await, 100);
    // The handler's error before any item ends the stream with it.
    let r: Vec<_> = log.tail(101).await.unwrap().collect().await;
    assert!(matches!(&r[..], [Err(Error::Remote(s))] if s.code == Code::BadRequest), "{r:?}");
    // The descriptor is a stream method's: a plain client opens it too.
    let direct = log.inner().open_stream(&LogMethods::TAIL, 99).await.unwrap();
    assert_eq!(direct.count().await, 1);
    server.shutdown().await;
}

/// Through the registry: a `ServiceClient` opens each stream on one instance picked by the
/// balancing policy, and the stream stays there (its items all come from that instance);
/// in relayed mode streams are refused with a clear error.
#[tokio::test]
async fn a_service_client_opens_streams_on_instances_and_the_relay_refuses_them() {
    use volley::ServiceClient;
    use volley::controller::{Controller, ControllerConfig};
    use volley::registry::Registry;
    use volley::service_client::{Mode, ServiceConfig};
    let controller = Controller::new(ControllerConfig::default().settle(Duration::ZERO));
    let caddr = controller.listen("tcp://127.0.0.1:0").await.unwrap();
    let registry = Registry::connect(&caddr.to_string()).await.unwrap();
    let mut servers = Vec::new();
    for i in 0..2u64 {
        let lines = Lines((0..10).map(|n| format!("instance {i} line {n}")).collect());
        let server = Server::builder().serve(LogServer::new(lines)).build();
        server.listen_and_register("tcp://127.0.0.1:0", &registry).await.unwrap();
        servers.push(server);
    }
    let log = LogClient::new(ServiceClient::with_registry(registry.clone(), ServiceConfig::default()));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let lines: Vec<String> = log.tail(0).await.unwrap().map(Result::unwrap).collect().await;
        assert_eq!(lines.len(), 10);
        let instance = lines[0].split(" line").next().unwrap().to_string();
        assert!(lines.iter().all(|l| l.starts_with(&instance)), "a stream moved: {lines:?}");
        seen.insert(instance);
    }
    assert_eq!(seen.len(), 2, "the opens were balanced over both instances: {seen:?}");

    let relayed =
        LogClient::new(ServiceClient::with_registry(registry, ServiceConfig::default().mode(Mode::Relayed)));
    let r = relayed.tail(0).await;
    assert!(matches!(&r, Err(Error::Usage(m)) if m.contains("relay")), "{r:?}");
    for s in servers {
        s.shutdown().await;
    }
}

const SUM: volley::ClientStreamMethod<u64, u64> = volley::ClientStreamMethod::new("streams", "sum");
const ECHO_BOTH: volley::BidiStreamMethod<u64, u64> = volley::BidiStreamMethod::new("streams", "echo-both");
const HOLD: volley::ClientStreamMethod<u64, u64> = volley::ClientStreamMethod::new("streams", "hold");

/// A server of client and both-way streams; `hold` takes one item, then waits for `release`
/// before it reads on.
fn two_way_server(release: Arc<tokio::sync::Notify>) -> Server {
    Server::builder()
        .handle_client_stream(&SUM, |items: volley::Incoming<u64>| async move {
            let all: Vec<u64> = items.map(|r| r.unwrap()).collect().await;
            Ok(all.iter().sum::<u64>() + all.len() as u64 * 1_000_000)
        })
        .handle_bidi_stream(&ECHO_BOTH, |items: volley::Incoming<u64>| async move {
            Ok(items.map(|r| r.map(|x| x * 2)))
        })
        .handle_client_stream(&HOLD, move |mut items: volley::Incoming<u64>| {
            let release = release.clone();
            async move {
                let first = items.next().await.unwrap()?;
                release.notified().await;
                Ok(first + items.count().await as u64)
            }
        })
        .build()
}

/// A client stream: the items go up in order, the one reply comes back.
#[tokio::test]
async fn a_client_stream_sends_its_items_and_gets_one_reply() {
    let server = two_way_server(Arc::default());
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    let mut up = client.open_client_stream(&SUM, StreamOptions::default()).await.unwrap();
    for i in 0..10_000u64 {
        up.send(i).await.unwrap();
    }
    assert_eq!(up.finish().await.unwrap(), (0..10_000u64).sum::<u64>() + 10_000 * 1_000_000);
    // None at all.
    let up = client.open_client_stream(&SUM, StreamOptions::default()).await.unwrap();
    assert_eq!(up.finish().await.unwrap(), 0);
    // A both-way method opened as a client stream is refused by name.
    const WRONG: volley::ClientStreamMethod<u64, u64> =
        volley::ClientStreamMethod::new("streams", "echo-both");
    let r = client.open_client_stream(&WRONG, StreamOptions::default()).await.unwrap().finish().await;
    assert!(matches!(&r, Err(Error::Remote(s)) if s.code == Code::BadRequest), "{r:?}");
    server.shutdown().await;
}

/// The server's credit bounds a client stream's sender: a handler that stops reading holds
/// the sender at the server's window; once it reads on, everything arrives.
#[tokio::test]
async fn the_servers_credit_bounds_a_client_streams_sender() {
    let release = Arc::new(tokio::sync::Notify::new());
    let server = two_way_server(release.clone());
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    let mut up = client.open_client_stream(&HOLD, StreamOptions::default()).await.unwrap();
    let mut sent = 0u64;
    loop {
        match tokio::time::timeout(Duration::from_millis(300), up.send(sent)).await {
            Ok(r) => r.unwrap(),
            Err(_) => break,
        }
        sent += 1;
        assert!(sent <= 1_000, "the sender was never held back");
    }
    // The first window (64) and at most one grant after the one item taken.
    assert!((64..=64 + 32).contains(&sent), "sent {sent} items before being held");
    release.notify_one();
    for i in 0..1_000 {
        up.send(i).await.unwrap();
    }
    // The reply: the first item (0) plus how many came after it. The item the timed-out send
    // was given was dropped with its future, never sent.
    assert_eq!(up.finish().await.unwrap(), (sent - 1) + 1_000);
    server.shutdown().await;
}

/// A both-way echo of 100,000 items: every one back, doubled, in order, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_both_way_echo_keeps_every_item_in_order() {
    let server = two_way_server(Arc::default());
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    const N: u64 = 100_000;
    let (mut tx, rx) = client.open_bidi_stream(&ECHO_BOTH, StreamOptions::default()).await.unwrap();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            tx.send(i).await.unwrap();
        }
        tx.finish();
    });
    let mut next = 0;
    let mut rx = rx;
    while let Some(item) = rx.next().await {
        assert_eq!(item.unwrap(), next * 2);
        next += 1;
    }
    assert_eq!(next, N);
    sender.await.unwrap();
    server.shutdown().await;
}

/// A million items through one stream to a reader that takes ten a second for five seconds,
/// then reads as fast as it can: at every item it takes, the producer is ahead of it by no
/// more than the credit window (so the server holds back what the reader does not take), and
/// once the reader speeds up every item arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_items_to_a_reader_that_is_slow_then_fast() {
    let produced = Arc::new(Produced::default());
    let (server, client) = serve(&produced, "tcp://127.0.0.1:0").await;
    const N: u64 = 1_000_000;
    let window = u64::from(StreamOptions::default().window);
    let mut s = client.open_stream(&COUNT, N).await.unwrap();
    let ahead = |taken: u64| produced.items.load(Ordering::SeqCst).saturating_sub(taken);
    let mut worst = 0;
    for i in 0..50 {
        assert_eq!(s.next().await.unwrap().unwrap(), i);
        // A slow reader on the machine's clock: a producer ignoring its credit would fill the
        // real socket's buffers meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        worst = worst.max(ahead(i + 1));
    }
    // Fifty taken, fewer than half a window: the reader granted nothing beyond its window.
    let slow = produced.items.load(Ordering::SeqCst);
    assert!(slow <= window, "a reader that took 50 items had the producer make {slow}");
    assert!(worst <= window, "the producer ran {worst} items ahead of the slow reader");
    let mut next = 50;
    while let Some(item) = s.next().await {
        assert_eq!(item.unwrap(), next);
        next += 1;
        worst = worst.max(ahead(next));
    }
    assert_eq!(next, N, "every item arrived");
    assert_eq!(produced.items.load(Ordering::SeqCst), N, "the producer sped up with the reader");
    assert!(worst <= window, "the producer ran {worst} items ahead of the reader");
    server.shutdown().await;
}
