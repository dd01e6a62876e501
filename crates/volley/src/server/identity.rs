//! The server's side of [`Identity`]: what it knows of itself for the admin endpoint's header.

use super::shared::Shared;
use crate::metrics::identity::Identity;

impl Shared {
    /// Who this server is, now (listen adds addresses): `controller` when it holds a registry.
    pub(crate) fn identity(&self, holds_registry: bool) -> Identity {
        let mut services: Vec<String> = self.router.service_names().map(str::to_string).collect();
        services.sort();
        Identity {
            role: if holds_registry { "controller" } else { "server" },
            services,
            addresses: self.bound.lock().iter().map(ToString::to_string).collect(),
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
        }
    }
}
