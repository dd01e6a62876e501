//! What the registry knows and says: the instances of a service, the leases they live under,
//! and the methods and messages of the registry protocol (service `volley.registry`,
//! docs/PROTOCOL.md §16) — shared by the controller that serves it ([`controller`](crate::controller)),
//! the processes that call it ([`registry`](crate::registry)) and the clients that balance over
//! what it lists ([`balance`](crate::balance), [`ServiceClient`](crate::ServiceClient)).
//!
//! - [`wire`] — the methods and their message types ([`Instance`], [`InstanceSpec`],
//!   [`Resolved`], [`Listing`] ...), and the relay's envelope;
//! - [`host_id`] — which host this process runs on, for same-host addresses.

mod host;
pub mod wire;

use std::time::Duration;

pub use host::{HOST_ID_ENV, host_id};
pub use wire::{ControllerInfo, Instance, InstanceSpec, Listing, Resolved};

/// Where the embedded controller listens: a process needs no other registry when every role
/// lives in it.
pub const DEFAULT_REGISTRY: &str = "inproc://volley-registry";

/// Default lease time. Servers renew every third of it; a crashed server disappears from the
/// registry within it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
