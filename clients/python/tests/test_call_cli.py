"""``volley call`` and ``volley describe`` (the Rust binary) against a Python server: a JSON
method and a plain one, found through the server's reflection: a call, a batch of 1,000
lines, an error."""

from __future__ import annotations

import asyncio
import json

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
