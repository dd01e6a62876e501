//! The Rust client's driver for the client side of the suite
//! ([`client_side`](crate::client_side) says how a driver and the runner talk).

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use volley::{Client, ClientConfig, Error, Method};

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

fn result(r: &Result<Bytes, Error>) -> Value {
    match r {
        Ok(payload) => json!({"ok": hex(payload)}),
        Err(Error::Remote(status)) => json!({"code": status.code.to_u16()}),
        Err(e @ Error::Timeout(_)) => json!({"timeout": e.to_string()}),
        Err(e) => json!({"failed": e.to_string()}),
    }
}
