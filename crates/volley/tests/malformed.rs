//! A tcp server facing peers that break the protocol: each bad connection gets the server's
//! preamble, a go-away naming the error, and a close — and only that connection is affected.
//! Also the error replies for requests the server cannot route or decode.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volley::proto::{Code, Decoder, Kind, Limits, Message, PREAMBLE, SERVER_PREAMBLE, decode_frame};
use volley::{Client, Error, Method, Server};

const ADD_ONE: Method<u32, u32> = Method::new("math", "add_one");
/// Same names as `ADD_ONE`, other types: lets a caller send bytes the server cannot decode.
const ADD_ONE_RAW: Method<Bytes, Bytes> = Method::new("math", "add_one");
const NO_SUCH_SERVICE: Method<u32, u32> = Method::new("no-such-service", "add_one");
const NO_SUCH_METHOD: Method<u32, u32> = Method::new("math", "no_such_method");

async fn start() -> (Server, String) {
    let server = Server::builder().handle(&ADD_ONE, |x: u32| async move { Ok(x + 1) }).build();
    let bound = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let addr = bound.to_string();
    (server, addr)
}

fn host_port(addr: &str) -> &str {
    addr.strip_prefix("tcp://").unwrap()
}

/// Sends `bytes` on a raw connection, then reads everything the server sends until it closes
/// the connection. Returns the decoded go-away messages; asserts the server's preamble came
/// first, that nothing but go-aways came, and that the stream ended cleanly (read returned 0).
async fn provoke(addr: &str, bytes: &[u8]) -> Vec<Message> {
    let mut s = TcpStream::connect(host_port(addr)).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut received = Vec::new();
    let read_all = async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await.expect("read from server");
            if n == 0 {
                break;
            }
            received.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(3), read_all)
        .await
        .expect("server did not close the connection");

    assert!(received.starts_with(&SERVER_PREAMBLE), "server's preamble first, got {received:02x?}");
    let limits = Limits::default();
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::from(&received[..]);
    let mut msgs = Vec::new();
    while let Some(frame) = dec.next_frame(&mut buf).unwrap() {
        decode_frame(&frame, &limits, &mut msgs).unwrap();
    }
    assert!(buf.is_empty(), "trailing bytes after the last frame");
    msgs
}

/// The single go-away in `msgs`; asserts its code is `Protocol` and its message contains
/// every one of `words`.
fn expect_protocol_go_away(msgs: &[Message], words: &[&str]) {
    assert_eq!(msgs.len(), 1, "exactly one message, a go-away: {msgs:?}");
    let Message::GoAway { code, message } = &msgs[0] else {
        panic!("expected a go-away, got {:?}", msgs[0]);
    };
    assert_eq!(*code, Code::Protocol);
    let text = std::str::from_utf8(message).unwrap();
    for w in words {
        assert!(text.contains(w), "go-away message {text:?} lacks {w:?}");
    }
}

