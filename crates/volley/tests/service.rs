//! Services declared as traits (`#[volley::service]`): the generated client and server on
//! every transport, in every call form; batch handlers getting real batches; and a server
//! that listens and registers in one call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use std::ops::Deref;

use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use volley::codec::{BitcodeSerde, Json};
use volley::{BatchOptions, CallOptions, Client, Code, Error, Server, Status};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Query {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hits {
    pub words: Vec<String>,
}

volley::wire!(Query, Hits);

/// Every handler form, with request and reply types of two tiers (serde/bitcode and pod).
#[volley::service(name = "words")]
pub trait Words {
    /// The query's words, or an application error for an empty query.
    async fn split(&self, q: Query) -> Result<Hits, Status>;
    /// Squares; records how many requests each call of the handler got.
    #[batch]
    async fn square(&self, xs: Vec<u64>) -> Vec<Result<u64, Status>>;
    /// Runs inline.
    #[sync]
    fn len(&self, s: String) -> Result<u64, Status>;
    /// No request value.
    #[sync]
    fn calls(&self) -> Result<u64, Status>;
}

#[derive(Default)]
struct Impl {
    /// Sizes of the batches the batch handler was given, in order.
    batches: Mutex<Vec<usize>>,
    calls: AtomicUsize,
}

impl Words for Impl {
    async fn split(&self, q: Query) -> Result<Hits, Status> {
        self.calls.fetch_add(1, Relaxed);
        // A real wait, so the future is spawned rather than finished inline.
        tokio::task::yield_now().await;
        if q.text.is_empty() {
            return Err(Status::app("empty query"));
        }
        Ok(Hits { words: q.text.split_whitespace().map(str::to_string).collect() })
    }

    async fn square(&self, xs: Vec<u64>) -> Vec<Result<u64, Status>> {
        self.calls.fetch_add(xs.len(), Relaxed);
        self.batches.lock().unwrap().push(xs.len());
        xs.into_iter().map(|x| if x == 13 { Err(Status::app("unlucky")) } else { Ok(x * x) }).collect()
    }

    fn len(&self, s: String) -> Result<u64, Status> {
        self.calls.fetch_add(1, Relaxed);
        Ok(s.len() as u64)
    }

    fn calls(&self) -> Result<u64, Status> {
        Ok(self.calls.load(Relaxed) as u64)
    }
}

fn addresses(tag: &str) -> Vec<String> {
    vec![
        format!("inproc://service-{tag}"),
        format!("unix://{}/volley-service-{tag}-{}.sock", std::env::temp_dir().display(), std::process::id()),
        "tcp://127.0.0.1:0".to_string(),
    ]
}

fn q(text: &str) -> Query {
    Query { text: text.to_string() }
}

async fn serve(addr: &str) -> (Server, std::sync::Arc<Impl>, WordsClient) {
    let imp = std::sync::Arc::new(Impl::default());
    let server = Server::builder().serve(WordsServer::from_arc(imp.clone())).build();
    let bound = server.listen(addr).await.unwrap();
    let client = WordsClient::new(Client::connect(&bound.to_string()).await.unwrap());
    (server, imp, client)
}

#[tokio::test(flavor = "current_thread")]
async fn generated_client_and_server_round_trip_single_calls_on_every_transport() {
    for addr in addresses("single") {
        let (server, imp, words) = serve(&addr).await;
        let hits = words.split(q("batching is the architecture")).await.unwrap();
        assert_eq!(hits.words, ["batching", "is", "the", "architecture"], "{addr}");
        match words.split(q("")).await {
            Err(Error::Remote(s)) => {
                assert_eq!((s.code, s.message.as_str()), (Code::Application, "empty query"))
            }
            other => panic!("{addr}: expected the application error, got {other:?}"),
        }
        let opts = CallOptions::default().timeout(std::time::Duration::from_secs(20));
        assert_eq!(words.split_with(q("a b"), opts).await.unwrap().words.len(), 2, "{addr}");
        // A batch method is called per request like any other.
        assert_eq!(words.square(9).await.unwrap(), 81, "{addr}");
        assert_eq!(words.len("four".to_string()).await.unwrap(), 4, "{addr}");
        assert_eq!(words.calls().await.unwrap(), 5, "{addr}: every call reached the implementation once");
        assert_eq!(imp.calls.load(Relaxed), 5);
        // The descriptors work at the level below, with the same server.
        assert_eq!(words.inner().call(&WordsMethods::LEN, "xyz".to_string()).await.unwrap(), 3);
        assert_eq!(WordsMethods::SERVICE, "words");
        assert_eq!((WordsMethods::SPLIT.service(), WordsMethods::SPLIT.name()), ("words", "split"));
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn generated_client_round_trips_batches_and_streams_on_every_transport() {
    for addr in addresses("batch") {
        let (server, _imp, words) = serve(&addr).await;
        let results = words.square_batch(0..300u64).await;
        assert_eq!(results.len(), 300, "{addr}");
        for (x, r) in results.into_iter().enumerate() {
            match (x, r) {
                (13, Err(Error::Remote(s))) => assert_eq!(s.message, "unlucky"),
                (x, Ok(y)) => assert_eq!(y, (x * x) as u64, "{addr}: result {x} out of place"),
                (x, other) => panic!("{addr}: request {x}: {other:?}"),
            }
        }
        let texts: Vec<Query> = (0..50).map(|i| q(&"w ".repeat(i % 7 + 1))).collect();
        let split = words.split_batch_with(texts, BatchOptions::default().chunk_size(8)).await;
        let counts: Vec<usize> = split.into_iter().map(|r| r.unwrap().words.len()).collect();
        assert_eq!(counts, (0..50).map(|i| i % 7 + 1).collect::<Vec<_>>(), "{addr}");

        let opts = BatchOptions::default().chunk_size(64).window(4);
        let lens: Vec<u64> = words
            .len_stream((0..2_000).map(|i| "x".repeat(i % 10)), opts)
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(
            lens,
            (0..2_000).map(|i| (i % 10) as u64).collect::<Vec<_>>(),
            "{addr}: stream out of order"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn batch_handler_gets_many_requests_per_call() {
    for addr in addresses("batches") {
        let (server, imp, words) = serve(&addr).await;
        // The batch API: a chunk of 100 reaches the handler as one batch.
        let results = words.square_batch(1..=100u64).await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 99, "{addr}: all but 13 succeed");
        let sizes = std::mem::take(&mut *imp.batches.lock().unwrap());
        assert_eq!(sizes.iter().sum::<usize>(), 100, "{addr}: every request handled once");
        assert!(sizes.iter().any(|&n| n > 1), "{addr}: batch handler only saw batches of one: {sizes:?}");

        // Independent single calls started together also arrive together: all 64 are queued
        // before this (single-threaded) runtime runs the connection's writer or the
        // in-process dispatcher, however loaded the machine is.
        let calls = (0..64u64).map(|x| words.square(x));
        let results = futures_util::future::join_all(calls).await;
        assert!(
            results.iter().enumerate().all(|(x, r)| x == 13 || r.as_ref().ok() == Some(&((x * x) as u64)))
        );
        let sizes = imp.batches.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 64, "{addr}");
        assert!(sizes.iter().max() > Some(&1), "{addr}: concurrent calls never shared a batch: {sizes:?}");
        server.shutdown().await;
    }
}

/// A request type that is not `Clone` works through a plain `Client` (only a `ServiceClient`
/// needs to clone requests, and only its methods ask for it).
#[derive(Debug, Serialize, Deserialize)]
pub struct Ticket {
    pub id: u64,
}
volley::wire!(json: Ticket);

#[volley::service]
pub trait Desk {
    #[sync]
    fn take(&self, t: Ticket) -> Result<u64, Status>;
}

struct Counter;
impl Desk for Counter {
    fn take(&self, t: Ticket) -> Result<u64, Status> {
        Ok(t.id + 1)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn request_types_need_not_be_clone_for_a_plain_client() {
    let server = Server::builder().serve(DeskServer::new(Counter)).build();
    server.listen("inproc://service-desk").await.unwrap();
    let desk = DeskClient::new(Client::connect("inproc://service-desk").await.unwrap());
    assert_eq!(desk.take(Ticket { id: 41 }).await.unwrap(), 42);
    assert_eq!(DeskMethods::SERVICE, "desk", "the name defaults to the trait's in snake_case");
    server.shutdown().await;
}

/// A codec tier for every message of a service, chosen by a type parameter (as the
/// testbed's roles do).
pub trait Tier: Send + Sync + 'static {
    type W<T: Serialize + DeserializeOwned + Send + Sync + 'static>: volley::Wire
        + From<T>
        + Deref<Target = T>;
}

pub struct JsonTier;
impl Tier for JsonTier {
    type W<T: Serialize + DeserializeOwned + Send + Sync + 'static> = Json<T>;
}

pub struct BitcodeTier;
impl Tier for BitcodeTier {
    type W<T: Serialize + DeserializeOwned + Send + Sync + 'static> = BitcodeSerde<T>;
}

#[volley::service(name = "tiered")]
pub trait Tiered<C: Tier> {
    async fn split(&self, q: C::W<Query>) -> Result<C::W<Hits>, Status>;
    #[batch]
    async fn lens(&self, qs: Vec<C::W<Query>>) -> Vec<Result<u64, Status>>;
}

struct Splitter;
impl<C: Tier> Tiered<C> for Splitter {
    async fn split(&self, q: C::W<Query>) -> Result<C::W<Hits>, Status> {
        Ok(Hits { words: q.text.split_whitespace().map(str::to_string).collect() }.into())
    }
    async fn lens(&self, qs: Vec<C::W<Query>>) -> Vec<Result<u64, Status>> {
        qs.iter().map(|q| Ok(q.text.len() as u64)).collect()
    }
}

async fn tiered_round_trip<C: Tier>(addr: &str) {
    let server = Server::builder().serve(TieredServer::<C, _>::new(Splitter)).build();
    let bound = server.listen(addr).await.unwrap();
    let client: TieredClient<C> = TieredClient::new(Client::connect(&bound.to_string()).await.unwrap());
    let hits = client.split(q("one two").into()).await.unwrap();
    assert_eq!(hits.words, ["one", "two"], "{addr}");
    let lens: Vec<u64> = client
        .lens_batch([q("a"), q("bb"), q("ccc")].map(Into::into))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(lens, [1, 2, 3], "{addr}");
    assert_eq!(<TieredMethods<C>>::SPLIT.name(), "split");
    server.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_trait_generic_over_the_codec_tier_serves_each_tier() {
    tiered_round_trip::<JsonTier>("tcp://127.0.0.1:0").await;
    tiered_round_trip::<BitcodeTier>("tcp://127.0.0.1:0").await;
    tiered_round_trip::<JsonTier>("inproc://service-tiered").await;
}
