//! The controller: a Volley [`Server`](crate::Server) that serves the registry protocol
//! ([`discovery::wire`](crate::discovery::wire)) — leases, instances by service, watches (long
//! polls), client ids, and the relay of relayed mode — over a [`Store`] ([`MemoryStore`] here;
//! the `volley-etcd` crate has one over etcd, so that several controllers act as one registry).
//! Embedded by default ([`embedded`], started on first use of
//! [`DEFAULT_REGISTRY`](crate::discovery::DEFAULT_REGISTRY)) or standalone
//! (`volley controller --listen ADDR`).
//!
//! - `server.rs` — [`Controller`], its settings and counters, and the registry's methods;
//! - `relay.rs` — relayed calls, forwarded to instances through pools of its own;
//! - `store.rs` — the [`Store`] trait and the [`MemoryStore`];
//! - `bounds.rs` — the held watches, relays in flight and sizes it bounds;
//! - `client_ids.rs` — which connections hold which client ids;
//! - `shrink.rs` — hash tables that give their room back once a flood has gone;
//! - `embedded.rs` — the process's embedded controller.

mod bounds;
mod client_ids;
mod embedded;
mod relay;
mod server;
mod shrink;
mod store;

pub use embedded::embedded;
pub use server::{Controller, ControllerConfig, ControllerStats};
pub use store::{MemoryStore, Renewal, ServiceState, Store, StoreError, StoreLimits, StoreStatus};