/// A well-behaved client keeps working while the bad ones are thrown out.
async fn still_works(client: &Client, x: u32) {
    assert_eq!(client.call(&ADD_ONE, x).await.unwrap(), x + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_preamble_gets_go_away_and_close() {
    let (server, addr) = start().await;
    let good = Client::connect(&addr).await.unwrap();
    still_works(&good, 1).await;

    let msgs = provoke(&addr, b"GET / HTTP/1.1\r\n").await;
    expect_protocol_go_away(&msgs, &["magic"]);
    still_works(&good, 2).await;

    // A right magic with a version from the future.
    let mut v9 = PREAMBLE;
    v9[4] = 9;
    let msgs = provoke(&addr, &v9).await;
    expect_protocol_go_away(&msgs, &["version 9"]);
    still_works(&good, 3).await;

    drop(good);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_message_kind_gets_go_away_and_close() {
    let (server, addr) = start().await;
    let good = Client::connect(&addr).await.unwrap();
    still_works(&good, 10).await;

    // A frame of 12 garbage bytes whose first (the kind) is 0x63.
    let body = b"c garbage!!!";
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(body);
    let msgs = provoke(&addr, &bytes).await;
    expect_protocol_go_away(&msgs, &["unknown message kind", "0x63"]);
    still_works(&good, 11).await;

    // A valid request followed in the same frame by a truncated one: the protocol error wins,
    // the connection is closed.
    let mut body = vec![Kind::Request as u8, 0];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(4);
    body.extend_from_slice(b"math");
    body.push(7);
    body.extend_from_slice(b"add_one");
    body.extend_from_slice(&4u32.to_le_bytes());
    body.extend_from_slice(&5u32.to_le_bytes());
    body.extend_from_slice(&[Kind::Reply as u8, 1, 2]);
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    let msgs = provoke(&addr, &bytes).await;
    expect_protocol_go_away(&msgs, &["malformed"]);
    still_works(&good, 12).await;

    drop(good);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_prefix_gets_go_away_and_close() {
    let (server, addr) = start().await;
    let good = Client::connect(&addr).await.unwrap();
    still_works(&good, 20).await;

    // Only the prefix is sent: the server must not wait for a body it would refuse anyway.
    let len = Limits::DEFAULT_MAX_FRAME_LEN as u32 + 1;
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&len.to_le_bytes());
    let msgs = provoke(&addr, &bytes).await;
    expect_protocol_go_away(&msgs, &[&len.to_string(), "exceeds the limit"]);
    still_works(&good, 21).await;

    drop(good);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_sends_a_reply_is_thrown_out() {
    let (server, addr) = start().await;
    let good = Client::connect(&addr).await.unwrap();

    let mut body = vec![Kind::Reply as u8];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    let msgs = provoke(&addr, &bytes).await;
    expect_protocol_go_away(&msgs, &["reply"]);
    still_works(&good, 30).await;

    drop(good);
    server.shutdown().await;
}

/// The raw connection speaks correctly: a request gets its reply, a ping its pong, and a clean
/// close between frames is not a protocol error (no go-away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn well_formed_raw_requests_get_replies() {
    let (server, addr) = start().await;
    let mut fb = volley::proto::FrameBuilder::new(Limits::default());
    fb.request_bytes(
        77,
        0,
        &volley::proto::Extensions::NONE,
        ("math", "add_one"),
        Bytes::copy_from_slice(&41u32.to_le_bytes()),
    )
    .unwrap();
    fb.ping(5);
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&segs.concat());

    let mut s = TcpStream::connect(host_port(&addr)).await.unwrap();
    s.write_all(&bytes).await.unwrap();
    let limits = Limits::default();
    let mut dec = Decoder::new(limits);
    let mut buf = BytesMut::new();
    let mut msgs = Vec::new();
    let read = async {
        while msgs.len() < 2 {
            let n = s.read_buf(&mut buf).await.unwrap();
            assert!(n > 0, "server closed early");
            while let Some(frame) = dec.next_frame(&mut buf).unwrap() {
                decode_frame(&frame, &limits, &mut msgs).unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(3), read).await.expect("no reply");
    assert_eq!(
        msgs,
        vec![
            Message::Reply { id: 77, payload: Bytes::copy_from_slice(&42u32.to_le_bytes()) },
            Message::Pong { token: 5 },
        ]
    );
    // Half-close: the server closes its side too, without a go-away.
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut rest))
        .await
        .expect("server did not close")
        .unwrap();
    assert!(rest.is_empty(), "nothing after a clean close: {rest:02x?}");
    server.shutdown().await;
}

/// Requests that arrived before a protocol violation are still served: their replies leave
/// before the go-away, then the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_before_a_violation_are_answered() {
    let (server, addr) = start().await;
    let request = |id: u64, x: u32| {
        let mut fb = volley::proto::FrameBuilder::new(Limits::default());
        fb.request_bytes(
            id,
            0,
            &volley::proto::Extensions::NONE,
            ("math", "add_one"),
            Bytes::copy_from_slice(&x.to_le_bytes()),
        )
        .unwrap();
        let mut segs = Vec::new();
        fb.take_into(&mut segs);
        segs.concat()
    };

    // A good frame, then a frame with an unknown kind, in one write.
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&request(1, 41));
    bytes.extend_from_slice(&[3, 0, 0, 0, 0x63, 0x63, 0x63]);
    let msgs = provoke(&addr, &bytes).await;
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0], Message::Reply { id: 1, payload: Bytes::copy_from_slice(&42u32.to_le_bytes()) });
    expect_protocol_go_away(&msgs[1..], &["unknown message kind"]);

    // In one frame: a request, then a reply (which clients may not send), then a request.
    let mut fb = volley::proto::FrameBuilder::new(Limits::default());
    fb.request_bytes(
        2,
        0,
        &volley::proto::Extensions::NONE,
        ("math", "add_one"),
        Bytes::copy_from_slice(&1u32.to_le_bytes()),
    )
    .unwrap();
    fb.reply_bytes(9, Bytes::new()).unwrap();
    fb.request_bytes(
        3,
        0,
        &volley::proto::Extensions::NONE,
        ("math", "add_one"),
        Bytes::copy_from_slice(&2u32.to_le_bytes()),
    )
    .unwrap();
    let mut segs = Vec::new();
    fb.take_into(&mut segs);
    assert_eq!(fb.counts(), (1, 3));
    let mut bytes = PREAMBLE.to_vec();
    bytes.extend_from_slice(&segs.concat());
    let msgs = provoke(&addr, &bytes).await;
    assert_eq!(msgs.len(), 2, "only the request before the violation is served: {msgs:?}");
    assert_eq!(msgs[0], Message::Reply { id: 2, payload: Bytes::copy_from_slice(&2u32.to_le_bytes()) });
    expect_protocol_go_away(&msgs[1..], &["reply"]);
    server.shutdown().await;
}

