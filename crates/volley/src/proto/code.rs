//! The error codes carried by error replies, batch item errors and go-away messages
//! (`docs/PROTOCOL.md` lists them with their numbers).

/// Typed error codes carried by error replies and go-away messages.
///
/// Unknown codes from a newer peer are kept as [`Code::Other`] rather than rejected, so an old
/// client still reports the failure to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// No service by that name on this server.
    UnknownService,
    /// The service exists but has no such method.
    UnknownMethod,
    /// The request payload could not be decoded as the method's request type.
    BadRequest,
    /// The handler returned an error.
    Application,
    /// The handler panicked; the server lives on.
    Panicked,
    /// The server is over its bound of queued work and refused the request at once.
    Overloaded,
    /// The server is shutting down and takes no new work.
    ShuttingDown,
    /// The caller cancelled the request.
    Cancelled,
    /// The request's deadline passed before it was served.
    DeadlineExceeded,
    /// A failure inside the framework (for example, a reply that could not be encoded).
    Internal,
    /// The peer is not authenticated for this.
    Unauthenticated,
    /// The peer broke the wire protocol (go-away only).
    Protocol,
    /// A message exceeded a size limit.
    TooLarge,
    /// A code this implementation does not know.
    Other(u16),
}

impl Code {
    pub fn to_u16(self) -> u16 {
        match self {
            Code::UnknownService => 1,
            Code::UnknownMethod => 2,
            Code::BadRequest => 3,
            Code::Application => 4,
            Code::Panicked => 5,
            Code::Overloaded => 6,
            Code::ShuttingDown => 7,
            Code::Cancelled => 8,
            Code::DeadlineExceeded => 9,
            Code::Internal => 10,
            Code::Unauthenticated => 11,
            Code::Protocol => 12,
            Code::TooLarge => 13,
            Code::Other(c) => c,
        }
    }

    pub fn from_u16(c: u16) -> Code {
        match c {
            1 => Code::UnknownService,
            2 => Code::UnknownMethod,
            3 => Code::BadRequest,
            4 => Code::Application,
            5 => Code::Panicked,
            6 => Code::Overloaded,
            7 => Code::ShuttingDown,
            8 => Code::Cancelled,
            9 => Code::DeadlineExceeded,
            10 => Code::Internal,
            11 => Code::Unauthenticated,
            12 => Code::Protocol,
            13 => Code::TooLarge,
            other => Code::Other(other),
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Code::Other(c) => write!(f, "code {c}"),
            named => write!(f, "{named:?}"),
        }
    }
}
