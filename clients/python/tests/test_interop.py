"""Python and Rust in both directions, on tcp and unix, over the interop contract of
crates/volley-conformance (echo/echo and echo/fail_odd): the Rust client (`volley
conformance interop`) against the Python server, the Python client against the Rust server
(`volley conformance serve`), and each side's server going away mid-batch."""

from __future__ import annotations

import asyncio
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import volley
from volley import Method

from conftest import START_DEADLINE, Running, python_server, volley_bin
from interop_server import ECHO, FAIL_ODD, interop_server

TOKEN = "s3cret"
HERE = Path(__file__).resolve().parent


def listen_address(transport: str, tmp_path: Path) -> str:
    return "tcp://127.0.0.1:0" if transport == "tcp" else f"unix://{tmp_path}/interop.sock"


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_rust_client_passes_the_interop_checks_against_the_python_server(tmp_path, transport):
    with python_server(lambda: interop_server(TOKEN), listen_address(transport, tmp_path)) as (address,):
        out = subprocess.run(
            [volley_bin(), "conformance", "interop", address, "--token", TOKEN],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 cases, 0 failed" in out.stdout, out.stdout


def rust_server(listen: str) -> Running:
    return Running(["conformance", "serve", listen, "--token", TOKEN], r"conformance server on (\S+)")


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_python_client_against_the_rust_server(tmp_path, transport):
    server = rust_server(listen_address(transport, tmp_path))
    rng = random.Random()

    async def main():
        async with await volley.Client.connect(server.address, token=TOKEN, timeout=120) as client:
            sizes = [0, 1, 255, 65_536, 1 << 20] + [rng.randrange(1 << 20) for _ in range(6)]
            for n in sizes:
                payload = rng.randbytes(n)
                assert await client.call(ECHO, payload) == payload, n
            payloads = [rng.randbytes(i % 97) for i in range(1000)]
            assert await asyncio.gather(*(client.call(ECHO, p) for p in payloads)) == payloads
            items = [i.to_bytes(4, "little") for i in range(10_000)]
            results = await client.call_batch(FAIL_ODD, items)
            assert len(results) == len(items)
            for i, (item, r) in enumerate(zip(items, results)):
                if i % 2:
                    assert isinstance(r, volley.ApplicationError) and r.message == f"{i % 256} is odd", (i, r)
                else:
                    assert r == item, (i, r)
            with pytest.raises(volley.UnknownServiceError):
                await client.call(Method("no-such-service", "echo"), b"")
            with pytest.raises(volley.UnknownMethodError):
                await client.call(Method("echo", "no-such-method"), b"")
        for bad in ("wrong", None):
            async with volley.Client(server.address, token=bad) as client:
                with pytest.raises(volley.UnauthenticatedError):
                    await client.call(ECHO, b"x")

    try:
        asyncio.run(main())
    finally:
        server.stop()


def test_the_rust_server_going_away_mid_batch_ends_every_python_call_once():
    server = rust_server("tcp://127.0.0.1:0")
    try:

        async def main():
            client = await volley.Client.connect(server.address, token=TOKEN, timeout=120)
            assert await client.call(ECHO, b"up") == b"up"
            # Stopped, the server reads nothing: everything sent now is still outstanding
            # when it dies.
            server.proc.send_signal(signal.SIGSTOP)
            batch = asyncio.ensure_future(client.call_batch(ECHO, [bytes([i % 256]) for i in range(10_000)]))
            singles = [asyncio.ensure_future(client.call(ECHO, bytes([i]))) for i in range(100)]
            deadline = time.monotonic() + START_DEADLINE
            while len(client._conn.pending) < 100 + 10_000 // 128 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            server.proc.kill()
            results = await batch
            assert len(results) == 10_000
            assert all(isinstance(r, volley.ConnectionLostError) for r in results), results[:3]
            ended = await asyncio.gather(*singles, return_exceptions=True)
            assert all(isinstance(r, volley.ConnectionLostError) for r in ended), ended[:3]
            # Killed, not going away: each of them may have run.
            assert not any(r.never_ran for r in results + ended)
            assert not client._conn.pending
            await client.close()

        asyncio.run(main())
    finally:
        server.stop()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_python_server_going_away_mid_batch_ends_every_rust_call_once(tmp_path, transport):
    """`volley conformance going-away` (the Rust client) streams a 10,000-item batch through
    the Python server process; once half is answered the server is stopped, 100 single calls
    and more chunks are sent, and the server is killed: the check asserts per call that each
    ended once, with its own reply or a connection error (and that some did fail)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "interop_server.py"), listen_address(transport, tmp_path), TOKEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = proc.stdout.readline().split()[-1]
        check = subprocess.Popen(
            [volley_bin(), "conformance", "going-away", address, "--token", TOKEN, "--items", "10000"]
            + ["--singles", "100"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        asked = check.stdout.readline()
        assert "5000 of 10000 items answered: stop the server" in asked, asked + check.stderr.read()
        proc.send_signal(signal.SIGSTOP)
        check.stdin.write("stopped\n")
        check.stdin.flush()
        asked = check.stdout.readline()
        assert "calls in flight: make the server go away" in asked, asked + check.stderr.read()
        proc.kill()
        proc.wait()
        check.stdin.write("killed\n")
        check.stdin.flush()
        out, err = check.communicate(timeout=300)
        assert check.returncode == 0, out + err
        assert "1 cases, 0 failed" in out, out
        assert re.search(
            r"10100 calls \(10000 batch items, 100 single\): \d+ replied, [1-9]\d* connection errors", out
        ), out
    finally:
        proc.kill()
        proc.wait()