fn remote_code(r: Result<u32, Error>) -> (Code, String) {
    match r {
        Err(Error::Remote(status)) => (status.code, status.message),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_service_unknown_method_and_bad_request() {
    let (server, addr) = start().await;
    let client = Client::connect(&addr).await.unwrap();

    let (code, msg) = remote_code(client.call(&NO_SUCH_SERVICE, 1).await);
    assert_eq!(code, Code::UnknownService);
    assert!(msg.contains("no-such-service"), "{msg}");

    let (code, msg) = remote_code(client.call(&NO_SUCH_METHOD, 1).await);
    assert_eq!(code, Code::UnknownMethod);
    assert!(msg.contains("no_such_method"), "{msg}");

    // Three bytes are not a u32.
    let r = client.call(&ADD_ONE_RAW, Bytes::from_static(&[1, 2, 3])).await;
    match r {
        Err(Error::Remote(status)) => {
            assert_eq!(status.code, Code::BadRequest, "{status}");
            assert!(status.message.contains("decode"), "{status}");
        }
        other => panic!("expected BadRequest, got {other:?}"),
    }
    // Four bytes are.
    let r = client.call(&ADD_ONE_RAW, Bytes::copy_from_slice(&6u32.to_le_bytes())).await.unwrap();
    assert_eq!(&r[..], &7u32.to_le_bytes());

    // The connection survived every one of those.
    still_works(&client, 99).await;
    assert_eq!(client.pending_calls(), 0);

    // Good and bad requests bundled together: each caller gets its own outcome.
    let mut tasks = Vec::new();
    for i in 0..60u32 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                0 => (i, c.call(&ADD_ONE, i).await.map_err(|e| e.code())),
                1 => (i, c.call(&NO_SUCH_METHOD, i).await.map_err(|e| e.code())),
                _ => (
                    i,
                    c.call(&ADD_ONE_RAW, Bytes::from_static(b"xy"))
                        .await
                        .map(|_| u32::MAX)
                        .map_err(|e| e.code()),
                ),
            }
        }));
    }
    for t in tasks {
        let (i, r) = t.await.unwrap();
        match i % 3 {
            0 => assert_eq!(r, Ok(i + 1)),
            1 => assert_eq!(r, Err(Some(Code::UnknownMethod))),
            _ => assert_eq!(r, Err(Some(Code::BadRequest))),
        }
    }

    drop(client);
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// A client facing a raw (and eventually misbehaving) server
// ---------------------------------------------------------------------------------------------

/// One accepted connection, spoken to by hand.
struct RawPeer {
    s: TcpStream,
    dec: Decoder,
    buf: BytesMut,
    queue: std::collections::VecDeque<Message>,
}

impl RawPeer {
    async fn accept(l: &tokio::net::TcpListener) -> RawPeer {
        let (s, _) = tokio::time::timeout(Duration::from_secs(3), l.accept())
            .await
            .expect("client did not connect")
            .unwrap();
        RawPeer { s, dec: Decoder::new(Limits::default()), buf: BytesMut::new(), queue: Default::default() }
    }

