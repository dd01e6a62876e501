//! Services as Rust traits: what the [`#[volley::service]`](macro@crate::service) attribute
//! generates code against.
//!
//! - [`Service`] — something that adds handlers to a [`ServerBuilder`]; the generated
//!   `XServer` implements it, and [`ServerBuilder::serve`] takes it.
//! - [`Caller`], [`ServiceCaller`] — what the generated `XClient` calls through: a [`Client`]
//!   or a [`ServiceClient`] (key routing and scatter-gather need the latter).
//! - [`Server::listen_and_register`] — listen, and register every service of the server with
//!   the registry under a renewed lease, in one call.
//!
//! `docs/SERVICES.md` is the guide.
//!
//! [`Client`]: crate::Client
//! [`ServiceClient`]: crate::ServiceClient
//! [`Server::listen_and_register`]: crate::Server::listen_and_register

mod caller;
mod register;

pub use caller::{BidiStreamCaller, Caller, ClientStreamCaller, ServiceCaller, StreamCaller};

/// What a stream method of a service returns: its items, each a result (an error ends the
/// stream). Make one with `Box::pin(stream)` or `StreamExt::boxed`.
pub type ItemStream<T> = futures_util::stream::BoxStream<'static, Result<T, crate::Status>>;
/// What a client or both-way stream method of a service takes: the client's requests, as they
/// come (taking them grants the client room for more); it ends after the client's last.
pub type RequestStream<T> = crate::server::Incoming<T>;
/// The stream a generated client's `_stream` method returns.
pub use futures_util::stream::Stream;

use crate::server::ServerBuilder;

/// A set of handlers to serve: `Server::builder().serve(IndexServer::new(my_index))`.
/// `#[volley::service]` implements it for the `XServer` it generates; implement it by hand
/// to package handlers registered with [`ServerBuilder::handle`] and friends.
pub trait Service {
    /// The service's name (what it registers under, and what every call carries).
    const NAME: &'static str;

    /// Adds this service's handlers to `builder`.
    fn add_handlers(self, builder: ServerBuilder) -> ServerBuilder;
}

impl ServerBuilder {
    /// Serves `service`: adds every handler it has. Panics, like [`handle`](Self::handle), if
    /// a method is already registered (the same service served twice).
    pub fn serve(self, service: impl Service) -> Self {
        service.add_handlers(self)
    }
}
