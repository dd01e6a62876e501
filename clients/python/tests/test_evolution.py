"""A type that changed between releases, across Rust and Python (PROTOCOL.md §15.5, the
"compatible" cells of adding a field with a default): an old Python client against a new Rust
server and a new Python client against an old one, then the Rust client of each release
against a Python server of the other, in each tier both languages have — JSON, MessagePack
(maps) and protobuf. The Rust side is ``volley conformance evolution-serve|evolution-call``
(crates/volley-conformance/src/evolution.rs): an item ``{id, name}`` in the old release,
``{id, name, tag}`` in the new, answered with its name in capitals and, by the new release,
the tag it read (``none`` for the default)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

import volley
from volley import JSON, MSGPACK, Method, Server

from conftest import Running, python_server, volley_bin

TIERS = ["json", "msgpack", "proto"]
SENT_OLD = {"id": 7, "name": "tea"}
SENT_NEW = {"id": 7, "name": "tea", "tag": "gift"}


def need(tier: str) -> None:
    """The tier's optional package (both are in the ``test`` extra)."""
    if tier == "msgpack":
        pytest.importorskip("msgpack", reason="the msgpack package is not installed")
    if tier == "proto":
        pytest.importorskip("google.protobuf", reason="the protobuf package is not installed")


def item_class(release: str):
    """The protobuf message of ``release``, from a descriptor set built here (no protoc): the
    new release adds ``tag`` under a new number."""
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FileDescriptorProto(name=f"evolve_{release}.proto", package=f"evolve.{release}", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    m = f.message_type.add(name="Item")
    fields = [("id", 1, T.TYPE_UINT32), ("name", 2, T.TYPE_STRING)]
    if release == "new":
        fields.append(("tag", 3, T.TYPE_STRING))
    for name, number, kind in fields:
        m.field.add(name=name, number=number, type=kind, label=T.LABEL_OPTIONAL)
    data = descriptor_pb2.FileDescriptorSet(file=[f]).SerializeToString()
    return volley.protobuf_classes(data)[f"evolve.{release}.Item"]


def method(tier: str, release: str) -> tuple[Method, object, object]:
    """The method of ``tier`` as a client or server of ``release`` declares it, with the
    functions from a dict to the tier's value and back; the way back keeps only the fields
    ``release`` knows, as its code would."""
    names = ["id", "name"] + (["tag"] if release == "new" else [])
    if tier == "proto":
        cls = item_class(release)
        codec = volley.Protobuf(cls)
        return (
            Method("evolve", tier, codec, codec),
            lambda d: cls(**{k: d[k] for k in names if k in d}),
            lambda m: {k: getattr(m, k) for k in names},
        )
    codec = JSON if tier == "json" else MSGPACK
    return Method("evolve", tier, codec, codec), dict, lambda d: {k: d[k] for k in names if k in d}


def rust_server(release: str) -> Running:
    return Running(
        ["conformance", "evolution-serve", "tcp://127.0.0.1:0", "--release", release], r"evolution server on (\S+)"
    )


def python_call(address: str, tier: str, release: str, sent: dict) -> dict:
    """One call from a Python client of ``release``: the reply as that release reads it."""
    m, make, read = method(tier, release)

    async def main():
        async with await volley.Client.connect(address) as client:
            return read(await client.call(m, make(sent)))

    return asyncio.run(main())


def python_evolve_server(release: str) -> Server:
    """The Python server of ``release``: each tier's method answers as the Rust one does."""
    server = Server()
    for tier in TIERS:
        m, make, read = method(tier, release)

        def answer(value, make=make, read=read):
            got = read(value)
            out = {"id": got["id"], "name": got["name"].upper()}
            if release == "new":
                out["tag"] = got.get("tag") or "none"
            return make(out)

        server.handle(m, answer)
    return server


def rust_call(address: str, release: str) -> dict:
    out = subprocess.run(
        [volley_bin(), "conformance", "evolution-call", address, "--release", release],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("tier", TIERS)
def test_an_old_python_client_and_a_new_rust_server(tier):
    need(tier)
    server = rust_server("new")
    try:
        # The new server reads the field the old client does not send as its default, and its
        # answer carries a field the old client does not know, which the client skips.
        assert python_call(server.address, tier, "old", SENT_OLD) == {"id": 7, "name": "TEA"}
        # The same server and a new client: the field travels both ways.
        assert python_call(server.address, tier, "new", SENT_NEW) == {"id": 7, "name": "TEA", "tag": "gift"}
    finally:
        server.stop()


@pytest.mark.parametrize("tier", TIERS)
def test_a_new_python_client_and_an_old_rust_server(tier):
    need(tier)
    server = rust_server("old")
    try:
        # The old server skips the field it does not know; its answer lacks the field, which
        # the new client reads as the default.
        got = python_call(server.address, tier, "new", SENT_NEW)
        assert (got["id"], got["name"], got.get("tag", "")) == (7, "TEA", "")
        assert python_call(server.address, tier, "old", SENT_OLD) == {"id": 7, "name": "TEA"}
    finally:
        server.stop()


def test_the_old_rust_client_and_a_new_python_server():
    need("msgpack")
    need("proto")
    with python_server(lambda: python_evolve_server("new"), "tcp://127.0.0.1:0") as (address,):
        got = rust_call(address, "old")
    # The Rust client of the old release skips the tag the new server sends ("none": it read
    # the default for the field the client did not send).
    assert got == {t: {"id": 7, "name": "TEA"} for t in TIERS}


def test_the_new_rust_client_and_an_old_python_server():
    need("msgpack")
    need("proto")
    with python_server(lambda: python_evolve_server("old"), "tcp://127.0.0.1:0") as (address,):
        got = rust_call(address, "new")
    # The old server skips the tag; the new client reads the missing field as its default.
    assert got == {t: {"id": 7, "name": "TEA", "tag": ""} for t in TIERS}
    with python_server(lambda: python_evolve_server("new"), "tcp://127.0.0.1:0") as (address,):
        got = rust_call(address, "new")
    assert got == {t: {"id": 7, "name": "TEA", "tag": "gift"} for t in TIERS}
