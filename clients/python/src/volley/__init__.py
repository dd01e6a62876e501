"""Volley for Python: a client of Volley services, written from docs/PROTOCOL.md.

    import asyncio, volley

    async def main():
        async with await volley.Client.connect("tcp://127.0.0.1:7411") as client:
            print(await client.call(volley.Method("echo", "echo"), b"hi"))

    asyncio.run(main())

See the package's README for batches, codecs, errors and the registry.
"""

from . import blocking, health, reflect
from .client import Client, Sequence
from .codec import (
    BOOL,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    I128,
    JSON,
    MSGPACK,
    RAW,
    U8,
    U16,
    U32,
    U64,
    U128,
    UNIT,
    UTF8,
    Array,
    Codec,
    Method,
    Pod,
)
from .errors import (
    ApplicationError,
    BadRequestError,
    CallCancelledError,
    CallTimeoutError,
    ClosedError,
    Code,
    CodecError,
    ConnectionLostError,
    DeadlineExceededError,
    InternalError,
    NoInstancesError,
    NotRegisteredError,
    OverloadedError,
    PanickedError,
    ProtocolError,
    ProtocolViolationError,
    RemoteError,
    ShuttingDownError,
    TooLargeError,
    UnauthenticatedError,
    UnknownMethodError,
    UnknownServiceError,
    UsageError,
    VolleyError,
    error_for,
)
from .hashing import HashRing, canonical_bytes, stable_hash
from .registry import Instance, InstanceSpec, Lease, Registry, Resolved
from .server import Server
from .service_client import ServiceClient

__all__ = [
    "blocking",
    "health",
    "ApplicationError",
    "Array",
    "BadRequestError",
    "BOOL",
    "CallCancelledError",
    "CallTimeoutError",
    "canonical_bytes",
    "Client",
    "ClosedError",
    "Code",
    "Codec",
    "CodecError",
    "ConnectionLostError",
    "DeadlineExceededError",
    "error_for",
    "F32",
    "F64",
    "HashRing",
    "I128",
    "I16",
    "I32",
    "I64",
    "I8",
    "Instance",
    "InstanceSpec",
    "InternalError",
    "JSON",
    "Lease",
    "Method",
    "MSGPACK",
    "NoInstancesError",
    "NotRegisteredError",
    "OverloadedError",
    "PanickedError",
    "Pod",
    "ProtocolError",
    "ProtocolViolationError",
    "RAW",
    "Registry",
    "RemoteError",
    "Resolved",
    "Sequence",
    "Server",
    "ServiceClient",
    "ShuttingDownError",
    "stable_hash",
    "TooLargeError",
    "U128",
    "U16",
    "U32",
    "U64",
    "U8",
    "UnauthenticatedError",
    "UNIT",
    "UnknownMethodError",
    "UnknownServiceError",
    "UsageError",
    "UTF8",
    "VolleyError",
]
