//! Typed requests with serde types, a batch handler, and the same code on every transport.
//! Run: `cargo run --example search -- tcp://127.0.0.1:0` (or inproc://search,
//! unix:///tmp/search.sock).

use serde::{Deserialize, Serialize};
use volley::{Client, Server, Status};

#[derive(Debug, Serialize, Deserialize)]
struct Query {
    terms: Vec<String>,
    k: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hits {
    docs: Vec<u64>,
}

// One line makes a serde type a request or reply type (encoded with bitcode).
volley::wire!(Query, Hits);

#[volley::service(name = "index")]
trait Index {
    /// Gets every query that arrived together and answers them in one pass.
    #[batch]
    async fn search(&self, queries: Vec<Query>) -> Vec<Result<Hits, Status>>;
}

struct Fake;

impl Index for Fake {
    async fn search(&self, queries: Vec<Query>) -> Vec<Result<Hits, Status>> {
        queries
            .into_iter()
            .map(|q| match q.terms.is_empty() {
                true => Err(Status::app("empty query")),
                false => Ok(Hits { docs: (0..q.k as u64).map(|i| i * q.terms.len() as u64).collect() }),
            })
            .collect()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> volley::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "tcp://127.0.0.1:0".into());

    let server = Server::builder().serve(IndexServer::new(Fake)).build();
    let bound = server.listen(&addr).await?;
    let index = IndexClient::new(Client::connect(&bound.to_string()).await?);

    let hits = index.search(Query { terms: vec!["volley".into(), "rust".into()], k: 3 }).await?;
    println!("{bound}: {hits:?}");
    // An empty query on purpose: the handler's error comes back as a typed error of this call.
    let err = index.search(Query { terms: vec![], k: 3 }).await.unwrap_err();
    println!("{bound}: an empty query, sent on purpose, is refused: {err}");
    // Many queries at once: the batch API, one result each; the handler gets them together.
    let queries = (1..=4).map(|k| Query { terms: vec!["batch".into()], k });
    let sizes: Vec<usize> =
        index.search_batch(queries).await.into_iter().map(|r| r.map_or(0, |h| h.docs.len())).collect();
    println!("{bound}: batch of 4 -> {sizes:?}");

    server.shutdown().await;
    Ok(())
}
