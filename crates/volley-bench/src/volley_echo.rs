//! The echo service in Volley: the same handler as `volley serve-echo` (`volley-cli`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use volley::{BatchOptions, Client, Method, Server};

use crate::load::{Caller, CpuMeter, Sample, batch_sample, payload};

/// `echo/echo`: returns its payload.
pub const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");

/// `echo/echo_batch`: the same echo served by a batch handler (`ServerBuilder::handle_batch`),
/// which gets every request that arrived together as one `Vec` — Volley's way to serve batches
/// without a future per request. Used only by the batch scenario, as a second Volley method.
pub const ECHO_BATCH: Method<Bytes, Bytes> = Method::new("echo", "echo_batch");

/// Starts the server on `addr` (`tcp://127.0.0.1:0`, `unix:///…`, `inproc://…`) and returns
/// it with the address actually bound.
pub async fn serve(addr: &str) -> Result<(Server, String), String> {
    let server = Server::builder()
        .handle(&ECHO, |b: Bytes| async move { Ok(b) })
        .handle_batch(&ECHO_BATCH, |reqs: Vec<Bytes>| async move { reqs.into_iter().map(Ok).collect() })
        .build();
    let bound = server.listen(addr).await.map_err(|e| e.to_string())?;
    Ok((server, bound.to_string()))
}

pub async fn stop(server: Server) {
    if !server.shutdown_within(Duration::from_secs(2)).await {
        eprintln!("volley server did not shut down within 2 s");
    }
}

#[derive(Clone)]
pub struct VolleyCaller(pub Client);

pub async fn connect(addr: &str) -> Result<VolleyCaller, String> {
    Client::connect(addr).await.map(VolleyCaller).map_err(|e| e.to_string())
}

impl Caller for VolleyCaller {
    async fn call(&mut self, payload: Bytes) -> Result<usize, String> {
        self.0.call(&ECHO, payload).await.map(|r| r.len()).map_err(|e| e.to_string())
    }
}

/// `n` requests for `method` through the batch API: one `call_batch_stream`, which cuts them
/// into chunks (one `BatchRequest` message each over unix/tcp) and keeps `window` chunks in
/// flight.
pub async fn batch(
    client: &VolleyCaller,
    method: &Method<Bytes, Bytes>,
    n: u64,
    chunk: usize,
    window: usize,
    size: usize,
) -> Sample {
    let body = payload(size);
    let opts = BatchOptions::default().chunk_size(chunk).window(window);
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let (mut ok, mut errors, mut first_error) = (0, 0, None);
    let mut results = client.0.call_batch_stream(method, (0..n).map(|_| body.clone()), opts);
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
    batch_sample(ok, errors, first_error, start.elapsed().as_secs_f64(), cpu)
}
