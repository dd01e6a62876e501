//! Schema fingerprints (docs/PROTOCOL.md §15.6): a fast-tier method whose two sides declare
//! different types is refused with an error naming the method and both fingerprints, never
//! decoded into a wrong value; the same types call as always; a peer that does not take part
//! (a client that sends none, a server that does not announce the feature) keeps working.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use volley::proto::extensions::{FEATURE_EXTENSIONS, FEATURE_FINGERPRINTS};
use volley::proto::preamble::{self, FEATURE_STREAMS};
use volley::proto::{Decoder, Extensions, Fingerprints, FrameBuilder, Limits, Message, decode_frame};
use volley::{Client, Code, Error, Method, Server, Wire};

/// A request type as the old build declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderV1 {
    id: u32,
    qty: u32,
}
/// The same type in the new build: a field added (with a default, which bitcode cannot use).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderV2 {
    id: u32,
    qty: u32,
    #[serde(default)]
    note: String,
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u32,
    total: u64,
}
/// The reply type of a new build: a field added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ReceiptV2 {
    id: u32,
    total: u64,
    currency: String,
}
volley::wire!(OrderV1, OrderV2, Receipt, ReceiptV2);

const BUY_V1: Method<OrderV1, Receipt> = Method::new("shop", "buy");
const BUY_V2: Method<OrderV2, Receipt> = Method::new("shop", "buy");
const BUY_V2_REPLY: Method<OrderV1, ReceiptV2> = Method::new("shop", "buy");

fn fp<T: Wire>() -> u64 {
    T::fingerprint().expect("a fast-tier serde type has a fingerprint")
}

async fn serve_v1() -> (Server, String) {
    let server = Server::builder()
        .handle_fn(&BUY_V1, |o: OrderV1| Ok(Receipt { id: o.id, total: 10 * u64::from(o.qty) }))
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    (server, addr)
}

async fn serve_v2() -> (Server, String) {
    let server = Server::builder()
        .handle_fn(&BUY_V2, |o: OrderV2| Ok(Receipt { id: o.id, total: 10 * u64::from(o.qty) }))
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    (server, addr)
}

/// The error of a refused call: `BadRequest`, naming the method and both fingerprints.
fn assert_mismatch(e: Error, caller: u64, server: u64) {
    let Error::Remote(status) = e else { panic!("expected a refusal from the server, got {e:?}") };
    assert_eq!(status.code, Code::BadRequest, "{status:?}");
    let m = &status.message;
    assert!(m.contains("schema mismatch on shop/buy"), "{m}");
    assert!(m.contains(&format!("caller {caller:016x}, server {server:016x}")), "{m}");
}

#[test]
fn a_field_added_changes_the_fingerprint_and_a_rename_of_the_type_does_not() {
    #[derive(Serialize, Deserialize)]
    struct Renamed {
        id: u32,
        qty: u32,
    }
    volley::wire!(Renamed);
    assert_ne!(fp::<OrderV1>(), fp::<OrderV2>());
    assert_ne!(fp::<Receipt>(), fp::<ReceiptV2>());
    assert_eq!(fp::<OrderV1>(), fp::<Renamed>(), "the type's name is not part of its shape");
    // Not the fast tier: no fingerprint (the general tiers' decoding catches what they cannot
    // evolve).
    assert_eq!(<String as Wire>::fingerprint(), None);
    assert_eq!(<volley::codec::Json<OrderV1> as Wire>::fingerprint(), None);
    assert_eq!(<volley::codec::BitcodeSerde<OrderV1> as Wire>::fingerprint(), Some(fp::<OrderV1>()));
}

#[tokio::test]
async fn an_old_client_of_a_new_server_is_refused_by_name_with_both_fingerprints() {
    let (server, addr) = serve_v2().await;
    let client = Client::connect(&addr).await.unwrap();
    let e = client.call(&BUY_V1, OrderV1 { id: 1, qty: 2 }).await.unwrap_err();
    assert_mismatch(e, fp::<OrderV1>(), fp::<OrderV2>());
    // The fingerprints went once; the connection's later calls of the method are refused too,
    // one at a time and in a batch.
    let e = client.call(&BUY_V1, OrderV1 { id: 2, qty: 2 }).await.unwrap_err();
    assert_mismatch(e, fp::<OrderV1>(), fp::<OrderV2>());
    let items: Vec<OrderV1> = (0..3).map(|id| OrderV1 { id, qty: 1 }).collect();
    let results = client.call_batch(&BUY_V1, items).await;
    assert_eq!(results.len(), 3);
    for r in results {
        assert_mismatch(r.unwrap_err(), fp::<OrderV1>(), fp::<OrderV2>());
    }
    // A client of the new build on the same server is served.
    let new = Client::connect(&addr).await.unwrap();
    let r = new.call(&BUY_V2, OrderV2 { id: 3, qty: 4, note: "gift".into() }).await.unwrap();
    assert_eq!(r, Receipt { id: 3, total: 40 });
    server.shutdown().await;
}

