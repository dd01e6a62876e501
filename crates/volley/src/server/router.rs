//! Service name → method name → the method's handler. Built once, before the server starts;
//! looked up without a lock.

use std::any::Any;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::handler::Handler;
use super::stream::StreamHandler;
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
    /// The schema fingerprints of the method's request and reply types (0: none), which a
    /// caller's must equal.
    pub fingerprints: crate::proto::Fingerprints,
}

/// One registered stream method.
pub(crate) struct StreamRoute {
    pub handler: Arc<dyn StreamHandler>,
}

#[derive(Default)]
pub(crate) struct Router {
    services: FxHashMap<Box<str>, FxHashMap<Box<str>, Route>>,
    /// Stream methods, apart: a call and a stream are served by different paths.
    streams: FxHashMap<Box<str>, FxHashMap<Box<str>, StreamRoute>>,
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

    /// Adds a stream route; `false` if the method already had a route of either kind.
    pub fn insert_stream(&mut self, service: &str, method: &str, route: StreamRoute) -> bool {
        if self.services.get(service).is_some_and(|m| m.contains_key(method)) {
            return false;
        }
        self.streams.entry(service.into()).or_default().insert(method.into(), route).is_none()
    }

    /// The route of `service/method`, or the error reply for an unknown service or method.
    pub fn lookup(&self, service: &str, method: &str) -> Result<&Route, Status> {
        match self.services.get(service).and_then(|m| m.get(method)) {
            Some(route) => Ok(route),
            None => Err(self.missing(service, method, false)),
        }
    }

    /// The route of stream method `service/method`, or the error reply.
    pub fn lookup_stream(&self, service: &str, method: &str) -> Result<&StreamRoute, Status> {
        match self.streams.get(service).and_then(|m| m.get(method)) {
            Some(route) => Ok(route),
            None => Err(self.missing(service, method, true)),
        }
    }

    /// Why `service/method` has no route of the kind asked for (`stream` or a call).
    #[cold]
    fn missing(&self, service: &str, method: &str, stream: bool) -> Status {
        let is_call = self.services.get(service).is_some_and(|m| m.contains_key(method));
        let is_stream = self.streams.get(service).is_some_and(|m| m.contains_key(method));
        if is_call || is_stream {
            let (is, asked) =
                if stream { ("a single call", "opened as a stream") } else { ("a stream", "called") };
            return Status::new(
                Code::BadRequest,
                format!("{service}/{method} is {is} method: it cannot be {asked}"),
            );
        }
        if !self.services.contains_key(service) && !self.streams.contains_key(service) {
            return Status::new(Code::UnknownService, format!("no service named {service:?}"));
        }
        Status::new(Code::UnknownMethod, format!("service {service:?} has no method {method:?}"))
    }

    pub fn has_service(&self, service: &str) -> bool {
        self.services.contains_key(service)
    }

    /// The application's services (not the ones every server adds by itself).
    pub fn service_names(&self) -> impl Iterator<Item = &str> {
        let only_streams = self.streams.keys().filter(|s| !self.services.contains_key(*s));
        self.services.keys().chain(only_streams).map(|s| &**s).filter(|s| !crate::reflect::is_built_in(s))
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.services.values().flat_map(|m| m.values())
    }
}
