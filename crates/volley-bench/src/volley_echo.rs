//! The echo service in Volley, declared as a trait (`#[volley::service]`): the generated
//! `EchoServer` serves it and the generated `EchoClient` calls it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use volley::service::ItemStream;
use volley::{BatchOptions, Client, Server, Status, StreamOptions};

use crate::load::{Caller, CpuMeter, Sample, batch_sample, payload};

#[volley::service]
pub trait Echo {
    /// `echo/echo`: returns its payload (a future per request, like the peers' handlers).
    async fn echo(&self, payload: Bytes) -> Result<Bytes, Status>;
    /// `echo/echo_all`: the same echo served by a batch handler, which gets every request that
    /// arrived together as one `Vec` — Volley's way to serve batches without a future per
    /// request. Used only by the batch scenario, as a second Volley method.
    #[batch]
    async fn echo_all(&self, payloads: Vec<Bytes>) -> Vec<Result<Bytes, Status>>;
    /// `echo/items`: a server stream of `count` items of `size` bytes, produced as fast as
    /// credit allows (the server-stream scenario, against tonic's server streaming).
    async fn items(&self, req: ItemsReq) -> Result<ItemStream<Bytes>, Status>;
}

/// What a server stream is asked for: plain data, sent as its 16 bytes.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct ItemsReq {
    pub count: u64,
    pub size: u64,
}
volley::wire!(pod: ItemsReq);

struct Echoer;

impl Echo for Echoer {
    async fn echo(&self, payload: Bytes) -> Result<Bytes, Status> {
        Ok(payload)
    }

    async fn echo_all(&self, payloads: Vec<Bytes>) -> Vec<Result<Bytes, Status>> {
        payloads.into_iter().map(Ok).collect()
    }

    async fn items(&self, req: ItemsReq) -> Result<ItemStream<Bytes>, Status> {
        let item = payload(req.size as usize);
        Ok(futures::stream::repeat(item).take(req.count as usize).map(Ok).boxed())
    }
}

/// Starts the server on `addr` (`tcp://127.0.0.1:0`, `unix:///…`, `inproc://…`) and returns
/// it with the address actually bound.
pub async fn serve(addr: &str) -> Result<(Server, String), String> {
    let server = Server::builder().serve(EchoServer::new(Echoer)).build();
    let bound = server.listen(addr).await.map_err(|e| e.to_string())?;
    Ok((server, bound.to_string()))
}

pub async fn stop(server: Server) {
    if !server.shutdown_within(Duration::from_secs(2)).await {
        eprintln!("volley server did not shut down within 2 s");
    }
}

#[derive(Clone)]
pub struct VolleyCaller(pub EchoClient);

pub async fn connect(addr: &str) -> Result<VolleyCaller, String> {
    Client::connect(addr).await.map(|c| VolleyCaller(EchoClient::new(c))).map_err(|e| e.to_string())
}

impl Caller for VolleyCaller {
    async fn call(&mut self, payload: Bytes) -> Result<usize, String> {
        self.0.echo(payload).await.map(|r| r.len()).map_err(|e| e.to_string())
    }
}

/// `n` requests through the batch API: one stream (`call_batch_stream` underneath), which
/// cuts them into chunks (one `BatchRequest` message each over unix/tcp) and keeps `window`
/// chunks in flight; to the batch handler (`echo_all`) or the per-request one (`echo`).
pub async fn batch(
    client: &VolleyCaller,
    to_batch_handler: bool,
    n: u64,
    chunk: usize,
    window: usize,
    size: usize,
) -> Sample {
    let body = payload(size);
    let opts = BatchOptions::default().chunk_size(chunk).window(window);
    let reqs = (0..n).map(move |_| body.clone());
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let (ok, errors, first_error) = if to_batch_handler {
        count(client.0.echo_all_stream(reqs, opts), size).await
    } else {
        count(client.0.echo_stream(reqs, opts), size).await
    };
    batch_sample(ok, errors, first_error, start.elapsed().as_secs_f64(), cpu)
}

/// Replies of `size` bytes, other outcomes, and the first of those.
async fn count(
    results: impl Stream<Item = volley::Result<Bytes>>,
    size: usize,
) -> (u64, u64, Option<String>) {
    let (mut ok, mut errors, mut first_error) = (0, 0, None);
    let mut results = std::pin::pin!(results);
    while let Some(r) = results.next().await {
        match r {
            Ok(reply) if reply.len() == size => ok += 1,
            Ok(reply) => {
                errors += 1;
                first_error.get_or_insert(format!("reply of {} bytes, sent {size}", reply.len()));
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    (ok, errors, first_error)
}

/// `streams` server streams at once on the one connection, each of `per_stream` items of
/// `size` bytes with a credit window of `window` items, read to their ends.
pub async fn server_streams(
    client: &VolleyCaller,
    streams: usize,
    per_stream: u64,
    size: usize,
    window: u32,
) -> Sample {
    let opts = StreamOptions::default().window(window);
    let req = ItemsReq { count: per_stream, size: size as u64 };
    crate::load::streams(streams, per_stream, |_| {
        let client = client.clone();
        async move {
            match client.0.items_with(req, opts).await {
                Ok(items) => count(items, size).await,
                Err(e) => (0, per_stream, Some(e.to_string())),
            }
        }
    })
    .await
}
