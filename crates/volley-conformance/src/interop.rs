//! Calls from the Rust client to a server of another implementation (and the Rust server the
//! other implementations' clients call): the shapes of real traffic that the byte-level cases
//! do not cover — payloads up to 1 MiB compared byte for byte, 1,000 pipelined calls, a batch
//! of 10,000 items with failures in place, unknown names, a bad token.
//!
//! The server under test serves `echo`/`echo` (the payload back) and `echo`/`fail_odd` (the
//! payload back when its first byte is even or it is empty, else an `Application` error).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::task::JoinSet;
use volley::{Client, ClientConfig, Code, Error, Method, Server, Status};

use crate::Report;

pub const ECHO: Method<Bytes, Bytes> = Method::new("echo", "echo");
pub const FAIL_ODD: Method<Bytes, Bytes> = Method::new("echo", "fail_odd");

/// `echo`/`fail_odd`: the payload back when its first byte is even (or it is empty).
pub fn fail_odd(payload: Bytes) -> Result<Bytes, Status> {
    match payload.first() {
        Some(b) if b % 2 == 1 => Err(Status::app(format!("{b} is odd"))),
        _ => Ok(payload),
    }
}

/// The Rust server of the interop contract, requiring `token` if given.
pub fn reference_server(token: Option<&str>) -> Server {
    let builder = Server::builder().handle_fn(&ECHO, Ok).handle_fn(&FAIL_ODD, fail_odd);
    match token {
        Some(t) => builder.token(t).build(),
        None => builder.build(),
    }
}

/// Runs every check against the server at `addr`; with `token` (which the server requires),
/// also checks that a wrong token and none are refused.
pub async fn check(addr: &str, token: Option<&str>) -> Report {
    let mut report = Report::default();
    let config = |t: Option<&str>| {
        let c = ClientConfig::default().timeout(Duration::from_secs(60));
        match t {
            Some(t) => c.token(t.as_bytes().to_vec()),
            None => c,
        }
    };
    let client = match Client::connect_with(addr, config(token)).await {
        Ok(c) => c,
        Err(e) => {
            report.cases.push(("connect".into(), Err(e.to_string())));
            return report;
        }
    };
    report.cases.push(("random payloads of 0 to 1 MiB, byte for byte".into(), payloads(&client).await));
    report.cases.push(("1,000 pipelined calls".into(), pipelined(&client).await));
    report.cases.push(("a batch of 10,000 with failures in place".into(), batch(&client).await));
    report.cases.push(("unknown service and method".into(), unknown_names(&client).await));
    if token.is_some() {
        let mut refused = Ok(());
        for bad in [Some("wrong token"), None] {
            let result = match Client::connect_with(addr, config(bad)).await {
                Ok(c) => c.call(&ECHO, Bytes::from_static(b"x")).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if !matches!(&result, Err(e) if is_unauthenticated(e)) {
                refused = Err(format!("token {bad:?}: expected Unauthenticated, got {result:?}"));
            }
        }
        report.cases.push(("a bad token and none are refused".into(), refused));
    }
    report
}

fn is_unauthenticated(e: &Error) -> bool {
    matches!(e, Error::Unauthenticated(_)) || e.code() == Some(Code::Unauthenticated)
}

/// Random bytes from a xorshift seeded by the clock: different inputs every run.
fn random_bytes(n: usize, state: &mut u64) -> Bytes {
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(n);
    Bytes::from(out)
}

async fn payloads(client: &Client) -> Result<(), String> {
    let mut state = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    let mut sizes = vec![0, 1, 2, 255, 4096, 65_535, 65_536, 1 << 20];
    for _ in 0..8 {
        sizes.push(random_bytes(4, &mut state).iter().fold(0usize, |a, b| a << 8 | *b as usize) % (1 << 20));
    }
    for n in sizes {
        let payload = random_bytes(n, &mut state);
        let reply = client.call(&ECHO, payload.clone()).await.map_err(|e| format!("{n} bytes: {e}"))?;
        if reply != payload {
            return Err(format!("{n} bytes: the reply differs ({} bytes)", reply.len()));
        }
    }
    Ok(())
}

async fn pipelined(client: &Client) -> Result<(), String> {
    let mut calls = JoinSet::new();
    for i in 0..1000u32 {
        let client = client.clone();
        let payload = Bytes::from(i.to_le_bytes().repeat(i as usize % 9));
        calls.spawn(async move { (client.call(&ECHO, payload.clone()).await, payload) });
    }
    let mut ended = 0;
    while let Some(joined) = calls.join_next().await {
        let (reply, payload) = joined.map_err(|e| e.to_string())?;
        if reply.as_ref() != Ok(&payload) {
            return Err(format!("sent {payload:?}, got {reply:?}"));
        }
        ended += 1;
    }
    if ended == 1000 { Ok(()) } else { Err(format!("{ended} of 1000 calls ended")) }
}

async fn batch(client: &Client) -> Result<(), String> {
    let items: Vec<Bytes> = (0..10_000u32).map(|i| Bytes::from(i.to_le_bytes().to_vec())).collect();
    let results = client.call_batch(&FAIL_ODD, items.clone()).await;
    if results.len() != items.len() {
        return Err(format!("{} results for {} items", results.len(), items.len()));
    }
    for (i, (item, result)) in items.iter().zip(&results).enumerate() {
        let good = match result {
            Ok(reply) => i % 2 == 0 && reply == item,
            Err(e) => i % 2 == 1 && e.code() == Some(Code::Application),
        };
        if !good {
            return Err(format!("item {i}: {result:?}"));
        }
    }
    Ok(())
}

async fn unknown_names(client: &Client) -> Result<(), String> {
    let service = client.call(&Method::<Bytes, Bytes>::new("no-such-service", "echo"), Bytes::new()).await;
    let method = client.call(&Method::<Bytes, Bytes>::new("echo", "no-such-method"), Bytes::new()).await;
    match (service.as_ref().map_err(Error::code), method.as_ref().map_err(Error::code)) {
        (Err(Some(Code::UnknownService)), Err(Some(Code::UnknownMethod))) => Ok(()),
        _ => Err(format!("expected UnknownService and UnknownMethod, got {service:?} and {method:?}")),
    }
}
