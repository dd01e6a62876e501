//! Typed requests with serde types, a batch handler, and the same code on every transport.
//! Run: `cargo run --example search -- tcp://127.0.0.1:0` (or inproc://search,
//! unix:///tmp/search.sock).

use serde::{Deserialize, Serialize};
use volley::{Client, Code, Method, Server, Status};

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

const SEARCH: Method<Query, Hits> = Method::new("index", "search");

#[tokio::main(flavor = "current_thread")]
async fn main() -> volley::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "tcp://127.0.0.1:0".into());

    // A batch handler gets every query that arrived together and answers them in one pass.
    let server = Server::builder()
        .handle_batch(&SEARCH, |queries: Vec<Query>| async move {
            queries
                .into_iter()
                .map(|q| match q.terms.is_empty() {
                    true => Err(Status::new(Code::Application, "empty query")),
                    false => Ok(Hits { docs: (0..q.k as u64).map(|i| i * q.terms.len() as u64).collect() }),
                })
                .collect()
        })
        .build();
    let bound = server.listen(&addr).await?;
    let client = Client::connect(&bound.to_string()).await?;

    let hits = client.call(&SEARCH, Query { terms: vec!["volley".into(), "rust".into()], k: 3 }).await?;
    println!("{bound}: {hits:?}");
    // An empty query on purpose: the handler's error comes back as a typed error of this call.
    let err = client.call(&SEARCH, Query { terms: vec![], k: 3 }).await.unwrap_err();
    println!("{bound}: an empty query, sent on purpose, is refused: {err}");

    server.shutdown().await;
    Ok(())
}
