"""Error codes (PROTOCOL.md §8) and the exceptions a call can end with.

Every call ends exactly once: with its reply, or by raising one of these. Error replies from a
server are ``RemoteError`` subclasses, one per code, so callers can ``except OverloadedError``;
a code this package does not know is a plain ``RemoteError`` carrying the number. Failures on
this side (a timeout, a lost connection, a peer breaking the protocol, a payload that does not
decode) have exceptions of their own.
"""

from __future__ import annotations

import enum


class Code(enum.IntEnum):
    """The u16 codes of Error and GoAway messages (PROTOCOL.md §8)."""

    UNKNOWN_SERVICE = 1
    UNKNOWN_METHOD = 2
    BAD_REQUEST = 3
    APPLICATION = 4
    PANICKED = 5
    OVERLOADED = 6
    SHUTTING_DOWN = 7
    CANCELLED = 8
    DEADLINE_EXCEEDED = 9
    INTERNAL = 10
    UNAUTHENTICATED = 11
    PROTOCOL = 12
    TOO_LARGE = 13


def code_name(code: int) -> str:
    """``ShuttingDown`` for 7 (the names of §8), ``code 99`` for a code not in the table."""
    try:
        return "".join(w.capitalize() for w in Code(code).name.split("_"))
    except ValueError:
        return f"code {code}"


class VolleyError(Exception):
    """Base of every exception this package raises for a call, a connection or a server."""


class RemoteError(VolleyError):
    """The server answered the call with an Error message: ``code`` and ``message``."""

    code: int = 0

    def __init__(self, message: str = "", code: int | None = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{code_name(self.code)}: {message}" if message else code_name(self.code))

    def __reduce__(self):
        return (error_for, (self.code, self.message))


def _remote(name: str, code: Code, doc: str) -> type[RemoteError]:
    return type(name, (RemoteError,), {"code": int(code), "__doc__": doc})


UnknownServiceError = _remote("UnknownServiceError", Code.UNKNOWN_SERVICE, "No service by that name.")
UnknownMethodError = _remote("UnknownMethodError", Code.UNKNOWN_METHOD, "The service has no such method.")
BadRequestError = _remote("BadRequestError", Code.BAD_REQUEST, "The payload did not decode.")
ApplicationError = _remote("ApplicationError", Code.APPLICATION, "The handler returned an error.")
PanickedError = _remote("PanickedError", Code.PANICKED, "The handler crashed; the server lives on.")
OverloadedError = _remote("OverloadedError", Code.OVERLOADED, "The server refused the work at once.")
ShuttingDownError = _remote("ShuttingDownError", Code.SHUTTING_DOWN, "The server is shutting down.")
CallCancelledError = _remote("CallCancelledError", Code.CANCELLED, "The caller cancelled the request.")
DeadlineExceededError = _remote(
    "DeadlineExceededError", Code.DEADLINE_EXCEEDED, "The deadline passed before it was served."
)
InternalError = _remote("InternalError", Code.INTERNAL, "A failure inside the server's framework.")
UnauthenticatedError = _remote(
    "UnauthenticatedError", Code.UNAUTHENTICATED, "The token (or registration credential) was refused."
)
ProtocolError = _remote("ProtocolError", Code.PROTOCOL, "A peer broke the wire protocol.")
TooLargeError = _remote("TooLargeError", Code.TOO_LARGE, "A message exceeded a size limit.")

_BY_CODE = {cls.code: cls for cls in RemoteError.__subclasses__()}


class ProtocolViolationError(ProtocolError):
    """The connection ended on a protocol error (§10) rather than on an Error reply: this side
    found the server's bytes broken, or the server went away with ``GoAway(Protocol)``. A
    ``ProtocolError`` like an Error reply with code 12, so one ``except`` catches both."""


def error_for(code: int, message: str = "") -> RemoteError:
    """The exception for an Error message (or a GoAway) with ``code``."""
    cls = _BY_CODE.get(code)
    return cls(message) if cls else RemoteError(message, code)


class CallTimeoutError(VolleyError, TimeoutError):
    """The call's deadline passed before an answer arrived (the answer, if any, is dropped)."""


class ConnectionLostError(VolleyError, ConnectionError):
    """The connection failed, closed or could not be made before the call ended.

    ``goaway_code`` is the code of the GoAway the server sent before closing, if any: after
    ``ShuttingDown`` (7) the calls still unanswered were never run and are safe to send again.
    ``unsent`` says the request never left: the connection could not be made.
    """

    def __init__(self, message: str, goaway_code: int | None = None, unsent: bool = False):
        super().__init__(message)
        self.goaway_code = goaway_code
        self.unsent = unsent

    @property
    def never_ran(self) -> bool:
        """No handler ran the request, so it may be sent again anywhere, whatever the method:
        it never left, or its server went away with ``GoAway(ShuttingDown)`` before reading
        it (PROTOCOL.md §9.6.2)."""
        return self.unsent or self.goaway_code == Code.SHUTTING_DOWN


class CodecError(VolleyError, ValueError):
    """A value could not be encoded, or a payload could not be decoded as the expected type."""


class ClosedError(VolleyError):
    """The client or server was closed by its owner."""


class NoInstancesError(VolleyError):
    """The registry knows the service, but no instance of it is usable now."""


class NotRegisteredError(VolleyError):
    """No instance of this service ever registered with the registry."""


class UsageError(VolleyError, ValueError):
    """The API was used in a way it cannot serve: an invalid address, a name too long..."""
