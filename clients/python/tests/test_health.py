"""The health service ``volley.health`` (PROTOCOL.md §20) across languages: the Python server
answers it (to the Python client and to the Rust `volley health`), and the Python client asks
the Rust server."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

import volley
from volley import Method, Server, UnknownServiceError, health

from conftest import volley_bin

ECHO = Method("echo", "echo")


def run(coro):
    return asyncio.run(coro)


def test_the_python_server_answers_check_and_watch_and_drains():
    async def main():
        server = Server().handle(ECHO, lambda p: p)
        address = await server.listen("tcp://127.0.0.1:0")
        async with await volley.Client.connect(address) as client:
            assert await client.call(health.CHECK, {"service": "echo"}) == {"status": "serving"}
            assert (await client.call(health.CHECK, {}))["status"] == "serving"
            with pytest.raises(UnknownServiceError):
                await client.call(health.CHECK, {"service": "nothing"})

            server.set_serving("echo", False, "its database is down")
            answer = await client.call(health.CHECK, {"service": "echo"})
            assert answer == {"status": "not_serving", "reason": "its database is down"}

            # A watch is held while the status is the caller's, answered when it changes.
            held = asyncio.ensure_future(
                client.call(health.WATCH, {"service": "echo", "last": "not_serving", "timeout_ms": 60_000})
            )
            await asyncio.sleep(0.05)
            assert not held.done()
            server.set_serving("echo", True)
            assert (await asyncio.wait_for(held, 30))["status"] == "serving"

            # A shutdown answers a held watch at once with draining.
            held = asyncio.ensure_future(
                client.call(health.WATCH, {"service": "echo", "last": "serving", "timeout_ms": 60_000})
            )
            await asyncio.sleep(0.05)
            stopping = asyncio.ensure_future(server.shutdown())
            assert (await asyncio.wait_for(held, 30))["status"] == "draining"
            await asyncio.wait_for(stopping, 30)

    run(main())


def test_the_rust_cli_asks_the_python_server():
    async def main():
        server = Server().handle(ECHO, lambda p: p)
        async with server:
            address = await server.listen("tcp://127.0.0.1:0")

            def ask(*args: str) -> subprocess.CompletedProcess:
                return subprocess.run(
                    [volley_bin(), "health", "--connect", address, *args], capture_output=True, text=True, timeout=60
                )

            serving = await asyncio.to_thread(ask, "echo")
            assert serving.returncode == 0, serving.stderr
            assert "serving" in serving.stdout
            server.set_serving("echo", False, "warming up")
            not_serving = await asyncio.to_thread(ask, "echo")
            assert not_serving.returncode == 1, not_serving.stderr
            assert "not_serving (warming up)" in not_serving.stdout

    run(main())


def test_the_python_client_asks_the_rust_server(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            assert (await client.call(health.CHECK, {"service": "echo"}))["status"] == "serving"
            answer = await client.call(health.WATCH, {"service": "echo", "last": "draining", "timeout_ms": 1000})
            assert answer["status"] == "serving", "a stale last status is answered at once"

    run(main())
