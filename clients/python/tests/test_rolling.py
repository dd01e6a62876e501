"""A Python client keeps calling through a rolling restart of Rust servers (`volley serve-echo`
registered with `volley controller`, each stopped with SIGTERM and started again as a new
process) without a single error. The servers stop with no grace (`--grace 0`), the worst case:
each deregisters and goes away with GoAway(ShuttingDown) at once, before the client's watch
has moved it, so calls are in flight and new ones find the port closed. A call left unanswered
at the go-away never ran, nor did one whose connection could not be made, so the client sends
it to the other instance whatever the method (PROTOCOL.md §9.6.2); without that, calls fail."""

from __future__ import annotations

import asyncio
import signal
import time

import volley
from volley.registry import Registry

from conftest import START_DEADLINE, serve_echo

ECHO = volley.Method("echo", "echo")
CALLERS = 8


async def until(cond, what: str) -> None:
    deadline = time.monotonic() + START_DEADLINE
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def registered(controller_address: str):
    """A `serve-echo` registered with the controller, and the address it registered."""
    server = serve_echo("--registry", controller_address, "--grace", "0")
    server.wait_for_output(r"registered echo at (\S+)")
    return server


def test_a_python_client_calls_through_a_rolling_restart_without_an_error(controller):
    servers = [registered(controller.address) for _ in range(2)]

    async def main():
        async with await Registry.connect(controller.address) as registry:
            # A fresh controller settles for a lease's time, and clients keep instances it no
            # longer lists meanwhile: wait it out, so the restarts are what is tested.
            deadline = time.monotonic() + 2 * START_DEADLINE
            while True:
                found = await registry.resolve("echo")
                if not found.settling and len(found.instances) == 2:
                    break
                assert time.monotonic() < deadline, f"the controller still settles: {found}"
                await asyncio.sleep(0.05)

            echo = await registry.service("echo")
            stop = asyncio.Event()
            errors: list[str] = []
            done = [0]

            async def caller(n: int) -> None:
                i = 0
                while not stop.is_set():
                    payload = f"caller {n} call {i}".encode()
                    i += 1
                    try:
                        assert await echo.call(ECHO, payload) == payload  # not idempotent
                        done[0] += 1
                    except volley.VolleyError as e:
                        errors.append(repr(e))

            callers = [asyncio.create_task(caller(n)) for n in range(CALLERS)]
            try:
                for k, old in enumerate(list(servers)):
                    start = done[0]
                    await until(lambda: done[0] >= start + 100, "calls before the stop")
                    old.proc.send_signal(signal.SIGTERM)
                    stopping = done[0]
                    assert await asyncio.to_thread(old.proc.wait, 60) == 0, old.output()
                    new = await asyncio.to_thread(registered, controller.address)
                    # Calls went on while the instance was away.
                    assert done[0] > stopping
                    servers[k] = new
                    old.stop()
                    await until(lambda: new.address in {i.address for i in echo.instances}, "the new instance")
                    start = done[0]
                    await until(lambda: done[0] >= start + 100, "calls after the restart")
            finally:
                stop.set()
                await asyncio.gather(*callers)
                await echo.close()
            assert errors == [], f"{len(errors)} calls failed, the first: {errors[:3]}"
            assert done[0] >= 400

    try:
        asyncio.run(main())
    finally:
        for s in servers:
            s.stop()
