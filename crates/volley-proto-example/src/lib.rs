//! A Volley service whose request and reply types come from a `.proto` file: prost-build
//! generates them in build.rs, one line puts them in Volley's protobuf tier
//! (`volley::wire!(proto: …)`), and any language with the `.proto` reads the payloads.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> volley::Result<()> {
//! use volley_proto_example::{BUY, pb, server};
//! let server = server();
//! let addr = server.listen("tcp://127.0.0.1:0").await?;
//! let client = volley::Client::connect(&addr.to_string()).await?;
//! let order = pb::Order { id: 1, sku: "tea".into(), qty: 2, coupon: String::new() };
//! assert_eq!(client.call(&BUY, order).await?.total_cents, 700);
//! # Ok(()) }
//! ```

use volley::{Method, Server, Status};

/// The types generated from proto/shop.proto (package `shop.v1`).
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/shop.v1.rs"));
}

// Reflection hands the descriptor set out with each type, so a tool that has only the server's
// address can read and build these payloads.
volley::wire!(proto(DESCRIPTOR_SET): pb::Order, pb::Receipt);

/// The descriptor set of proto/shop.proto (`google.protobuf.FileDescriptorSet`, binary), for
/// tools that build or read payloads without the generated code.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/shop.descriptor.bin"));

/// `shop.v1/buy`: an order in, a receipt out.
pub const BUY: Method<pb::Order, pb::Receipt> = Method::new("shop.v1", "buy");

/// Price of one item, in cents, by SKU.
fn price(sku: &str) -> Option<u64> {
    match sku {
        "tea" => Some(350),
        "cake" => Some(420),
        _ => None,
    }
}

/// Prices an order: an unknown SKU or no quantity is refused.
pub fn buy(order: pb::Order) -> Result<pb::Receipt, Status> {
    let each = price(&order.sku)
        .ok_or_else(|| Status::new(volley::Code::BadRequest, format!("unknown sku {:?}", order.sku)))?;
    if order.qty == 0 {
        return Err(Status::new(volley::Code::BadRequest, "qty must be at least 1"));
    }
    let mut total = each * u64::from(order.qty);
    let mut note = String::new();
    if order.coupon == "HALF" {
        total /= 2;
        note = "coupon HALF applied".into();
    }
    Ok(pb::Receipt { id: order.id, total_cents: total, note })
}

/// The example's server: `shop.v1/buy`.
pub fn server() -> Server {
    Server::builder().handle_fn(&BUY, buy).build()
}
