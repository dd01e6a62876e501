"""The Python server: called from the Python client, and from the Rust client (`volley bench`,
directly and by name through a Rust controller)."""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile

import pytest

import volley
from volley import JSON, ApplicationError, Method, Server, proto

from conftest import run_bench

ECHO = Method("echo", "echo")
HALVE = Method("math", "halve", volley.U32, volley.U32)
SUM = Method("math", "sum", JSON, JSON)


def halve(n: int) -> int:
    if n % 2:
        raise ApplicationError(f"{n} is odd")
    return n // 2


async def slow_echo(payload: bytes) -> bytes:
    await asyncio.sleep(0)
    return payload


def math_server() -> Server:
    server = Server()
    server.handle(ECHO, slow_echo)
    server.handle(HALVE, halve)
    server.handle(Method("math", "big", JSON, volley.RAW), lambda n: bytes(n))
    server.handle_batch(SUM, lambda lists: [sum(x) if isinstance(x, list) else ValueError("not a list") for x in lists])
    return server


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("scheme", ["tcp", "unix"])
def test_python_client_and_server_single_batch_and_failures_in_place(scheme):
    listen = "tcp://127.0.0.1:0" if scheme == "tcp" else f"unix://{tempfile.mkdtemp()}/py.sock"

    async def main():
        async with math_server() as server:
            address = await server.listen(listen)
            async with await volley.Client.connect(address) as client:
                payloads = [os.urandom(n) for n in (0, 1, 1000, 300_000)]
                assert await asyncio.gather(*(client.call(ECHO, p) for p in payloads)) == payloads
                assert await client.call(HALVE, 10) == 5
                with pytest.raises(ApplicationError, match="7 is odd"):
                    await client.call(HALVE, 7)
                results = await client.call_batch(HALVE, list(range(10_000)))
                for i, r in enumerate(results):
                    if i % 2:
                        assert isinstance(r, ApplicationError) and r.code == 4
                    else:
                        assert r == i // 2
                # A batch handler's exception for one item fails that item alone.
                three, also_three, failed = await client.call_batch(SUM, [[1, 2], [3], "x"])
                assert (three, also_three) == (3, 3)
                assert isinstance(failed, volley.PanickedError) and "not a list" not in failed.message

    run(main())


def test_the_python_server_answers_unknown_names_bad_payloads_and_pings():
    async def main():
        async with math_server() as server:
            address = await server.listen("tcp://127.0.0.1:0")
            async with await volley.Client.connect(address) as client:
                with pytest.raises(volley.UnknownServiceError, match='no service named "nope"'):
                    await client.call(Method("nope", "x"), b"")
                with pytest.raises(volley.UnknownMethodError, match='service "math" has no method "x"'):
                    await client.call(Method("math", "x"), b"")
                with pytest.raises(volley.BadRequestError):
                    await client.call(Method("math", "halve"), b"\x01\x02")  # 2 bytes, not a u32
                assert await client.ping() >= 0
                assert client.server_accepts_extensions is True
                with pytest.raises(volley.TooLargeError):
                    await client.call(Method("math", "big", JSON, volley.RAW), 1 << 24)  # 16 MiB + header
                assert await client.call(HALVE, 4) == 2  # and the connection goes on

    run(main())


def test_the_python_server_goes_away_on_a_malformed_frame():
    async def main():
        async with math_server() as server:
            address = await server.listen("tcp://127.0.0.1:0")
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            good = proto.frames([proto.request_message(1, 0, ECHO.names, b"ok")])[0]
            writer.write(proto.preamble() + good + struct.pack("<I", 1) + b"\x0b")
            received = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            from volley.decoder import Decoder

            decoder = Decoder()
            decoder.feed(received[8:])
            messages = decoder.messages()
            assert messages[0] == (proto.REPLY, 1, b"ok")
            assert messages[-1] == (proto.GOAWAY, volley.Code.PROTOCOL, "unknown message kind 0x0b")

    run(main())


def test_a_graceful_shutdown_answers_every_call_then_goes_away():
    async def main():
        release = asyncio.Event()

        async def held(payload: bytes) -> bytes:
            await release.wait()
            return payload

        server = Server().handle(ECHO, held)
        address = await server.listen("tcp://127.0.0.1:0")
        client = await volley.Client.connect(address)
        calls = [asyncio.ensure_future(client.call(ECHO, bytes([i]))) for i in range(50)]
        while not server.connections or not any(c.tasks for c in server.connections):
            await asyncio.sleep(0.01)
        shutting = asyncio.ensure_future(server.shutdown())
        await asyncio.sleep(0)
        release.set()
        await shutting
        assert await asyncio.gather(*calls) == [bytes([i]) for i in range(50)]
        with pytest.raises(volley.ConnectionLostError):
            await client.call(ECHO, b"after", timeout=30)
        await client.close()

    run(main())


