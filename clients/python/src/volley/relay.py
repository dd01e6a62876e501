"""Relayed calls (PROTOCOL.md §16.4): the controller picks an instance, forwards the call and
relays the outcome. Two messages per call to the controller, none to the instance: for
callers that cannot reach the instances, or that want the controller's balancing."""

from __future__ import annotations

import struct
from typing import Any

from .errors import CallTimeoutError, CodecError, ConnectionLostError, NoInstancesError, NotRegisteredError, error_for
from .errors import Code
from .proto import name_bytes

TARGET_ANY, TARGET_KEY, TARGET_ADDRESS = 0, 1, 2
FLAG_IDEMPOTENT = 0x01


def relay_request(
    service: str,
    method: str,
    payload: bytes,
    *,
    key_hash: int | None = None,
    address: str | None = None,
    timeout_ms: int = 0,
    idempotent: bool = False,
) -> bytes:
    """The ``RelayRequest`` bytes: flags, target, timeout, names, then the payload as it is."""
    if key_hash is not None and address is not None:
        raise ValueError("a relayed call goes by key or by address, not both")
    if key_hash is not None:
        target = struct.pack("<BQ", TARGET_KEY, key_hash)
    elif address is not None:
        a = address.encode()
        target = struct.pack("<BH", TARGET_ADDRESS, len(a)) + a
    else:
        target = bytes([TARGET_ANY])
    head = bytes([FLAG_IDEMPOTENT if idempotent else 0]) + target + struct.pack("<I", timeout_ms)
    return head + name_bytes(service, "service") + name_bytes(method, "method") + payload


def relay_outcome(reply: bytes) -> bytes:
    """The forwarded call's reply payload, or raises what a direct call would have (§16.4)."""
    if not reply:
        raise CodecError("an empty relay reply")
    outcome, rest = reply[0], reply[1:]
    if outcome == 0:
        return rest
    if outcome == 1:
        if len(rest) < 2:
            raise CodecError("a relay reply too short for its error code")
        raise error_for(struct.unpack_from("<H", rest)[0], _text(rest[2:]))
    if outcome == 5:
        if len(rest) < 8:
            raise CodecError("a relay reply too short for its timeout")
        raise CallTimeoutError(f"the relayed call timed out after {struct.unpack_from('<Q', rest)[0]} ms")
    kinds: dict[int, Any] = {
        2: lambda t: NoInstancesError(f"no usable instance of {t!r}"),
        3: lambda t: NotRegisteredError(f"no service named {t!r} ever registered"),
        4: lambda t: ConnectionLostError(f"the relayed call's connection failed: {t}"),
        6: lambda t: error_for(Code.INTERNAL, f"the relay failed: {t}"),
    }
    if outcome not in kinds:
        raise CodecError(f"unknown relay outcome {outcome}")
    raise kinds[outcome](_text(rest))


def _text(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        raise CodecError("a relay reply's text is not UTF-8") from None
