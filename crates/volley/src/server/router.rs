//! Service name → method name → the method's handler. Built once, before the server starts;
//! looked up without a lock.

use std::any::Any;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::handler::Handler;
use crate::error::Status;
use crate::proto::Code;

/// One registered method.
pub(crate) struct Route {
    /// What connections call: requests as bytes.
    pub handler: Arc<dyn Handler>,
    /// What inproc callers call: the method's typed face, an
    /// [`AnyMethod`](crate::transport::inproc::AnyMethod) behind `Any`.
    pub local: Box<dyn Any + Send + Sync>,
    /// The method's metrics (kept only if the server's config says so).
    pub metrics: Arc<crate::metrics::MethodMetrics>,
    /// Requests are served one by one, never joined with those that arrived with them
    /// ([`ServerBuilder::handle_each`](super::ServerBuilder::handle_each)).
    pub alone: bool,
}

#[derive(Default)]
pub(crate) struct Router {
    services: FxHashMap<Box<str>, FxHashMap<Box<str>, Route>>,
}

impl Router {
    /// Adds a route; `false` if the method already had one.
    pub fn insert(&mut self, service: &str, method: &str, route: Route) -> bool {
        self.services.entry(service.into()).or_default().insert(method.into(), route).is_none()
    }

    /// Marks the route of `service/method` as served one request at a time.
    pub fn set_alone(&mut self, service: &str, method: &str) {
        if let Some(r) = self.services.get_mut(service).and_then(|m| m.get_mut(method)) {
            r.alone = true;
        }
    }

    /// The route of `service/method`, or the error reply for an unknown service or method.
    pub fn lookup(&self, service: &str, method: &str) -> Result<&Route, Status> {
        let methods = self
            .services
            .get(service)
            .ok_or_else(|| Status::new(Code::UnknownService, format!("no service named {service:?}")))?;
        methods.get(method).ok_or_else(|| {
            Status::new(Code::UnknownMethod, format!("service {service:?} has no method {method:?}"))
        })
    }

    pub fn has_service(&self, service: &str) -> bool {
        self.services.contains_key(service)
    }

    /// The application's services (not the ones every server adds by itself).
    pub fn service_names(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(|s| &**s).filter(|s| !crate::reflect::is_built_in(s))
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.services.values().flat_map(|m| m.values())
    }
}
