"""Payload codecs for the language-neutral tiers (PROTOCOL.md §11, §15.1), and methods.

A codec turns a value into a payload and back: ``codec.encode(value) -> bytes`` and
``codec.decode(payload) -> value``; a payload that does not decode raises ``CodecError``.
Both sides of a method must use the same encoding (nothing on the wire names it):

======================  =============================  =========================================
Rust type               codec                          Python value
======================  =============================  =========================================
``Bytes``, ``Vec<u8>``  ``RAW``                        ``bytes``
``String``              ``UTF8``                       ``str``
``()``                  ``UNIT``                       ``None``
``bool``                ``BOOL``                       ``bool``
``u8`` … ``i128``       ``U8`` … ``U128``, ``I8`` …    ``int``
``f32``, ``f64``        ``F32``, ``F64``               ``float``
``Vec<T>`` of numbers   ``Array("I")`` (struct codes)  ``list``
``wire!(pod: T)``       ``Pod("<iiii")``               ``tuple`` (or the class given)
``wire!(json: T)``      ``JSON``                       what ``json`` makes of it
``wire!(msgpack: T)``   ``MSGPACK`` (needs msgpack)    what ``msgpack`` makes of it
======================  =============================  =========================================

The fast tier (bitcode) has no Python codec: a method other languages call should use one of
these.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Callable

from .errors import CodecError
from .proto import name_bytes


class Codec:
    """How values of one type travel; subclasses override ``encode`` and ``decode``.

    ``tier`` and ``format`` are what reflection (``volley.reflect``) says of the type: the
    codec tier and the byte format, as a Rust type of the same encoding reports them."""

    name = "codec"
    tier = "custom"
    format = "custom"
    type_name = "object"

    def encode(self, value: Any) -> bytes:
        raise NotImplementedError

    def decode(self, payload: bytes) -> Any:
        raise NotImplementedError

    def encode_many(self, values: list[Any]) -> list[bytes]:
        """``encode`` of each value (a batch's requests); raises the first ``CodecError``."""
        return list(map(self.encode, values))

    def decode_many(self, payloads: list[bytes]) -> list[Any]:
        """``decode`` of each payload (a batch's replies); raises the first ``CodecError``."""
        return list(map(self.decode, payloads))

    def __repr__(self) -> str:
        return f"<volley codec {self.name}>"


class _Raw(Codec):
    name = "raw"
    tier, format, type_name = "pod", "bytes", "bytes"

    def encode(self, value: bytes | bytearray | memoryview) -> bytes:
        if type(value) is bytes:
            return value
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise CodecError(f"raw payloads are bytes, not {type(value).__name__}")
        return bytes(value)

    def decode(self, payload: bytes) -> bytes:
        return payload

    # A batch of bytes passes as it is: the type check runs in C (the types listed and the
    # ``bytes`` among them counted, quicker than a set of them), which is most of what a
    # batch of raw items costs to encode and decode otherwise.
    def encode_many(self, values: list[Any]) -> list[bytes]:
        if list(map(type, values)).count(bytes) == len(values):
            return values
        return list(map(self.encode, values))

    def decode_many(self, payloads: list[bytes]) -> list[bytes]:
        return payloads


class _Utf8(Codec):
    name = "utf-8"
    format, type_name = "utf-8", "str"

    def encode(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise CodecError(f"expected str, not {type(value).__name__}")
        return value.encode()

    def decode(self, payload: bytes) -> str:
        try:
            return payload.decode()
        except UnicodeDecodeError as e:
            raise CodecError(f"payload is not UTF-8: {e}") from None


class _Unit(Codec):
    name = "unit"
    format, type_name = "unit", "None"

    def encode(self, value: None) -> bytes:
        return b""

    def decode(self, payload: bytes) -> None:
        if payload:
            raise CodecError(f"expected an empty payload, got {len(payload)} bytes")


class Fixed(Codec):
    """One value of a fixed-width little-endian type: a ``struct`` code such as ``"I"``."""

    tier = "pod"

    def __init__(self, code: str, name: str):
        self.struct = struct.Struct("<" + code)
        self.name = self.format = name
        self.type_name = "float" if code in "fd" else "int"

    def encode(self, value: Any) -> bytes:
        try:
            return self.struct.pack(value)
        except (struct.error, TypeError) as e:
            raise CodecError(f"{value!r} is not a {self.name}: {e}") from None

    def decode(self, payload: bytes) -> Any:
        if len(payload) != self.struct.size:
            raise CodecError(f"a {self.name} is {self.struct.size} bytes, the payload has {len(payload)}")
        return self.struct.unpack(payload)[0]


class _Bool(Codec):
    name = "bool"
    format, type_name = "bool", "bool"

    def encode(self, value: bool) -> bytes:
        return b"\x01" if value else b"\x00"

    def decode(self, payload: bytes) -> bool:
        if payload not in (b"\x00", b"\x01"):
            raise CodecError(f"a bool is one byte 00 or 01, not {payload[:8].hex()}")
        return payload == b"\x01"


class Wide(Codec):
    """A 128-bit integer, little-endian (two's complement when signed)."""

    tier, type_name = "pod", "int"

    def __init__(self, signed: bool):
        self.signed = signed
        self.name = self.format = "i128" if signed else "u128"

    def encode(self, value: int) -> bytes:
        try:
            return value.to_bytes(16, "little", signed=self.signed)
        except (OverflowError, AttributeError) as e:
            raise CodecError(f"{value!r} is not a {self.name}: {e}") from None

    def decode(self, payload: bytes) -> int:
        if len(payload) != 16:
            raise CodecError(f"a {self.name} is 16 bytes, the payload has {len(payload)}")
        return int.from_bytes(payload, "little", signed=self.signed)


class Array(Codec):
    """``Vec<T>`` of plain numbers: the elements little-endian, back to back, no count.

    ``code`` is a ``struct`` code: ``B H I Q`` (u8 … u64), ``b h i q`` (i8 … i64), ``f d``.
    """

    tier, format = "pod", "array"

    def __init__(self, code: str):
        self.code = code
        self.size = struct.calcsize("<" + code)
        self.name = f"array of {code}"
        # Named as Rust names the vector, so a tool reads the element type the same way.
        self.type_name = f"list[{_ELEMENT.get(code, code)}]"

    def encode(self, values: list) -> bytes:
        try:
            return struct.pack(f"<{len(values)}{self.code}", *values)
        except (struct.error, TypeError) as e:
            raise CodecError(f"not an {self.name}: {e}") from None

    def decode(self, payload: bytes) -> list:
        if len(payload) % self.size:
            raise CodecError(f"{len(payload)} bytes is not a whole number of {self.size}-byte elements")
        return list(struct.unpack(f"<{len(payload) // self.size}{self.code}", payload))


_ELEMENT = dict(zip("BHIQbhiqfd", "u8 u16 u32 u64 i8 i16 i32 i64 f32 f64".split()))


class Pod(Codec):
    """A plain-data struct (``volley::wire!(pod: T)``): its fields little-endian at their
    ``#[repr(C)]`` offsets. ``layout`` is a ``struct`` format starting with ``<``; ``make``
    builds the value from the fields (a namedtuple class, say; default: a tuple)."""

    tier, format = "pod", "pod"

    def __init__(self, layout: str, make: Callable[..., Any] | None = None):
        if not layout.startswith("<"):
            raise ValueError("plain data is little-endian: the layout must start with '<'")
        self.struct = struct.Struct(layout)
        self.make = make
        self.name = f"pod {layout}"
        self.type_name = getattr(make, "__name__", "tuple")

    def encode(self, value: Any) -> bytes:
        try:
            return self.struct.pack(*value)
        except (struct.error, TypeError) as e:
            raise CodecError(f"{value!r} does not fit {self.name}: {e}") from None

    def decode(self, payload: bytes) -> Any:
        if len(payload) != self.struct.size:
            raise CodecError(f"{self.name} is {self.struct.size} bytes, the payload has {len(payload)}")
        fields = self.struct.unpack(payload)
        return self.make(*fields) if self.make else fields


class _Json(Codec):
    """Compact JSON, UTF-8 (non-ASCII characters as themselves, as serde_json writes them)."""

    name = "json"
    tier, format = "general", "json"

    def encode(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as e:
            raise CodecError(f"not JSON-encodable: {e}") from None

    def decode(self, payload: bytes) -> Any:
        try:
            return json.loads(payload)
        except (ValueError, UnicodeDecodeError) as e:
            raise CodecError(f"payload is not JSON: {e}") from None


class _MsgPack(Codec):
    """MessagePack (the optional ``msgpack`` package: ``pip install 'volley-client[msgpack]'``)."""

    name = "msgpack"
    tier, format = "general", "msgpack"

    def _lib(self):
        try:
            import msgpack
        except ImportError:
            raise CodecError(
                "the MessagePack codec needs the msgpack package: pip install 'volley-client[msgpack]'"
            ) from None
        return msgpack

    def encode(self, value: Any) -> bytes:
        try:
            return self._lib().packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            raise CodecError(f"not MessagePack-encodable: {e}") from None

    def decode(self, payload: bytes) -> Any:
        lib = self._lib()
        try:
            return lib.unpackb(payload, raw=False, strict_map_key=False)
        except (ValueError, lib.ExtraData, lib.FormatError, lib.StackError) as e:
            raise CodecError(f"payload is not one MessagePack value: {e}") from None


RAW: Codec = _Raw()
UTF8: Codec = _Utf8()
UNIT: Codec = _Unit()
BOOL: Codec = _Bool()
U8, U16, U32, U64 = (Fixed(c, n) for c, n in (("B", "u8"), ("H", "u16"), ("I", "u32"), ("Q", "u64")))
I8, I16, I32, I64 = (Fixed(c, n) for c, n in (("b", "i8"), ("h", "i16"), ("i", "i32"), ("q", "i64")))
U128, I128 = Wide(False), Wide(True)
F32, F64 = Fixed("f", "f32"), Fixed("d", "f64")
JSON: Codec = _Json()
MSGPACK: Codec = _MsgPack()


class Method:
    """One method of a service, with the codecs of its request and reply.

    ``Method("echo", "echo")`` sends and receives raw bytes; ``Method("search", "top",
    JSON, JSON)`` JSON values.
    """

    __slots__ = ("service", "name", "request", "reply", "names")

    def __init__(self, service: str, name: str, request: Codec = RAW, reply: Codec = RAW):
        self.service = service
        self.name = name
        self.request = request
        self.reply = reply
        # The service and method fields of every request, built once.
        self.names = name_bytes(service, "service") + name_bytes(name, "method")

    def __repr__(self) -> str:
        return f"Method({self.service!r}, {self.name!r}, {self.request.name}, {self.reply.name})"
