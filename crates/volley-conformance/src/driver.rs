//! The Rust client's driver for the client side of the suite
//! ([`client_side`](crate::client_side) says how a driver and the runner talk).

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use volley::{
    BidiStreamMethod, Client, ClientConfig, ClientStreamMethod, Error, Method, StreamMethod, StreamOptions,
    Streaming,
};

use crate::client_side::CONTROL;
use crate::json::{hex, unhex};

const NEXT: Method<Bytes, Bytes> = Method::new(CONTROL, "next");
const REPORT: Method<Bytes, Bytes> = Method::new(CONTROL, "report");

/// Plays every case the runner at `addr` hands out with the Rust [`Client`], each call with
/// `call_timeout`; returns the cases whose reports the runner refused (empty: all passed).
pub async fn drive(addr: &str, call_timeout: Duration) -> Result<Vec<String>, Error> {
    let control = Client::connect(addr).await?;
    let mut refused = Vec::new();
    loop {
        let case = control.call(&NEXT, Bytes::new()).await?;
        if case.is_empty() {
            return Ok(refused);
        }
        let call: Value = serde_json::from_slice(&case).map_err(|e| Error::Decode(e.to_string()))?;
        let outcome = play(addr, &call, call_timeout).await;
        match control.call(&REPORT, Bytes::from(outcome.to_string())).await {
            Ok(_) => {}
            Err(Error::Remote(status)) => refused.push(format!("{}: {}", call["name"], status.message)),
            Err(e) => return Err(e),
        }
    }
}

/// Makes one case's call on a client of its own and describes how it ended (the JSON of a
/// report).
pub async fn play(addr: &str, call: &Value, call_timeout: Duration) -> Value {
    let text = |f: &str| call[f].as_str().unwrap_or_default();
    // Method names are 'static; a run leaks the few bytes of its cases' names.
    let name = |f: &str| -> &'static str { Box::leak(text(f).to_string().into_boxed_str()) };
    let method: Method<Bytes, Bytes> = Method::new(name("service"), name("method"));
    let config = ClientConfig::default().timeout(call_timeout);
    let client = match Client::connect_with(addr, config).await {
        Ok(c) => c,
        Err(e) => return json!({"failed": format!("connecting: {e}")}),
    };
    if let Some(shape) = call.get("stream").and_then(Value::as_str) {
        let outcome = stream(&client, shape, call).await;
        drop(client);
        return outcome;
    }
    let outcome = match call.get("items").and_then(Value::as_array) {
        Some(items) => {
            let items = items.iter().map(|i| Bytes::from(unhex(i.as_str().unwrap_or_default())));
            json!({"items": client.call_batch(&method, items).await.iter().map(result).collect::<Vec<_>>()})
        }
        None => result(&client.call(&method, Bytes::from(unhex(text("payload")))).await),
    };
    drop(client); // closes its connection: the next case gets a fresh one
    outcome
}

/// Plays a stream case's call (crate::client_streams says what its fields ask).
async fn stream(client: &Client, shape: &str, call: &Value) -> Value {
    let text = |f: &str| call[f].as_str().unwrap_or_default();
    let name = |f: &str| -> &'static str { Box::leak(text(f).to_string().into_boxed_str()) };
    let (service, method) = (name("service"), name("method"));
    let mut opts = StreamOptions::default();
    if let Some(w) = call.get("window").and_then(Value::as_u64) {
        opts = opts.window(w as u32);
    }
    if let Some(ms) = call.get("timeout_ms").and_then(Value::as_u64) {
        opts = opts.timeout(Duration::from_millis(ms));
    }
    let sends: Vec<Bytes> = call["send"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| Bytes::from(unhex(i.as_str().unwrap_or_default())))
        .collect();
    let take = call.get("take").and_then(Value::as_u64).map(|n| n as usize);
    let mut outcome = match shape {
        "client" => {
            let m: ClientStreamMethod<Bytes, Bytes> = ClientStreamMethod::new(service, method);
            match client.open_client_stream(&m, opts).await {
                Ok(upload) => result(&upload.send_all(futures_util::stream::iter(sends)).await),
                Err(e) => result(&Err(e)),
            }
        }
        "both" => {
            let m: BidiStreamMethod<Bytes, Bytes> = BidiStreamMethod::new(service, method);
            match client.open_bidi_stream(&m, opts).await {
                Ok((sender, items)) => {
                    read(items.fed_by(sender, futures_util::stream::iter(sends)), take).await
                }
                Err(e) => json!({"items": [], "end": result(&Err(e))}),
            }
        }
        _ => {
            let m: StreamMethod<Bytes, Bytes> = StreamMethod::new(service, method);
            match client.open_stream_with(&m, Bytes::from(unhex(text("payload"))), opts).await {
                Ok(items) => read(items, take).await,
                Err(e) => json!({"items": [], "end": result(&Err(e))}),
            }
        }
    };
    if let Some(then) = call.get("then_call") {
        let t = |f: &str| then[f].as_str().unwrap_or_default();
        let leak = |f: &str| -> &'static str { Box::leak(t(f).to_string().into_boxed_str()) };
        let m: Method<Bytes, Bytes> = Method::new(leak("service"), leak("method"));
        outcome["then"] = result(&client.call(&m, Bytes::from(unhex(t("payload")))).await);
    }
    outcome
}

/// Reads a stream's items to its end, or `take` of them and then drops it.
async fn read(mut items: Streaming<Bytes>, take: Option<usize>) -> Value {
    let mut got = Vec::new();
    let end = loop {
        if take == Some(got.len()) {
            drop(items);
            break json!("dropped");
        }
        match items.next().await {
            Some(Ok(item)) => got.push(json!({"ok": hex(&item)})),
            Some(Err(e)) => break result(&Err(e)),
            None => break json!("ok"),
        }
    };
    json!({"items": got, "end": end})
}

fn result(r: &Result<Bytes, Error>) -> Value {
    match r {
        Ok(payload) => json!({"ok": hex(payload)}),
        Err(Error::Remote(status)) => json!({"code": status.code.to_u16()}),
        Err(e @ Error::Timeout(_)) => json!({"timeout": e.to_string()}),
        Err(e) => json!({"failed": e.to_string()}),
    }
}
