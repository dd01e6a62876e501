//! The calls every process makes to the registry.
//!
//! - [`Registry`] — a connection to a controller (or to one of a list, with failover): register
//!   under a lease, resolve, watch, list; connecting to
//!   [`DEFAULT_REGISTRY`](crate::discovery::DEFAULT_REGISTRY) starts the process's embedded
//!   controller if nothing serves it yet.
//! - [`Registration`] — a server's instances under a lease that a task renews (and rebuilds
//!   after a controller restart) and revokes when the server shuts down.
//!
//! The messages are in [`discovery`](crate::discovery), the controller that answers them in
//! [`controller`](crate::controller), and the client that calls services by name on top of this
//! is [`ServiceClient`](crate::ServiceClient). `docs/ARCHITECTURE.md` (Registry) explains the
//! design; `docs/PROTOCOL.md` §16 specifies the methods and messages.

mod connection;
mod registration;

pub use connection::{Registry, RegistryStats};
pub use registration::{LeaseConfig, Registration};