    async fn next(&mut self) -> Message {
        let limits = Limits::default();
        let read = async {
            while self.queue.is_empty() {
                let n = self.s.read_buf(&mut self.buf).await.unwrap();
                assert!(n > 0, "client closed the connection");
                let mut out = Vec::new();
                while let Some(f) = self.dec.next_frame(&mut self.buf).unwrap() {
                    decode_frame(&f, &limits, &mut out).unwrap();
                }
                self.queue.extend(out);
            }
            self.queue.pop_front().unwrap()
        };
        tokio::time::timeout(Duration::from_secs(3), read).await.expect("no message from the client")
    }

    /// The next request's id and payload.
    async fn request(&mut self) -> (u64, Bytes) {
        match self.next().await {
            Message::Request { id, names, payload, .. } => {
                assert_eq!((names.service(), names.method()), ("math", "add_one"));
                (id, payload)
            }
            other => panic!("expected a request, got {other:?}"),
        }
    }

    async fn send(&mut self, build: impl FnOnce(&mut volley::proto::FrameBuilder)) {
        let mut fb = volley::proto::FrameBuilder::new(Limits::default());
        build(&mut fb);
        let mut segs = Vec::new();
        fb.take_into(&mut segs);
        self.s.write_all(&segs.concat()).await.unwrap();
    }
}

async fn raw_server() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", l.local_addr().unwrap());
    (l, addr)
}

/// The client answers pings, matches replies by id in any order, and fails all of its calls
/// promptly (no hang) when the server sends garbage; the next call reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_a_raw_server() {
    let (l, addr) = raw_server().await;
    let client = Client::connect(&addr).await.unwrap();
    let mut peer = RawPeer::accept(&l).await;
    peer.s.write_all(&PREAMBLE).await.unwrap();

    // Ping: the client answers with a pong carrying the token.
    peer.send(|fb| fb.ping(0xfeed)).await;
    assert_eq!(peer.next().await, Message::Pong { token: 0xfeed });

    // Three calls answered in reverse order, one with an error reply.
    let calls: Vec<_> = (0..3u32)
        .map(|x| {
            let c = client.clone();
            tokio::spawn(async move { c.call(&ADD_ONE, x).await })
        })
        .collect();
    let mut reqs = Vec::new();
    for _ in 0..3 {
        reqs.push(peer.request().await);
    }
    reqs.sort_by_key(|(_, p)| p.clone());
    let ids: Vec<u64> = reqs.iter().map(|(id, _)| *id).collect();
    let mut distinct = ids.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "request ids are distinct: {ids:?}");
    peer.send(|fb| {
        fb.error(ids[2], Code::Application, "two is right out");
        fb.reply_bytes(ids[1], Bytes::copy_from_slice(&100u32.to_le_bytes())).unwrap();
        // A reply for an id nobody waits for is dropped.
        fb.reply_bytes(0xdead_beef, Bytes::from_static(b"????")).unwrap();
        fb.reply_bytes(ids[0], Bytes::copy_from_slice(&200u32.to_le_bytes())).unwrap();
    })
    .await;
    let mut results = Vec::new();
    for c in calls {
        results.push(c.await.unwrap());
    }
    assert_eq!(results[0], Ok(200));
    assert_eq!(results[1], Ok(100));
    match &results[2] {
        Err(Error::Remote(s)) => {
            assert_eq!(s.code, Code::Application);
            assert_eq!(s.message, "two is right out");
        }
        other => panic!("{other:?}"),
    }
    // A reply that does not decode as the reply type.
    let c = client.clone();
    let call = tokio::spawn(async move { c.call(&ADD_ONE, 9).await });
    let (id, _) = peer.request().await;
    peer.send(|fb| fb.reply_bytes(id, Bytes::from_static(b"xyz")).unwrap()).await;
    assert!(matches!(call.await.unwrap(), Err(Error::Decode(_))));
    assert_eq!(client.pending_calls(), 0);

    // Garbage: every pending call fails at once, naming the problem.
    let calls: Vec<_> = (0..5u32)
        .map(|x| {
            let c = client.clone();
            tokio::spawn(async move { c.call(&ADD_ONE, x).await })
        })
        .collect();
    for _ in 0..5 {
        peer.request().await;
    }
    peer.s.write_all(&[3, 0, 0, 0, 0x63, 0x63, 0x63]).await.unwrap();
    for c in calls {
        let r = tokio::time::timeout(Duration::from_secs(2), c)
            .await
            .expect("call hung after the server sent garbage")
            .unwrap();
        assert_eq!(r, Err(Error::Protocol(volley::proto::ProtocolError::UnknownKind(0x63))));
    }
    assert_eq!(client.pending_calls(), 0);

    // The next call opens a new connection.
    let c = client.clone();
    let call = tokio::spawn(async move { c.call(&ADD_ONE, 1).await });
    let mut peer2 = RawPeer::accept(&l).await;
    peer2.s.write_all(&PREAMBLE).await.unwrap();
    let (id, payload) = peer2.request().await;
    assert_eq!(&payload[..], &1u32.to_le_bytes());
    peer2.send(|fb| fb.reply_bytes(id, Bytes::copy_from_slice(&2u32.to_le_bytes())).unwrap()).await;
    assert_eq!(call.await.unwrap(), Ok(2));
}

