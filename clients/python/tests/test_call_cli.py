"""``volley call`` and ``volley describe`` (the Rust binary) against a Python server: a JSON
method, a plain one and a protobuf one, found through the server's reflection: a call, a
batch of 1,000 lines, an error."""

from __future__ import annotations

import asyncio
import json

import pytest

import volley
from volley import JSON, ApplicationError, Method, Server

from conftest import volley_bin

TOTAL = Method("shop", "total", JSON, JSON)
HALVE = Method("shop", "halve", volley.U32, volley.U32)


def total(order):
    if not order.get("items"):
        raise ApplicationError("an order of nothing")
    return {"sum": sum(order["items"]), "n": len(order["items"])}


def halve(n: int) -> int:
    return n // 2


async def volley_run(*args: str, stdin: str = "") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        volley_bin(),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 120)
    return proc.returncode, out.decode(), err.decode()


def test_volley_call_and_describe_against_a_python_server():
    async def main():
        server = Server().handle(TOTAL, total).handle_batch(HALVE, lambda ns: [n // 2 for n in ns])
        address = await server.listen("tcp://127.0.0.1:0")
        try:
            rc, out, err = await volley_run("call", "--connect", address, "shop", "total", '{"items":[1,2,3]}')
            assert rc == 0, err
            assert json.loads(out) == {"sum": 6, "n": 3}

            lines = "".join(f"{i}\n" for i in range(1000))
            rc, out, err = await volley_run("call", "--connect", address, "shop", "halve", "--batch", stdin=lines)
            assert rc == 0, err
            assert [int(x) for x in out.split()] == [i // 2 for i in range(1000)]

            rc, out, err = await volley_run("call", "--connect", address, "shop", "total", '{"items":[]}')
            assert rc != 0
            assert "Application (4): an order of nothing" in err, err

            rc, out, err = await volley_run("describe", address, "--json")
            assert rc == 0, err
            methods = {m["name"]: m for s in json.loads(out)["services"] if s["name"] == "shop" for m in s["methods"]}
            assert methods["halve"]["kind"] == "batch"
            assert methods["total"]["request"]["format"] == "json"
        finally:
            await server.shutdown()

    asyncio.run(main())


def test_volley_call_against_a_python_protobuf_service():
    """A protobuf method of the Python server, called from JSON through the descriptor set its
    reflection hands out: a call, a batch of 1,000 lines, an error."""
    pytest.importorskip("google.protobuf", reason="the protobuf package is not installed")
    from test_protobuf import shop_descriptor_set

    classes = volley.protobuf_classes(shop_descriptor_set())
    Order, Receipt = classes["shop.v1.Order"], classes["shop.v1.Receipt"]
    buy = Method("shop.v1", "buy", volley.Protobuf(Order), volley.Protobuf(Receipt))

    def priced(o):
        if o.qty == 0:
            raise ApplicationError("qty must be at least 1")
        return Receipt(id=o.id, total_cents=350 * o.qty, note=o.coupon)

    async def main():
        server = Server().handle(buy, priced)
        address = await server.listen("tcp://127.0.0.1:0")
        try:
            rc, out, err = await volley_run("call", "--connect", address, "shop.v1", "buy", '{"id":7,"sku":"tea","qty":2}')
            assert rc == 0, err
            # Protobuf's JSON mapping: a uint64 as a string, a field at its default left out.
            assert json.loads(out) == {"id": 7, "totalCents": "700"}

            lines = "".join(f'{{"id":{i},"sku":"tea","qty":1,"coupon":"c{i}"}}\n' for i in range(1, 1001))
            rc, out, err = await volley_run("call", "--connect", address, "shop.v1", "buy", "--batch", stdin=lines)
            assert rc == 0, err
            got = [json.loads(line) for line in out.splitlines()]
            assert got == [{"id": i, "totalCents": "350", "note": f"c{i}"} for i in range(1, 1001)]

            rc, out, err = await volley_run("call", "--connect", address, "shop.v1", "buy", '{"id":1,"qty":0}')
            assert rc != 0 and out == ""
            assert "Application (4): qty must be at least 1" in err, err
            rc, out, err = await volley_run("call", "--connect", address, "shop.v1", "buy", '{"sku":7}')
            assert rc != 0 and "not a shop.v1.Order" in err, err
        finally:
            await server.shutdown()

    asyncio.run(main())
