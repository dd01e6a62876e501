//! # Volley
//!
//! Service messaging with batching built in. Processes (or components inside one process)
//! offer named services and call each other with typed requests — one at a time or in large
//! batches — over in-process queues, Unix sockets or TCP, with the same API.
//!
//! ```
//! use volley::{Client, Method, Server};
//!
//! const ECHO: Method<String, String> = Method::new("echo", "say");
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> volley::Result<()> {
//! let server = Server::builder().handle(&ECHO, |s: String| async move { Ok(s) }).build();
//! server.listen("inproc://doc-echo").await?; // or unix:///tmp/echo.sock, tcp://127.0.0.1:7000
//!
//! let client = Client::connect("inproc://doc-echo").await?;
//! assert_eq!(client.call(&ECHO, "hi".to_string()).await?, "hi");
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Layers, bottom up: [`proto`] (sans-IO wire format), [`transport`] (inproc, unix, tcp;
//! send-side bundling and batch reads), [`codec`] (how values become bytes), then
//! [`Client`] and [`Server`]; on top, the [`registry`] (controller, leases, watches, client
//! ids) and [`ServiceClient`] (calls by service name: balancing, key routing, failover,
//! scatter-gather). `docs/ARCHITECTURE.md` tells the whole story.

pub mod client;
pub mod codec;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod method;
pub mod pool;
pub mod proto;
pub mod registry;
pub mod server;
pub mod stats;
pub mod transport;

pub use bitcode;
pub use bytemuck;
pub use bytes;
pub use client::{BatchOptions, BatchStream, CallOptions, Client, ClientConfig};
pub use codec::{ByteString, CodecError, PodVec, StableHash, Tier, Wire};
pub use error::{Error, ErrorClass, Result, Status};
pub use method::Method;
pub use proto::Code;
pub use registry::{Registry, ServiceClient};
pub use server::{Keepalive, Server, ServerBuilder, ServerConfig};
pub use stats::Snapshot;
pub use transport::Address;
