//! A [`Scrape`] as the JSON of `/vars.json`: totals since the start, and for each method its
//! rates and quantiles over the last few seconds (what the status page and `volley top` show),
//! from snapshots taken once a second.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use serde_json::{Value, json};

use super::histogram::Snapshot;
use super::method::{ERROR_LABELS, MethodSnapshot};
use super::scrape::{Named, Scrape, ServiceRow};

/// Snapshots kept: the window of recent rates is up to this many seconds.
const WINDOW: usize = 5;

type Key = (&'static str, Arc<str>, Arc<str>);

/// The methods' snapshots of the last seconds.
#[derive(Default)]
pub(crate) struct Window {
    history: Mutex<VecDeque<(Instant, FxHashMap<Key, MethodSnapshot>)>>,
}

impl Window {
    /// Keeps the methods of `scrape` as the newest snapshot.
    pub(crate) fn record(&self, scrape: &Scrape) {
        let now: FxHashMap<Key, MethodSnapshot> = sides(scrape)
            .flat_map(|(side, list)| list.iter().map(move |n| (key(side, n), n.snap.clone())))
            .collect();
        let mut h = self.history.lock();
        if h.len() > WINDOW {
            h.pop_front();
        }
        h.push_back((Instant::now(), now));
    }

    /// The scrape as JSON, each method with its recent rates.
    pub(crate) fn render(&self, scrape: &Scrape) -> Value {
        let h = self.history.lock();
        let oldest = h.front();
        let methods = |side: &'static str, list: &[Named]| -> Vec<Value> {
            list.iter()
                .map(|n| {
                    let then =
                        oldest.and_then(|(at, m)| Some((at.elapsed().as_secs_f64(), m.get(&key(side, n))?)));
                    method(n, then)
                })
                .collect()
        };
        let sv = &scrape.server;
        let t = &sv.transport;
        json!({
            "uptime_s": scrape.uptime.as_secs_f64(),
            "process": scrape.identity.json(),
            "server": {
                "metrics": sv.per_method,
                "connections": {
                    "open": sv.connections.served,
                    "opening": sv.connections.opening,
                    "accepted": sv.accepted,
                    "refused": sv.refused,
                    "evicted": sv.connections.opening_evicted,
                },
                "transport": t,
                "messages_per_frame": { "read": mean(&sv.per_frame_read), "written": mean(&sv.per_frame_written) },
                "reader_wakeups": {
                    "batches": sv.wakeups_per_batch.count(),
                    "wakeups": sv.wakeups_per_batch.sum(),
                    "per_batch": mean(&sv.wakeups_per_batch),
                },
                "overload_refusals": sv.overload_refusals,
                "deadline_expired": sv.expiries,
                "cancelled_requests": sv.cancelled,
                "queued_requests": sv.queued,
                "streams": {
                    "opened": sv.streams.opened,
                    "open": sv.streams.open(),
                    "items": sv.streams.items,
                    "ended": sv.streams.ended.iter().map(|(r, n)| (r.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
                },
                "receive_budget": { "held_bytes": sv.receive_held, "bytes": sv.receive_budget },
                "concurrency_limit": sv.concurrency.map(|(limit, in_flight)| json!({
                    "limit": limit, "in_flight": in_flight,
                })),
                "methods": methods("server", &sv.methods),
            },
            "client": { "methods": methods("client", &scrape.client) },
            "registry": scrape.registry.as_ref().map(|r| json!({
                "services": r.services.iter().map(service).collect::<Vec<_>>(),
                "stats": r.stats,
            })),
        })
    }
}

/// A service as the registry lists it, ids as strings: they are random 64-bit numbers, which
/// JavaScript's numbers (the status page's) would round.
fn service(s: &ServiceRow) -> Value {
    let instances: Vec<Value> = s
        .instances
        .iter()
        .map(|i| {
            json!({
                "instance": {
                    "id": i.id.to_string(), "lease": i.lease.to_string(), "service": i.service,
                    "address": i.address, "weight": i.weight, "metadata": i.metadata,
                },
                "lease_ttl_ms": i.lease_ttl_ms,
                "expires_in_ms": i.expires_in_ms,
            })
        })
        .collect();
    json!({ "name": s.name, "revision": s.revision, "instances": instances })
}

fn sides(s: &Scrape) -> impl Iterator<Item = (&'static str, &Vec<Named>)> {
    [("server", &s.server.methods), ("client", &s.client)].into_iter()
}

fn key(side: &'static str, n: &Named) -> Key {
    (side, n.service.clone(), n.method.clone())
}

/// One method: totals, and rates over the `seconds` since the snapshot `then`.
fn method(n: &Named, then: Option<(f64, &MethodSnapshot)>) -> Value {
    let s = &n.snap;
    let errors: serde_json::Map<String, Value> = s
        .errors
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, c)| (ERROR_LABELS[i].to_string(), json!(c)))
        .collect();
    let recent = then.filter(|(secs, _)| *secs > 0.0).map(|(secs, old)| {
        let latency = s.latency.since(&old.latency);
        let batch = s.batch.since(&old.batch);
        json!({
            "seconds": secs,
            "calls_per_s": s.calls.saturating_sub(old.calls) as f64 / secs,
            "errors_per_s": s.error_total().saturating_sub(old.error_total()) as f64 / secs,
            "latency_us": latency_us(&latency),
            "batch": batch_sizes(&batch),
        })
    });
    json!({
        "service": &*n.service,
        "method": &*n.method,
        "calls": s.calls,
        "errors": errors,
        "error_total": s.error_total(),
        "in_flight": s.in_flight,
        "latency_us": latency_us(&s.latency),
        "batch": batch_sizes(&s.batch),
        "recent": recent,
    })
}

fn mean(h: &Snapshot) -> Option<f64> {
    let n = h.count();
    (n > 0).then(|| h.sum() as f64 / n as f64)
}

fn latency_us(h: &Snapshot) -> Value {
    let q = |q: f64| h.quantile(q).map(|ns| ns as f64 / 1000.0);
    json!({
        "count": h.count(),
        "mean": mean(h).map(|ns| ns / 1000.0),
        "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999),
    })
}

fn batch_sizes(h: &Snapshot) -> Value {
    json!({ "count": h.count(), "mean": mean(h), "p50": h.quantile(0.5), "p99": h.quantile(0.99) })
}