#[tokio::test]
async fn a_new_client_of_an_old_server_is_refused_and_so_is_a_changed_reply_type() {
    let (server, addr) = serve_v1().await;
    let client = Client::connect(&addr).await.unwrap();
    let e = client.call(&BUY_V2, OrderV2 { id: 1, qty: 2, note: String::new() }).await.unwrap_err();
    assert_mismatch(e, fp::<OrderV2>(), fp::<OrderV1>());
    // Only the reply type differs: the message names that one.
    let other = Client::connect(&addr).await.unwrap();
    let Error::Remote(status) = other.call(&BUY_V2_REPLY, OrderV1 { id: 1, qty: 2 }).await.unwrap_err()
    else {
        panic!("expected a refusal")
    };
    assert_eq!(status.code, Code::BadRequest);
    let want = format!("reply type: caller {:016x}, server {:016x}", fp::<ReceiptV2>(), fp::<Receipt>());
    assert!(status.message.contains(&want), "{}", status.message);
    assert!(!status.message.contains("request type"), "{}", status.message);
    // The old client is served as always.
    let old = Client::connect(&addr).await.unwrap();
    assert_eq!(old.call(&BUY_V1, OrderV1 { id: 5, qty: 1 }).await.unwrap().total, 10);
    server.shutdown().await;
}

#[tokio::test]
async fn the_same_types_call_one_by_one_and_in_batches() {
    let (server, addr) = serve_v1().await;
    let client = Client::connect(&addr).await.unwrap();
    for id in 0..5 {
        let r = client.call(&BUY_V1, OrderV1 { id, qty: id }).await.unwrap();
        assert_eq!(r, Receipt { id, total: 10 * u64::from(id) });
    }
    let items: Vec<OrderV1> = (0..100).map(|id| OrderV1 { id, qty: 1 }).collect();
    let results = client.call_batch(&BUY_V1, items).await;
    assert_eq!(results.len(), 100);
    for (id, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap().id, id as u32);
    }
    server.shutdown().await;
}

/// One frame's messages from a raw connection.
async fn read_messages(s: &mut TcpStream, dec: &mut Decoder, buf: &mut BytesMut) -> Vec<Message> {
    let limits = Limits::default();
    let mut msgs = Vec::new();
    while msgs.is_empty() {
        while let Some(body) = dec.next_frame(buf).unwrap() {
            decode_frame(&body, &limits, &mut msgs).unwrap();
        }
        if msgs.is_empty() {
            assert!(s.read_buf(buf).await.unwrap() > 0, "the peer closed");
        }
    }
    msgs
}

fn payload<T: Wire>(v: &T) -> Bytes {
    let mut b = BytesMut::new();
    v.encode(&mut b).unwrap();
    b.freeze()
}

/// A client that speaks the bytes itself: requests with the given fingerprints (or none).
struct RawClient {
    s: TcpStream,
    dec: Decoder,
    buf: BytesMut,
}

impl RawClient {
    async fn connect(addr: &str) -> RawClient {
        let mut s = TcpStream::connect(addr.trim_start_matches("tcp://")).await.unwrap();
        s.write_all(&preamble::PREAMBLE).await.unwrap();
        let mut got = [0u8; 8];
        s.read_exact(&mut got).await.unwrap();
        let features = preamble::check(&got).unwrap();
        assert_ne!(features & FEATURE_FINGERPRINTS, 0, "the reference server announces fingerprints");
        RawClient { s, dec: Decoder::after_preamble(Limits::default()), buf: BytesMut::new() }
    }

    /// Calls shop/buy with `body`; the reply's payload, or the error's code and message.
    async fn call(
        &mut self,
        id: u64,
        body: Bytes,
        fingerprints: Option<Fingerprints>,
    ) -> Result<Bytes, (Code, String)> {
        let mut fb = FrameBuilder::new(Limits::default());
        let ext = Extensions { fingerprints: fingerprints.map(Box::new), ..Extensions::NONE };
        fb.request_bytes(id, 0, &ext, ("shop", "buy"), body).unwrap();
        let mut out = Vec::new();
        fb.take_into(&mut out);
        self.s.write_all(&out.concat()).await.unwrap();
        match read_messages(&mut self.s, &mut self.dec, &mut self.buf).await.remove(0) {
            Message::Reply { id: got, payload } if got == id => Ok(payload),
            Message::Error { id: got, code, message } if got == id => {
                Err((code, String::from_utf8_lossy(&message).into_owned()))
            }
            m => panic!("unexpected {m:?}"),
        }
    }
}

