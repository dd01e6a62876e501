//! The one public error type, and [`Status`], the error a handler returns.

use std::time::Duration;

use crate::proto::{Code, ProtocolError};

/// Everything a call, a connect or a listen can fail with. Every call ends in exactly one
/// result: a reply, or one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The call's deadline passed before a reply arrived.
    #[error("call timed out after {0:?}")]
    Timeout(Duration),
    /// The server answered with an error reply (unknown service, handler error, panic,
    /// overload ...). Match on [`Status::code`].
    #[error("remote error: {0}")]
    Remote(Status),
    /// The connection was lost (or never made) before the call ended. The request may have
    /// reached its handler: send it again only if the method is idempotent.
    #[error("connection error: {0}")]
    Connection(String),
    /// The request was never handed to a handler: its server was going away
    /// (`GoAway(ShuttingDown)`, PROTOCOL.md §9.6.2) and had answered everything it started.
    /// Safe to send again, whatever the method; a
    /// [`ServiceClient`](crate::ServiceClient) sends it to another instance at once.
    #[error("not run: {0}")]
    NotRun(String),
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

    /// Whether trying again can help: [`Transient`](ErrorClass::Transient) failures may pass
    /// (a peer unreachable, busy or restarting), [`Permanent`](ErrorClass::Permanent) ones will
    /// not until something is changed (a credential, a request, an address), and
    /// [`Other`](ErrorClass::Other) is the request's own outcome (a handler's error or panic),
    /// which only the application can judge.
    ///
    /// | Class | Errors |
    /// |---|---|
    /// | transient | `Timeout`, `Connection`, `NotRun`, `Closed`, `NoInstances`, `UnknownService`; `Remote` with `Overloaded`, `ShuttingDown`, `DeadlineExceeded`, `Cancelled`, `UnknownService` |
    /// | permanent | `Unauthenticated`, `Usage`, `InvalidAddress`, `Encode`, `Decode`, `TooLarge`, `Protocol`; `Remote` with `BadRequest`, `Unauthenticated`, `UnknownMethod`, `TooLarge`, `Protocol` |
    /// | other | `Remote` with `Application`, `Panicked`, `Internal` or a code this version does not know |
    ///
    /// A server that does not offer a service yet (`UnknownService`) may be starting, and a
    /// service the registry does not know may register at any moment: both are transient.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Timeout(_)
            | Error::Connection(_)
            | Error::NotRun(_)
            | Error::Closed
            | Error::NoInstances { .. }
            | Error::UnknownService(_) => ErrorClass::Transient,
            Error::Unauthenticated(_)
            | Error::Usage(_)
            | Error::InvalidAddress { .. }
            | Error::Encode(_)
            | Error::Decode(_)
            | Error::TooLarge { .. }
            | Error::Protocol(_) => ErrorClass::Permanent,
            Error::Remote(s) => match s.code {
                Code::Overloaded
                | Code::ShuttingDown
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::UnknownService => ErrorClass::Transient,
                Code::BadRequest
                | Code::Unauthenticated
                | Code::UnknownMethod
                | Code::TooLarge
                | Code::Protocol => ErrorClass::Permanent,
                Code::Application | Code::Panicked | Code::Internal | Code::Other(_) => ErrorClass::Other,
            },
        }
    }

    /// A refusal that repeating the same request will not change (see [`class`](Self::class)):
    /// report it and stop instead of retrying.
    pub fn is_permanent(&self) -> bool {
        self.class() == ErrorClass::Permanent
    }

    /// A failure that may pass: retrying later, or elsewhere, can succeed.
    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    pub(crate) fn io(context: &str, e: std::io::Error) -> Error {
        Error::Connection(format!("{context}: {e}"))
    }
}

/// Whether an [`Error`] may pass if the request is tried again ([`Error::class`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The peer could not be reached, was busy, restarting or too slow: try again later or
    /// elsewhere.
    Transient,
    /// The request, the credentials or the configuration are wrong: trying again fails the same
    /// way until they are fixed.
    Permanent,
    /// The request's own outcome (a handler's error, a panic, an internal failure): whether a
    /// retry helps is the application's call.
    Other,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_permanent_and_outages_transient() {
        let remote = |code| Error::Remote(Status::new(code, "x"));
        let permanent = [
            Error::Unauthenticated("wrong token".into()),
            Error::Usage("bad".into()),
            Error::InvalidAddress { addr: "x".into(), reason: "y".into() },
            Error::TooLarge { len: 2, max: 1 },
            remote(Code::BadRequest),
            remote(Code::Unauthenticated),
            remote(Code::UnknownMethod),
        ];
        for e in permanent {
            assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
            assert!(e.is_permanent() && !e.is_transient(), "{e}");
        }
        let transient = [
            Error::Timeout(Duration::from_millis(5)),
            Error::Connection("refused".into()),
            Error::Closed,
            Error::NoInstances { service: "s".into() },
            Error::UnknownService("s".into()),
            remote(Code::Overloaded),
            remote(Code::ShuttingDown),
        ];
        for e in transient {
            assert_eq!(e.class(), ErrorClass::Transient, "{e}");
            assert!(e.is_transient() && !e.is_permanent(), "{e}");
        }
        for code in [Code::Application, Code::Panicked, Code::Internal, Code::Other(999)] {
            let e = remote(code);
            assert_eq!(e.class(), ErrorClass::Other, "{e}");
            assert!(!e.is_permanent() && !e.is_transient(), "{e}");
        }
    }
}
