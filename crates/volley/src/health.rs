//! The health protocol: the service `volley.health` that every server answers, and its
//! messages.
//!
//! A caller asks whether a server (or one of its services) takes new calls: `check` answers
//! now, `watch` answers when the answer changes (a long poll, as the registry's watch). An
//! orchestrator asks the same over HTTP on the admin endpoint (`/readyz`); this is for callers
//! that already speak Volley: `volley health`, the [`ServiceClient`](crate::ServiceClient)'s
//! probe of an instance it left out, and peers in other languages. The messages are JSON, as
//! the registry's, so that any language reads them. `docs/PROTOCOL.md` §20 specifies them.

use serde::{Deserialize, Serialize};

use crate::method::Method;

/// The service name every server answers health questions under.
pub const SERVICE: &str = "volley.health";

/// Whether the server (the empty service name) or one of its services takes new calls, now.
/// An unknown service is answered `UnknownService`.
pub const CHECK: Method<HealthRequest, Health> = Method::new(SERVICE, "check");

/// Long poll: answers as soon as the status differs from the caller's `last`, or at its
/// timeout with the status unchanged. Callers re-issue it in a loop.
pub const WATCH: Method<HealthWatch, Health> = Method::new(SERVICE, "watch");

/// Longest a watch is held (a longer `timeout_ms` is cut to it).
pub const MAX_WATCH: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a service takes new calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Serving {
    /// It takes new calls.
    Serving,
    /// It does not (its owner said so, a listener failed, or its registration lapsed); it
    /// still answers calls it gets.
    NotServing,
    /// The server is leaving: calls sent now may be refused, and a caller should pick another
    /// instance.
    Draining,
}

impl Serving {
    /// The name on the wire (`serving`, `not_serving`, `draining`).
    pub fn as_str(self) -> &'static str {
        match self {
            Serving::Serving => "serving",
            Serving::NotServing => "not_serving",
            Serving::Draining => "draining",
        }
    }
}

impl std::fmt::Display for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The question of `check`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthRequest {
    /// The service asked about; empty: the server as a whole.
    #[serde(default)]
    pub service: String,
}

impl HealthRequest {
    /// About one service.
    pub fn service(name: impl Into<String>) -> Self {
        HealthRequest { service: name.into() }
    }

    /// About the server as a whole.
    pub fn server() -> Self {
        HealthRequest::default()
    }
}

/// The question of `watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthWatch {
    /// The service asked about; empty: the server as a whole.
    #[serde(default)]
    pub service: String,
    /// The status the caller knows; `None` answers at once.
    #[serde(default)]
    pub last: Option<Serving>,
    /// How long to hold the question when nothing changes (milliseconds; at most
    /// [`MAX_WATCH`]; 0 answers at once).
    #[serde(default = "default_watch_ms")]
    pub timeout_ms: u64,
}

fn default_watch_ms() -> u64 {
    30_000
}

/// An answer: the status, and why when it is not `serving`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: Serving,
    /// Why the service does not take new calls (empty when it does).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

crate::wire!(json: HealthRequest, HealthWatch, Health);
