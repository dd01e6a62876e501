//! The protobuf tier (`volley::wire!(proto: T)`, feature `proto`): messages round-trip through
//! a server, bad bytes are a clear error, reflection names the format, and every change of the
//! evolution table's protobuf column (PROTOCOL.md §15.5) works across an old and a new type.

use bytes::{Bytes, BytesMut};
use volley::{Client, Code, Error, Method, Server, Wire};

#[derive(Clone, PartialEq, prost::Message)]
pub struct OrderV1 {
    #[prost(string, tag = "1")]
    pub item: String,
    #[prost(int32, tag = "2")]
    pub count: i32,
    #[prost(enumeration = "ColourV1", tag = "3")]
    pub colour: i32,
}

/// V1 with a field added (tag 4), `item` renamed, `count` widened to int64, the fields declared
/// in another order, and an enum variant added.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrderV2 {
    #[prost(string, tag = "4")]
    pub note: String,
    #[prost(int64, tag = "2")]
    pub quantity: i64,
    #[prost(string, tag = "1")]
    pub product: String,
    #[prost(enumeration = "ColourV2", tag = "3")]
    pub colour: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum ColourV1 {
    Red = 0,
    Green = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum ColourV2 {
    Red = 0,
    Green = 1,
    Blue = 2,
}

volley::wire!(proto: OrderV1, OrderV2);

fn cross<A: Wire, B: Wire>(v: &A) -> B {
    let mut b = BytesMut::new();
    v.encode(&mut b).unwrap();
    B::decode(b.freeze()).unwrap()
}

#[test]
fn every_change_of_the_table_works_both_ways() {
    let old = OrderV1 { item: "tea".into(), count: 3, colour: ColourV1::Green as i32 };
    let new: OrderV2 = cross(&old);
    assert_eq!(new, OrderV2 { note: String::new(), quantity: 3, product: "tea".into(), colour: 1 });
    let back: OrderV1 = cross(&OrderV2 { note: "n".into(), quantity: 5, product: "jam".into(), colour: 2 });
    // The added field is skipped, the new variant kept as its number (an open enum).
    assert_eq!(back, OrderV1 { item: "jam".into(), count: 5, colour: 2 });
    assert_eq!(ColourV1::try_from(back.colour).ok(), None, "Blue is unknown to the old build");
    // A widened value beyond the narrow type: protobuf truncates it (as its rules say), so the
    // table has widening "both ways while the value fits".
    let wide: OrderV1 = cross(&OrderV2 { quantity: 7, ..Default::default() });
    assert_eq!(wide.count, 7);
}

#[test]
fn bytes_that_are_not_the_message_are_a_clear_error() {
    let e = OrderV1::decode(Bytes::from_static(&[0x0a, 0x05, b'a'])).unwrap_err();
    assert!(e.0.contains("OrderV1") && e.0.contains("protobuf"), "{e}");
}

#[tokio::test]
async fn an_old_client_and_a_new_server_and_the_reverse() {
    const V1: Method<OrderV1, OrderV1> = Method::new("orders", "echo");
    const V2: Method<OrderV2, OrderV2> = Method::new("orders", "echo");
    let new_server = Server::builder()
        .handle_fn(&V2, |mut o: OrderV2| {
            o.quantity += 1;
            Ok(o)
        })
        .build();
    let addr = new_server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let catalog = Client::connect(&addr).await.unwrap().call(&volley::reflect::LIST, ()).await.unwrap();
    let m = catalog.method("orders", "echo").unwrap();
    assert_eq!((m.request.tier.as_str(), m.request.format.as_str()), ("general", "protobuf"));
    let old_client = Client::connect(&addr).await.unwrap();
    let got = old_client.call(&V1, OrderV1 { item: "a".into(), count: 1, colour: 0 }).await.unwrap();
    assert_eq!(got, OrderV1 { item: "a".into(), count: 2, colour: 0 });
    // A payload that is not an OrderV2 is BadRequest, never a made-up order.
    const RAW: Method<Bytes, Bytes> = Method::new("orders", "echo");
    match old_client.call(&RAW, Bytes::from_static(&[0xff, 0xff])).await {
        Err(Error::Remote(s)) => assert_eq!(s.code, Code::BadRequest, "{s:?}"),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    new_server.shutdown().await;

    let old_server = Server::builder().handle_fn(&V1, Ok).build();
    let addr = old_server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let new_client = Client::connect(&addr).await.unwrap();
    let sent =
        OrderV2 { note: "dropped by the old server".into(), quantity: 4, product: "b".into(), colour: 2 };
    let got = new_client.call(&V2, sent).await.unwrap();
    assert_eq!(got, OrderV2 { note: String::new(), quantity: 4, product: "b".into(), colour: 2 });
    old_server.shutdown().await;
}