#[tokio::test]
async fn a_client_that_sends_no_fingerprints_is_served_as_before() {
    let (server, addr) = serve_v1().await;
    let mut raw = RawClient::connect(&addr).await;
    let reply = raw.call(1, payload(&OrderV1 { id: 7, qty: 3 }), None).await.unwrap();
    assert_eq!(Receipt::decode(reply).unwrap(), Receipt { id: 7, total: 30 });
    // With the right fingerprints, served; with others, refused, and the method stays refused
    // on this connection for requests that carry none.
    let same = Fingerprints { request: fp::<OrderV1>(), reply: fp::<Receipt>() };
    assert!(raw.call(2, payload(&OrderV1 { id: 8, qty: 1 }), Some(same)).await.is_ok());
    let other = Fingerprints { request: fp::<OrderV2>(), reply: fp::<Receipt>() };
    let (code, message) = raw.call(3, payload(&OrderV1 { id: 9, qty: 1 }), Some(other)).await.unwrap_err();
    assert_eq!(code, Code::BadRequest);
    assert!(
        message
            .contains(&format!("request type: caller {:016x}, server {:016x}", other.request, same.request))
    );
    let (code, _) = raw.call(4, payload(&OrderV1 { id: 9, qty: 1 }), None).await.unwrap_err();
    assert_eq!(code, Code::BadRequest, "refused for the rest of the connection");
    // Matching fingerprints again lift it (a caller with two versions of the method).
    assert!(raw.call(5, payload(&OrderV1 { id: 9, qty: 1 }), Some(same)).await.is_ok());
    assert!(raw.call(6, payload(&OrderV1 { id: 9, qty: 1 }), None).await.is_ok());
    // Another connection was never refused.
    let mut fresh = RawClient::connect(&addr).await;
    assert!(fresh.call(1, payload(&OrderV1 { id: 1, qty: 1 }), None).await.is_ok());
    server.shutdown().await;
}

/// A server that answers every shop/buy with a `Receipt`, announcing `features`, and records
/// the fingerprints each request carried.
async fn recording_server(features: u8) -> (String, Arc<parking_lot::Mutex<Vec<Option<Fingerprints>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else { return };
        s.write_all(&preamble::preamble(features)).await.unwrap();
        let mut got = [0u8; 8];
        s.read_exact(&mut got).await.unwrap();
        let (mut dec, mut buf) = (Decoder::after_preamble(Limits::default()), BytesMut::new());
        loop {
            let mut fb = FrameBuilder::new(Limits::default());
            for m in read_messages(&mut s, &mut dec, &mut buf).await {
                if let Message::Request { id, ext, payload, .. } = m {
                    record.lock().push(ext.fingerprints.as_deref().copied());
                    let order = OrderV1::decode(payload).unwrap();
                    fb.reply(id, |b| Receipt { id: order.id, total: 1 }.encode(b)).unwrap();
                }
            }
            let mut out = Vec::new();
            fb.take_into(&mut out);
            if s.write_all(&out.concat()).await.is_err() {
                return;
            }
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_server_without_the_feature_gets_no_fingerprints_and_serves_the_calls() {
    // A server of an earlier revision: extensions and streams, no fingerprints.
    let (addr, seen) = recording_server(FEATURE_EXTENSIONS | FEATURE_STREAMS).await;
    let client = Client::connect(&addr).await.unwrap();
    for id in 0..3 {
        assert_eq!(client.call(&BUY_V1, OrderV1 { id, qty: 1 }).await.unwrap().id, id);
    }
    assert_eq!(*seen.lock(), vec![None; 3]);
}

#[tokio::test]
async fn a_server_that_checks_gets_the_fingerprints_once_per_connection_and_method() {
    let (addr, seen) = recording_server(FEATURE_EXTENSIONS | FEATURE_STREAMS | FEATURE_FINGERPRINTS).await;
    let client = Client::connect(&addr).await.unwrap();
    for id in 0..3 {
        assert_eq!(client.call(&BUY_V1, OrderV1 { id, qty: 1 }).await.unwrap().id, id);
    }
    let want = Fingerprints { request: fp::<OrderV1>(), reply: fp::<Receipt>() };
    assert_eq!(*seen.lock(), vec![Some(want), None, None]);
}

/// Every change of the evolution table (PROTOCOL.md §15.5) that the fast tier cannot make
/// changes the fingerprint, so the check catches it: add, remove, rename, reorder a field,
/// widen an integer, add an enum variant.
#[test]
fn every_change_of_the_evolution_table_changes_the_fingerprint() {
    macro_rules! shapes {
        ($($name:ident { $($body:tt)* })*) => {$(
            #[derive(Serialize, Deserialize)]
            #[allow(dead_code)]
            struct $name { $($body)* }
            volley::wire!($name);
        )*};
    }
    shapes! {
        Base { a: u32, b: String }
        Added { a: u32, b: String, #[serde(default)] c: bool }
        Removed { a: u32 }
        Renamed { x: u32, b: String }
        Reordered { b: String, a: u32 }
        Widened { a: u64, b: String }
    }
    #[derive(Serialize, Deserialize)]
    #[allow(dead_code)]
    enum Kind {
        A,
        B,
    }
    #[derive(Serialize, Deserialize)]
    #[allow(dead_code)]
    enum KindMore {
        A,
        B,
        C,
    }
    volley::wire!(Kind, KindMore);
    let base = fp::<Base>();
    for (change, other) in [
        ("add a field", fp::<Added>()),
        ("remove a field", fp::<Removed>()),
        ("rename a field", fp::<Renamed>()),
        ("reorder fields", fp::<Reordered>()),
        ("widen an integer", fp::<Widened>()),
    ] {
        assert_ne!(base, other, "{change}");
    }
    assert_ne!(fp::<Kind>(), fp::<KindMore>(), "add an enum variant");
}
