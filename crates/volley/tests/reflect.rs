//! Reflection: a server's `volley.reflect` lists the methods the service macro and the
//! builder registered, with handler kinds, tiers, formats and JSON Schemas; it can be turned
//! off; it is never registered in a registry as one of the application's services.

use serde::{Deserialize, Serialize};
use volley::reflect::{HandlerKind, LIST};
use volley::{Client, Code, Error, Method, Server, Status};

#[derive(Debug, Clone, Serialize, Deserialize, volley::schemars::JsonSchema)]
#[schemars(crate = "volley::schemars")]
pub struct Order {
    pub item: String,
    pub count: u32,
}
volley::wire!(json: Order);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    pub total: u64,
}
volley::wire!(msgpack: Receipt);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fast {
    pub x: u64,
}
volley::wire!(Fast);

#[volley::service(name = "shop")]
pub trait Shop {
    async fn buy(&self, o: Order) -> Result<Receipt, Status>;
    #[batch]
    async fn price(&self, items: Vec<String>) -> Vec<Result<u64, Status>>;
    #[sync]
    fn fast(&self, f: Fast) -> Result<Fast, Status>;
}

struct Impl;
impl Shop for Impl {
    async fn buy(&self, o: Order) -> Result<Receipt, Status> {
        Ok(Receipt { total: o.count as u64 })
    }
    async fn price(&self, items: Vec<String>) -> Vec<Result<u64, Status>> {
        items.iter().map(|i| Ok(i.len() as u64)).collect()
    }
    fn fast(&self, f: Fast) -> Result<Fast, Status> {
        Ok(f)
    }
}

const RAW: Method<volley::bytes::Bytes, Vec<u32>> = Method::new("raw", "sum");

#[tokio::test]
async fn reflection_lists_every_method_with_its_kind_and_types() {
    let server = Server::builder()
        .serve(ShopServer::new(Impl))
        .handle_fn(&RAW, |b: volley::bytes::Bytes| Ok(vec![b.len() as u32]))
        .build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    let catalog = client.call(&LIST, ()).await.unwrap().into_inner();

    let names: Vec<&str> = catalog.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["raw", "shop", "volley.health", "volley.reflect"]);
    let buy = catalog.method("shop", "buy").unwrap();
    assert_eq!(buy.kind, HandlerKind::Single);
    assert_eq!((buy.request.tier.as_str(), buy.request.format.as_str()), ("general", "json"));
    assert!(buy.request.name.ends_with("Order"), "{}", buy.request.name);
    let schema = buy.request.schema.as_ref().expect("Order derives JsonSchema");
    assert_eq!(schema["properties"]["count"]["type"], "integer", "{schema}");
    assert_eq!(buy.reply.format, "msgpack");
    assert!(buy.reply.schema.is_none(), "Receipt has no schema");
    let price = catalog.method("shop", "price").unwrap();
    assert_eq!(
        (price.kind, price.request.format.as_str(), price.reply.format.as_str()),
        (HandlerKind::Batch, "utf-8", "u64")
    );
    let fast = catalog.method("shop", "fast").unwrap();
    assert_eq!((fast.request.tier.as_str(), fast.request.format.as_str()), ("fast", "bitcode-serde"));
    let raw = catalog.method("raw", "sum").unwrap();
    assert_eq!((raw.request.format.as_str(), raw.reply.format.as_str()), ("bytes", "array"));
    assert_eq!(catalog.method("volley.reflect", "list").unwrap().reply.format, "json");
    // The application's services only: reflection is not one of them.
    assert_eq!(server.services(), ["raw", "shop"]);
    server.shutdown().await;
}

#[tokio::test]
async fn reflection_can_be_turned_off() {
    let server = Server::builder().serve(ShopServer::new(Impl)).reflection(false).build();
    let addr = server.listen("tcp://127.0.0.1:0").await.unwrap();
    let client = Client::connect(&addr.to_string()).await.unwrap();
    match client.call(&LIST, ()).await {
        Err(Error::Remote(s)) => assert_eq!(s.code, Code::UnknownService, "{s:?}"),
        other => panic!("expected UnknownService, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn reflection_answers_in_process_too() {
    let server = Server::builder().serve(ShopServer::new(Impl)).build();
    server.listen("inproc://reflect-local").await.unwrap();
    let client = Client::connect("inproc://reflect-local").await.unwrap();
    let catalog = client.call(&LIST, ()).await.unwrap().into_inner();
    assert_eq!(catalog.service("shop").unwrap().methods.len(), 3);
    server.shutdown().await;
}
