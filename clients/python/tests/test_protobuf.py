"""The protobuf tier (``volley.Protobuf``, PROTOCOL.md §15.1): the bytes prost writes for the
same message (the vector below is also checked by crates/volley-proto-example), classes built
from a descriptor set as reflection hands it out, a call through the Python server, evolution by
protobuf's rules, and a clear error without the protobuf package."""

from __future__ import annotations

import asyncio
import base64
import sys

import pytest

import volley
from volley import CodecError, Method, Server

protobuf = pytest.importorskip("google.protobuf", reason="the protobuf package is not installed")
from google.protobuf import descriptor_pb2  # noqa: E402

# shop.v1.Order {id: 7, sku: "tea", qty: 2}: tags 1 (varint), 2 (length-delimited), 3 (varint).
ORDER_BYTES = bytes.fromhex("0807120374656118 02".replace(" ", ""))


def shop_descriptor_set(with_coupon: bool = True) -> bytes:
    """crates/volley-proto-example/proto/shop.proto as a FileDescriptorSet, built by hand (no
    protoc): Order (with or without the later field ``coupon``) and Receipt."""
    f = descriptor_pb2.FileDescriptorProto(name="shop.proto", package="shop.v1", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    order = f.message_type.add(name="Order")
    fields = [("id", 1, T.TYPE_UINT32), ("sku", 2, T.TYPE_STRING), ("qty", 3, T.TYPE_UINT32)]
    if with_coupon:
        fields.append(("coupon", 4, T.TYPE_STRING))
    for name, number, kind in fields:
        order.field.add(name=name, number=number, type=kind, label=T.LABEL_OPTIONAL)
    receipt = f.message_type.add(name="Receipt")
    for name, number, kind in [("id", 1, T.TYPE_UINT32), ("total_cents", 2, T.TYPE_UINT64), ("note", 3, T.TYPE_STRING)]:
        receipt.field.add(name=name, number=number, type=kind, label=T.LABEL_OPTIONAL)
    return descriptor_pb2.FileDescriptorSet(file=[f]).SerializeToString()


def test_the_bytes_are_protobufs_and_match_the_rust_side():
    classes = volley.protobuf_classes(shop_descriptor_set())
    Order = classes["shop.v1.Order"]
    codec = volley.Protobuf(Order)
    assert (codec.tier, codec.format, codec.type_name) == ("general", "protobuf", "shop.v1.Order")
    assert codec.encode(Order(id=7, sku="tea", qty=2)) == ORDER_BYTES
    back = codec.decode(ORDER_BYTES)
    assert (back.id, back.sku, back.qty, back.coupon) == (7, "tea", 2, "")
    with pytest.raises(CodecError, match="shop.v1.Order"):
        codec.decode(b"\x0a\xff")  # a length-delimited field running past the payload
    with pytest.raises(CodecError, match="expected a shop.v1.Order"):
        codec.encode({"id": 7})
    with pytest.raises(CodecError, match="not a FileDescriptorSet"):
        volley.protobuf_classes(b"\xff\xff")


def test_old_and_new_messages_read_each_other():
    new = volley.protobuf_classes(shop_descriptor_set(with_coupon=True))["shop.v1.Order"]
    old = volley.protobuf_classes(shop_descriptor_set(with_coupon=False))["shop.v1.Order"]
    new_codec, old_codec = volley.Protobuf(new), volley.Protobuf(old)
    # Old → new: the added field reads as its default.
    got = new_codec.decode(old_codec.encode(old(id=1, sku="cake", qty=3)))
    assert (got.id, got.sku, got.qty, got.coupon) == (1, "cake", 3, "")
    # New → old: the field the old build does not know is skipped (and kept, unknown).
    got = old_codec.decode(new_codec.encode(new(id=2, sku="tea", qty=1, coupon="HALF")))
    assert (got.id, got.sku, got.qty) == (2, "tea", 1)


def test_a_protobuf_method_through_the_python_server():
    classes = volley.protobuf_classes(shop_descriptor_set())
    Order, Receipt = classes["shop.v1.Order"], classes["shop.v1.Receipt"]
    buy = Method("shop.v1", "buy", volley.Protobuf(Order), volley.Protobuf(Receipt))
    server = Server()
    server.handle(buy, lambda o: Receipt(id=o.id, total_cents=350 * o.qty))

    async def main():
        async with server:
            addr = await server.listen("tcp://127.0.0.1:0")
            async with await volley.Client.connect(addr) as client:
                r = await client.call(buy, Order(id=4, sku="tea", qty=2))
                assert (r.id, r.total_cents) == (4, 700)
                # Reflection names the messages and hands out their descriptor set, from which
                # a caller without the classes builds them.
                catalog = await client.call(volley.reflect.LIST, None)
                (method,) = [m for s in catalog["services"] if s["name"] == "shop.v1" for m in s["methods"]]
                assert method["request"]["protobuf"]["message"] == "shop.v1.Order"
                assert method["reply"]["format"] == "protobuf"
                rebuilt = volley.protobuf_classes(base64.b64decode(method["request"]["protobuf"]["descriptor_set"]))
                assert volley.Protobuf(rebuilt["shop.v1.Order"]).encode(rebuilt["shop.v1.Order"](id=7, sku="tea", qty=2)) == ORDER_BYTES
                # Bytes that are no Order are refused by the server, as BadRequest.
                with pytest.raises(volley.BadRequestError):
                    await client.call(Method("shop.v1", "buy"), b"\x0a\xff")

    asyncio.run(main())


def test_without_the_protobuf_package_the_error_says_what_to_install(monkeypatch):
    Order = volley.protobuf_classes(shop_descriptor_set())["shop.v1.Order"]
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    with pytest.raises(CodecError, match=r"pip install 'volley-client\[protobuf\]'"):
        volley.Protobuf(Order)
    with pytest.raises(CodecError, match="needs the protobuf package"):
        volley.protobuf_classes(b"")