def test_a_token_protects_the_python_server():
    async def main():
        async with Server(token="s3cret").handle(ECHO, slow_echo) as server:
            address = await server.listen("tcp://127.0.0.1:0")
            async with await volley.Client.connect(address, token="s3cret") as client:
                assert await client.call(ECHO, b"in") == b"in"
            async with await volley.Client.connect(address, token="nope") as client:
                with pytest.raises(volley.UnauthenticatedError):
                    await client.call(ECHO, b"out")

    run(main())


def test_the_rust_client_calls_the_python_server(controller):
    """`volley bench` (the Rust client) calls the Python echo service at its address, then by
    name through the Rust controller the Python server registered with."""

    async def main():
        # `volley bench --connect` calls echo/echo; through the registry, NAME/echo.
        server = Server().handle(ECHO, slow_echo).handle(Method("pyecho", "echo"), slow_echo)
        async with server:
            address = await server.listen("tcp://127.0.0.1:0")
            await asyncio.to_thread(run_bench, "--connect", address)
            lease = await server.register(controller.address, ttl=5.0)
            assert lease.lease != 0
            report = await asyncio.to_thread(run_bench, "--registry", controller.address, "--service", "pyecho")
            assert report["registry_mode"] == "direct", report

    run(main())


def test_a_handler_exception_reaches_the_caller_without_its_text_unless_exposed(caplog):
    """An unplanned exception is answered Panicked with a generic message (its text stays in
    the server's log); Server(expose_errors=True) sends its type and text."""
    LEAK = Method("leak", "single")
    LEAK_BATCH = Method("leak", "batch")

    def leaky(_: bytes) -> bytes:
        raise RuntimeError("password=hunter2 in /srv/app/config.py")

    async def main(expose: bool) -> list[volley.RemoteError]:
        server = Server(expose_errors=expose)
        server.handle(LEAK, leaky)
        server.handle_batch(LEAK_BATCH, lambda items: [leaky(i) for i in items])
        async with server:
            address = await server.listen("tcp://127.0.0.1:0")
            async with await volley.Client.connect(address) as client:
                with pytest.raises(volley.PanickedError) as single:
                    await client.call(LEAK, b"x")
                (item,) = await client.call_batch(LEAK_BATCH, [b"x"])
                return [single.value, item]

    with caplog.at_level("ERROR", logger="volley.server"):
        for failure in run(main(False)):
            assert isinstance(failure, volley.PanickedError)
            assert failure.message == volley.server.HANDLER_FAILED
    assert "hunter2" in caplog.text and "leak/single" in caplog.text
    for failure in run(main(True)):
        assert isinstance(failure, volley.PanickedError)
        assert "RuntimeError: password=hunter2" in failure.message


def test_the_readmes_serving_example_runs_as_written_and_stops_on_ctrl_c(tmp_path):
    """The README's serving example, run as a script: it serves the echo and a batch method
    until SIGINT, then shuts down gracefully (a caller connected then gets GoAway) and exits 0."""
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    serving = readme[readme.index("## Serving") :]
    code = re.search(r"```python\n(.*?)```", serving, re.S).group(1)
    script = tmp_path / "serve.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.match(r"serving on (\S+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")

        async def main():
            async with await volley.Client.connect(m.group(1)) as client:
                assert await client.call(ECHO, b"hi") == b"hi"
                top = Method("search", "top", JSON, JSON)
                assert await client.call_batch(top, ["a"]) == [{"query": "a", "hits": []}]
                proc.send_signal(signal.SIGINT)
                conn = client._conn
                await asyncio.wait_for(conn.closed, 60)
                assert conn.goaway is not None and conn.goaway[0] == volley.Code.SHUTTING_DOWN

        run(main())
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_reflection_lists_methods_kinds_and_formats():
    async def main():
        server = math_server()
        address = await server.listen("tcp://127.0.0.1:0")
        client = await volley.Client.connect(address)
        try:
            catalog = await client.call(volley.reflect.LIST, None)
        finally:
            await client.close()
            await server.shutdown()
        methods = {(s["name"], m["name"]): m for s in catalog["services"] for m in s["methods"]}
        assert sorted(methods) == [
            ("echo", "echo"),
            ("math", "big"),
            ("math", "halve"),
            ("math", "sum"),
            ("volley.reflect", "list"),
        ]
        assert methods[("math", "sum")]["kind"] == "batch"
        assert methods[("math", "sum")]["request"] == {"name": "object", "tier": "general", "format": "json"}
        assert methods[("math", "halve")]["reply"]["format"] == "u32"
        assert methods[("echo", "echo")]["kind"] == "single"
        assert methods[("echo", "echo")]["request"]["format"] == "bytes"
        assert server.services == {"echo", "math"}

    run(main())


def test_reflection_can_be_turned_off():
    async def main():
        server = Server(reflection=False).handle(ECHO, slow_echo)
        address = await server.listen("tcp://127.0.0.1:0")
        client = await volley.Client.connect(address)
        try:
            with pytest.raises(volley.RemoteError) as e:
                await client.call(volley.reflect.LIST, None)
            assert e.value.code == volley.Code.UNKNOWN_SERVICE
        finally:
            await client.close()
            await server.shutdown()

    run(main())
