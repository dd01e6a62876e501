//! The example end to end: protobuf types generated from a `.proto`, called over tcp, an error,
//! reflection naming the tier, and the descriptor set naming the messages.

use prost::{Message, Name};
use volley::{Client, Code, Error};
use volley_proto_example::{BUY, DESCRIPTOR_SET, pb, server};

#[tokio::test]
async fn a_generated_type_is_called_over_tcp_and_a_bad_order_is_refused() {
    let server = server();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    let order = pb::Order { id: 7, sku: "cake".into(), qty: 3, coupon: String::new() };
    assert_eq!(
        client.call(&BUY, order).await.unwrap(),
        pb::Receipt { id: 7, total_cents: 1260, note: String::new() }
    );
    let half = pb::Order { id: 8, sku: "tea".into(), qty: 2, coupon: "HALF".into() };
    assert_eq!(client.call(&BUY, half).await.unwrap().total_cents, 350);
    let bad = pb::Order { id: 9, sku: "coal".into(), qty: 1, coupon: String::new() };
    match client.call(&BUY, bad).await {
        Err(Error::Remote(s)) => {
            assert_eq!(s.code, Code::BadRequest);
            assert!(s.message.contains("unknown sku \"coal\""), "{}", s.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let catalog = client.call(&volley::reflect::LIST, ()).await.unwrap().into_inner();
    let buy = catalog.method("shop.v1", "buy").unwrap();
    assert_eq!((buy.request.tier.as_str(), buy.request.format.as_str()), ("general", "protobuf"));
    assert_eq!(buy.reply.format, "protobuf");
    // The message names and the descriptor set, as a tool reads them.
    let proto = buy.request.protobuf.as_ref().expect("a protobuf type's reflection");
    assert_eq!(proto.message.as_deref(), Some("shop.v1.Order"));
    assert_eq!(buy.reply.protobuf.as_ref().unwrap().message.as_deref(), Some("shop.v1.Receipt"));
    let set = proto.descriptor_set.as_deref().expect("declared with its descriptor set");
    assert_eq!(base64_decode(set), DESCRIPTOR_SET);
    server.shutdown().await;
}

/// An order from a build before `coupon` existed (its bytes lack tag 4) is served, with the
/// field's default.
#[tokio::test]
async fn an_order_without_the_newer_field_is_served() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct OldOrder {
        #[prost(uint32, tag = "1")]
        id: u32,
        #[prost(string, tag = "2")]
        sku: String,
        #[prost(uint32, tag = "3")]
        qty: u32,
    }
    volley::wire!(proto: OldOrder);
    const OLD_BUY: volley::Method<OldOrder, pb::Receipt> = volley::Method::new("shop.v1", "buy");
    let server = server();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    let client = Client::connect(&addr).await.unwrap();
    let r = client.call(&OLD_BUY, OldOrder { id: 1, sku: "tea".into(), qty: 1 }).await.unwrap();
    assert_eq!((r.total_cents, r.note.as_str()), (350, ""));
    server.shutdown().await;
}

/// Standard base64, decoded the long way (the test must not share the server's encoder).
fn base64_decode(text: &str) -> Vec<u8> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bits: Vec<u8> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| ABC.iter().position(|&a| a == c).expect("a base64 letter") as u8)
        .collect();
    bits.chunks(4)
        .flat_map(|q| {
            let n = q.iter().enumerate().fold(0u32, |n, (i, &v)| n | u32::from(v) << (18 - 6 * i));
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            bytes.into_iter().take(q.len() - 1)
        })
        .collect()
}

#[test]
fn the_descriptor_set_names_the_messages() {
    let set = prost_types::FileDescriptorSet::decode(DESCRIPTOR_SET).unwrap();
    let file = set.file.iter().find(|f| f.name() == "shop.proto").expect("shop.proto in the set");
    assert_eq!(file.package(), "shop.v1");
    let names: Vec<&str> = file.message_type.iter().map(|m| m.name()).collect();
    assert_eq!(names, ["Order", "Receipt"]);
    assert_eq!(pb::Order::full_name(), "shop.v1.Order");
}

/// The bytes of one order, which clients/python/tests/test_protobuf.py checks its encoder
/// against: the two languages agree on the payload.
#[test]
fn an_order_is_the_bytes_the_python_side_expects() {
    use volley::Wire;
    let order = pb::Order { id: 7, sku: "tea".into(), qty: 2, coupon: String::new() };
    let mut b = volley::bytes::BytesMut::new();
    Wire::encode(&order, &mut b).unwrap();
    assert_eq!(&b[..], [0x08, 0x07, 0x12, 0x03, b't', b'e', b'a', 0x18, 0x02]);
}
