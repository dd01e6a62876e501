"""Fixtures: the Rust `volley` binary, started on 127.0.0.1 (port 0: the system picks a free
one) for each test that needs it, and stopped after.

The binary is found in ``$VOLLEY_BIN``, else in the repository's ``target/debug/volley``
(``cargo build -p volley-cli``). Without it the tests fail, naming the fix: they are never
skipped, so a run that passes has talked to a real Rust peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONFORMANCE = REPO / "tests" / "conformance"
# Generous: a 2-core machine shared with builds can stall a process start for seconds.
START_DEADLINE = 60.0


def volley_bin() -> str:
    path = os.environ.get("VOLLEY_BIN") or str(REPO / "target" / "debug" / "volley")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no volley binary at {path}: build it with `cargo build -p volley-cli` "
            "(or set VOLLEY_BIN), or run scripts/test, which does both",
            pytrace=False,
        )
    return path


class Running:
    """One `volley` process and the address it printed once it was listening."""

    def __init__(self, args: list[str], ready: str):
        self.log = tempfile.NamedTemporaryFile(prefix="volley-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([volley_bin(), *args], stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.address = self.wait_for_output(ready).group(1)
        except AssertionError:
            self.stop()
            raise

    def output(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def wait_for_output(self, pattern: str) -> re.Match:
        """The first match of ``pattern`` in the process's output, once it is there."""
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            # Only whole lines: the process may be caught halfway through writing one, and a
            # pattern matching the half ("on tcp://") would hand out a truncated address.
            out = self.output()
            m = re.search(pattern, out[: out.rfind("\n") + 1])
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"volley did not print {pattern!r} in time; its output:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # graceful: it deregisters and drains
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def serve_echo(*extra: str, listen: str = "tcp://127.0.0.1:0") -> Running:
    return Running(["serve-echo", "--listen", listen, *extra], r"serving \S+ on (\S+)")


@pytest.fixture
def echo_server():
    server = serve_echo()
    yield server
    server.stop()


@pytest.fixture
def controller():
    c = Running(["controller", "--listen", "tcp://127.0.0.1:0"], r"registry controller on ([^\s,]+)")
    yield c
    c.stop()


def run_bench(*args: str) -> dict:
    """Runs `volley bench ARGS` (the Rust client) briefly and returns its JSON report, after
    checking that it made calls and none failed."""
    out = subprocess.run(
        [volley_bin(), "bench", *args, "--duration", "0.3", "--warmup", "0.1", "--concurrency", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["calls"] > 0 and report["errors"] == 0, report
    return report


@contextlib.contextmanager
def python_server(make, *listens: str):
    """A Python server (``make()``) listening on each of ``listens``, served by an event loop
    on a thread of its own (as a separate process would be); yields the bound addresses."""
    started = threading.Event()
    state: dict = {}

    async def serve():
        server = make()
        state["addresses"] = [await server.listen(a) for a in listens]
        state["stop"] = asyncio.Event()
        started.set()
        await state["stop"].wait()
        await server.shutdown()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        assert started.wait(START_DEADLINE), "the Python server did not start"
        yield state["addresses"]
    finally:
        if "stop" in state:
            loop.call_soon_threadsafe(state["stop"].set)
        thread.join(60)
        loop.close()
