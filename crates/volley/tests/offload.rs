//! Large payloads are decoded, handled and encoded on the codec pool, not on the connection's
//! task; small ones stay inline. Handlers report the thread they ran on, so each test sees
//! where the work happened.

use bytes::{Bytes, BytesMut};
use volley::{BatchOptions, CallOptions, Client, Code, CodecError, Error, Method, Server};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Blob {
    seq: u64,
    words: Vec<String>,
}
volley::wire!(Blob);

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Echoed {
    thread: String,
    blob: Blob,
}
volley::wire!(Echoed);

/// Decodes like a byte string, but panics on a payload that starts with `b"boom"`.
#[derive(Debug)]
struct Fragile(Bytes);

impl volley::Wire for Fragile {
    fn encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        out.extend_from_slice(&self.0);
        Ok(())
    }
    fn decode(bytes: Bytes) -> Result<Self, CodecError> {
        assert!(!bytes.starts_with(b"boom"), "a codec bug");
        Ok(Fragile(bytes))
    }
}

const ECHO: Method<Blob, Echoed> = Method::new("blob", "echo");
const SLOW_ECHO: Method<Blob, Echoed> = Method::new("blob", "slow-echo");
const LEN: Method<Fragile, u64> = Method::new("fragile", "len");

/// Roughly `bytes` of encoded payload.
fn blob(seq: u64, bytes: usize) -> Blob {
    Blob { seq, words: (0..bytes / 16).map(|i| format!("word-{seq}-{i:08}")).collect() }
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("unnamed").to_string()
}

fn on_pool(thread: &str) -> bool {
    thread.starts_with("volley-codec-")
}

fn server(offload_min_bytes: usize) -> Server {
    Server::builder()
        .offload_min_bytes(offload_min_bytes)
        .handle_fn(&ECHO, |blob: Blob| Ok(Echoed { thread: thread_name(), blob }))
        .handle(&SLOW_ECHO, |blob: Blob| async move {
            // Replies out of order on a real socket: the handler suspends (so it is finished
            // on the runtime, not the pool) and gives way a while before it answers — without
            // waiting on any clock.
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
            Ok(Echoed { thread: thread_name(), blob })
        })
        .handle_fn(&LEN, |f: Fragile| Ok(f.0.len() as u64))
        .build()
}

async fn connect(server: &Server, transport: &str) -> Client {
    let addr = match transport {
        "tcp" => "tcp://127.0.0.1:0".to_string(),
        _ => format!("unix://{}/volley-offload-{}.sock", std::env::temp_dir().display(), std::process::id()),
    };
    let bound = server.listen(&addr).await.unwrap();
    Client::connect(&bound.to_string()).await.unwrap()
}

#[tokio::test]
async fn large_requests_run_on_the_codec_pool_and_small_ones_inline() {
    for transport in ["tcp", "unix"] {
        let server = server(64 << 10);
        let client = connect(&server, transport).await;

        let big = blob(1, 256 << 10);
        let reply = client.call(&ECHO, big.clone()).await.unwrap();
        assert_eq!(reply.blob, big, "{transport}: the large echo came back intact");
        assert!(on_pool(&reply.thread), "{transport}: a large request ran on {:?}", reply.thread);

        let small = blob(2, 1 << 10);
        let reply = client.call(&ECHO, small.clone()).await.unwrap();
        assert_eq!(reply.blob, small);
        assert!(!on_pool(&reply.thread), "{transport}: a small request ran on {:?}", reply.thread);
        server.shutdown().await;
    }
}

#[tokio::test]
async fn offload_can_be_turned_off() {
    let server = server(usize::MAX);
    let client = connect(&server, "tcp").await;
    let reply = client.call(&ECHO, blob(1, 256 << 10)).await.unwrap();
    assert!(!on_pool(&reply.thread), "offload is off, yet the request ran on {:?}", reply.thread);
    server.shutdown().await;
}

#[tokio::test]
async fn many_large_and_small_requests_at_once_all_get_their_own_reply() {
    let server = server(32 << 10);
    let client = connect(&server, "tcp").await;
    let calls = (0..64u64).map(|i| {
        let client = client.clone();
        let size = if i % 2 == 0 { 48 << 10 } else { 512 };
        async move {
            let sent = blob(i, size);
            let waits = i % 3 == 0;
            let got = client.call(if waits { &SLOW_ECHO } else { &ECHO }, sent.clone()).await.unwrap();
            assert_eq!(got.blob, sent, "call {i} got another call's reply");
            (size >= 32 << 10, waits, got.thread)
        }
    });
    for (large, waits, thread) in futures_util::future::join_all(calls).await {
        match (large, waits) {
            (false, _) => assert!(!on_pool(&thread), "a small request ran on {thread:?}"),
            (true, false) => assert!(on_pool(&thread), "a large request ran on {thread:?}"),
            // A handler that waits is started on the pool and finished on the runtime.
            (true, true) => {}
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_large_batch_chunk_is_served_on_the_pool_with_every_item_in_order() {
    let server = server(64 << 10);
    let client = connect(&server, "tcp").await;
    let sent: Vec<Blob> = (0..40).map(|i| blob(i, 8 << 10)).collect();
    let opts = BatchOptions::default().chunk_size(20);
    let replies = client.call_batch_with(&ECHO, sent.clone(), opts).await;
    assert_eq!(replies.len(), sent.len());
    for (want, got) in sent.iter().zip(replies) {
        let got = got.unwrap();
        assert_eq!(&got.blob, want);
        assert!(on_pool(&got.thread), "a 160 KiB chunk's item ran on {:?}", got.thread);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_large_payload_that_does_not_decode_is_a_bad_request() {
    let server = server(64 << 10);
    let client = connect(&server, "tcp").await;
    let garbage = Bytes::from(vec![0xff; 128 << 10]);
    match client.call_raw("blob", "echo", garbage, CallOptions::default()).await {
        Err(Error::Remote(s)) => assert_eq!(s.code, Code::BadRequest, "{s:?}"),
        other => panic!("expected a bad-request error, got {other:?}"),
    }
    assert_eq!(client.call(&ECHO, blob(3, 100 << 10)).await.unwrap().blob.seq, 3);
    server.shutdown().await;
}

#[tokio::test]
async fn a_codec_that_panics_on_the_pool_fails_that_request_only() {
    let server = server(64 << 10);
    let client = connect(&server, "tcp").await;
    let mut bad = b"boom".to_vec();
    bad.resize(128 << 10, 0);
    match client.call(&LEN, Fragile(Bytes::from(bad))).await {
        Err(Error::Remote(s)) => {
            assert_eq!(s.code, Code::Internal, "{s:?}");
            assert!(s.message.contains("a codec bug"), "{s:?}");
        }
        other => panic!("expected an internal error, got {other:?}"),
    }
    let good = Bytes::from(vec![7u8; 128 << 10]);
    assert_eq!(client.call(&LEN, Fragile(good)).await.unwrap(), 128 << 10, "the connection lives on");
    server.shutdown().await;
}