/// A server that breaks the protocol surfaces as [`Error::Protocol`] with the exact violation.
///
/// Regression test: the client used to report it as
/// `Error::Connection("tcp://...: unknown message kind 0x63")`; nothing constructed
/// `Error::Protocol`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_protocol_violation_is_error_protocol() {
    let (l, addr) = raw_server().await;
    let client = Client::connect(&addr).await.unwrap();
    let mut peer = RawPeer::accept(&l).await;
    peer.s.write_all(&PREAMBLE).await.unwrap();
    let c = client.clone();
    let call = tokio::spawn(async move { c.call(&ADD_ONE, 1).await });
    peer.request().await;
    peer.s.write_all(&[3, 0, 0, 0, 0x63, 0x63, 0x63]).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(2), call).await.expect("call hung").unwrap();
    assert_eq!(r, Err(Error::Protocol(volley::proto::ProtocolError::UnknownKind(0x63))));
}

/// A server's go-away is honoured: calls already answered are fine, and after the server
/// closes, the next call opens a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_honours_go_away() {
    let (l, addr) = raw_server().await;
    let client = Client::connect(&addr).await.unwrap();
    let mut peer = RawPeer::accept(&l).await;
    peer.s.write_all(&PREAMBLE).await.unwrap();

    // Two calls; the server answers one, says goodbye, and closes.
    let c = client.clone();
    let answered = tokio::spawn(async move { c.call(&ADD_ONE, 4).await });
    let c = client.clone();
    let unanswered = tokio::spawn(async move { c.call(&ADD_ONE, 100).await });
    let mut reqs = [peer.request().await, peer.request().await];
    reqs.sort_by_key(|(_, p)| u32::from_le_bytes(p[..].try_into().unwrap()));
    let id = reqs[0].0;
    peer.send(|fb| {
        fb.reply_bytes(id, Bytes::copy_from_slice(&5u32.to_le_bytes())).unwrap();
        fb.go_away(Code::ShuttingDown, "maintenance");
    })
    .await;
    assert_eq!(answered.await.unwrap(), Ok(5));
    drop(peer);
    // The call the server never started fails as never run (safe to send again, whatever the
    // method), and says why the server left.
    let r = tokio::time::timeout(Duration::from_secs(2), unanswered).await.expect("call hung").unwrap();
    match r {
        Err(Error::NotRun(m)) => assert!(m.contains("maintenance"), "{m}"),
        other => panic!("expected a never-run error, got {other:?}"),
    }
    assert_eq!(client.pending_calls(), 0);

    // The next call connects anew.
    let c = client.clone();
    let call = tokio::spawn(async move { c.call(&ADD_ONE, 6).await });
    let mut peer2 = RawPeer::accept(&l).await;
    peer2.s.write_all(&PREAMBLE).await.unwrap();
    let (id, _) = peer2.request().await;
    peer2.send(|fb| fb.reply_bytes(id, Bytes::copy_from_slice(&7u32.to_le_bytes())).unwrap()).await;
    assert_eq!(call.await.unwrap(), Ok(7));
}
