//! The one public error type, and [`Status`], the error a handler returns.

use std::time::Duration;

use crate::proto::{Code, ProtocolError};

/// Everything a call, a connect or a listen can fail with. Every call ends in exactly one
/// result: a reply, or one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The call's deadline passed before a reply arrived.
    #[error("call timed out after {0:?}")]
    Timeout(Duration),
    /// The server answered with an error reply (unknown service, handler error, panic,
    /// overload ...). Match on [`Status::code`].
    #[error("remote error: {0}")]
    Remote(Status),
    /// The connection was lost (or never made) before the call ended.
    #[error("connection error: {0}")]
    Connection(String),
    /// The peer broke the wire protocol; the connection was closed.
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    /// A request or reply could not be encoded.
    #[error("encode error: {0}")]
    Encode(String),
    /// A reply could not be decoded as the method's reply type.
    #[error("decode error: {0}")]
    Decode(String),
    /// A message exceeds a size limit; nothing was sent.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// An address that does not parse or names an unsupported scheme.
    #[error("invalid address {addr:?}: {reason}")]
    InvalidAddress { addr: String, reason: String },
    /// The server refused the connection's credential (no token, or a wrong one), or the
    /// registry refused a registration without its credential. Retrying will not help.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The client or server was shut down.
    #[error("closed")]
    Closed,
    /// The API was used in a way it cannot serve (the message says how to fix it).
    #[error("usage error: {0}")]
    Usage(String),
    /// The registry knows the service but no instance of it is usable now: none registered, or
    /// every one it lists stopped answering.
    #[error("no instances of service {service:?}")]
    NoInstances { service: String },
    /// No instance of this service has registered with the registry (since it started).
    #[error("unknown service {0:?}: nothing of that name is registered")]
    UnknownService(String),
}

impl Error {
    /// The remote error code, if this is an error reply.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Remote(s) => Some(s.code),
            _ => None,
        }
    }

    pub(crate) fn io(context: &str, e: std::io::Error) -> Error {
        Error::Connection(format!("{context}: {e}"))
    }
}

/// An error reply: a [`Code`] and a human-readable message. Handlers return it; callers see it
/// as [`Error::Remote`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status { code, message: message.into() }
    }

    /// An application error (code [`Code::Application`]).
    pub fn app(message: impl Into<String>) -> Status {
        Status::new(Code::Application, message)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

impl From<Error> for Status {
    /// Lets a handler use `?` on calls it makes to other services.
    fn from(e: Error) -> Status {
        match e {
            Error::Remote(s) => s,
            other => Status::new(Code::Internal, other.to_string()),
        }
    }
}

/// Shorthand for results whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
