//! # Volley
//!
//! Service messaging with batching built in. Processes (or components inside one process)
//! offer named services and call each other with typed requests — one at a time or in large
//! batches — over in-process queues, Unix sockets or TCP, with the same API.
//!
//! ```
//! use volley::{Client, Server, Status};
//!
//! /// A service is a trait; the attribute writes the typed client and the server glue.
//! #[volley::service]
//! trait Echo {
//!     async fn say(&self, s: String) -> Result<String, Status>;
//! }
//!
//! struct Loud;
//! impl Echo for Loud {
//!     async fn say(&self, s: String) -> Result<String, Status> {
//!         Ok(s.to_uppercase())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> volley::Result<()> {
//! let server = Server::builder().serve(EchoServer::new(Loud)).build();
//! server.listen("inproc://doc-echo").await?; // or unix:///tmp/echo.sock, tcp://127.0.0.1:7000
//!
//! let echo = EchoClient::new(Client::connect("inproc://doc-echo").await?);
//! assert_eq!(echo.say("hi".to_string()).await?, "HI");
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Below the traits, a method is a typed descriptor, [`Method<Req, Resp>`](Method), and a
//! handler a closure: `Server::builder().handle(&EchoMethods::SAY, |s: String| async move {
//! Ok(s) })`, `client.call(&EchoMethods::SAY, s)`. The generated code is made of exactly these
//! calls, and they remain available for anything the traits do not cover.
//!
//! Layers, bottom up: the sans-IO wire format (`proto`, docs/PROTOCOL.md), [`transport`]
//! (inproc, unix, tcp, tls; send-side bundling and batch reads), [`codec`] (how values become
//! bytes), then
//! [`Client`] and [`Server`]; on top, [`#[volley::service]`](macro@service) (services as
//! traits, with [`service`](mod@service) for what it generates code against); the registry's
//! protocol ([`discovery`]), the [`controller`] that serves it (leases, watches, client ids,
//! the relay) and the calls every process makes to it ([`registry`]); and [`ServiceClient`]
//! (calls by service name: [`balance`] — balancing, key routing, outlier ejection — and
//! [`retry`] — failover, retries under a budget, hedging — and scatter-gather). `docs/ARCHITECTURE.md` tells the whole
//! story; `docs/SERVICES.md` is the guide to services.

mod admin;
mod backoff;
pub mod balance;
mod chunks;
mod client;
pub mod codec;
mod context;
pub mod controller;
pub mod discovery;
mod error;
pub mod health;
mod liveness;
mod method;
mod metrics;
pub mod reflect;
pub mod registry;
pub mod retry;
mod server;
pub mod service;
pub mod service_client;
mod trace;
pub mod transport;

/// OpenTelemetry for Volley's spans (feature `otel`).
#[cfg(feature = "otel")]
pub mod otel;

// The wire format's building blocks, the memory pools and the fuzz entry points: public only
// with the feature `internals`, for the project's own tests, benchmarks, fuzz targets and
// tools, with no promise of stability. Everything an application needs is re-exported below.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "internals")]
pub mod pool;
#[cfg(not(feature = "internals"))]
mod pool;
#[cfg(feature = "internals")]
pub mod proto;
#[cfg(not(feature = "internals"))]
mod proto;

pub use bitcode;
pub use bytemuck;
pub use bytes;
pub use client::{
    BatchOptions, BatchStream, CallOptions, Client, ClientConfig, StreamOptions, StreamSender, Streaming,
    Upload,
};
pub use codec::{ByteString, CodecError, PodVec, StableHash, Tier, Wire};
pub use context::current_deadline;
pub use error::{Error, ErrorClass, Result, Status};
pub use liveness::Keepalive;
pub use method::{BidiStreamMethod, ClientStreamMethod, Method, StreamMethod};
pub use metrics::stats::Snapshot;
/// The protobuf crate of `wire!(proto: T)` (feature `proto`).
#[cfg(feature = "proto")]
pub use prost;
pub use proto::{Code, Extensions, Limits, ProtocolError, TraceParent};
pub use registry::Registry;
/// The JSON Schema crate `volley.reflect` uses (feature `schema`).
#[cfg(feature = "schema")]
pub use schemars;
pub use server::{
    BatchResult, ConcurrencyLimit, ConnectionCounts, Drain, Incoming, Server, ServerBuilder, ServerConfig,
    StopSignal, StreamCounts, current_peer, shutdown_signal,
};
pub use service_client::ServiceClient;
pub use transport::Address;

/// The guide's examples (docs/SERVICES.md) run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/SERVICES.md")]
pub struct ServicesGuide;
#[doc = include_str!("service/macro.md")]
pub use volley_macros::service;
