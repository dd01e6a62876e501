//! Metrics kept by the library: per (service, method) on servers and clients, per server
//! (connections, transport, overload), and the registry's when the server is a controller, and the transport counters of every
//! connection.
//!
//! - `histogram.rs` — the lock-free histogram recorded on every call or batch;
//! - `method.rs` — one method's counters and histograms, and the client's per-call meter;
//! - `client.rs` — the process-wide table of the methods this process calls;
//! - `stats.rs` — a connection's transport counters and their shapes (messages per frame);
//! - `identity.rs` — which process an admin endpoint belongs to (the status page's header);
//! - `scrape.rs` — everything read at one moment (what `/metrics` and `/vars.json` show), and
//!   the traits through which the server and the controller hand over their sections;
//! - `prometheus.rs` — a scrape in the Prometheus text format (the `prometheus-client` crate's
//!   encoder); `vars.rs` — a scrape as JSON, with rates and quantiles over the last seconds.
//!
//! Recording costs a few relaxed atomic adds and (per call on a client, per handler batch on a
//! server) two reads of the TSC clock (`quanta`); ARCHITECTURE.md has the choice and
//! BENCHMARKS.md the measured cost. [`ServerConfig::metrics`](crate::ServerConfig) and
//! [`ClientConfig::metrics`](crate::ClientConfig) turn it off.

pub(crate) mod client;
pub(crate) mod histogram;
pub(crate) mod identity;
pub(crate) mod method;
pub(crate) mod prometheus;
pub(crate) mod scrape;
pub(crate) mod stats;
pub(crate) mod vars;

pub(crate) use method::{CallMeter, Meter, MethodMetrics, Timing};
pub use scrape::{ConnectionCounts, StreamCounts};
