//! Which process an admin endpoint belongs to: what the status page's header and the
//! `process` object of `/vars.json` show, so that a page open among several says whose it is.

use serde_json::{Value, json};

/// The process behind an admin endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// `controller` for a server that holds the registry, `server` for any other.
    pub role: &'static str,
    /// The services the server offers, by name, sorted.
    pub services: Vec<String>,
    /// The addresses the server listens on, as bound (real ports), in the order bound.
    pub addresses: Vec<String>,
    /// The version of the volley crate the process was built with.
    pub version: &'static str,
    pub pid: u32,
}

impl Identity {
    pub(crate) fn json(&self) -> Value {
        json!({
            "role": self.role,
            "services": self.services,
            "addresses": self.addresses,
            "version": self.version,
            "pid": self.pid,
        })
    }
}
