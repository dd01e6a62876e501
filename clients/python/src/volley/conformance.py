"""The Python client's driver for the conformance suite's client side.

``volley conformance client ADDR`` (the Rust runner) listens at ADDR and plays the server's
side of the cases of tests/conformance/wire.json. This driver asks it for each case's call
(``conformance``/``next``), makes that call with a fresh ``Client`` (so on a fresh
connection), and reports how it ended (``conformance``/``report``): ``{"ok": hex}``,
``{"code": n}`` for an error reply, ``{"timeout": text}``, ``{"failed": text}`` for any other
failure, or ``{"items": [...]}`` for a batch. A stream case (its call has ``stream``; the
runner's crates/volley-conformance/src/client_streams.rs says what each field asks) is reported
as ``{"items": [...], "end": ...}`` (shapes 1 and 3) or as a call's result (shape 2), with
``"then"`` for a call made after it. Run it as::

    python -m volley.conformance tcp://127.0.0.1:PORT

It exits with status 1 if the runner refused any outcome (the runner prints which and why).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .client import Client
from .codec import Method
from .errors import CallTimeoutError, ProtocolViolationError, RemoteError, VolleyError

NEXT = Method("conformance", "next")
REPORT = Method("conformance", "report")


def outcome(result: object) -> dict:
    """The report form of one call's (or one batch item's) result."""
    if isinstance(result, bytes):
        return {"ok": result.hex()}
    if isinstance(result, RemoteError) and not isinstance(result, ProtocolViolationError):
        return {"code": result.code}
    if isinstance(result, CallTimeoutError):
        return {"timeout": str(result)}
    return {"failed": f"{type(result).__name__}: {result}"}


async def play(address: str, call: dict, timeout: float) -> dict:
    method = Method(call["service"], call["method"])
    try:
        client = await Client.connect(address, timeout=timeout)
    except (VolleyError, OSError) as e:
        return {"failed": f"connecting: {e}"}
    try:
        if "stream" in call:
            return await play_stream(client, method, call)
        if "items" in call:
            results = await client.call_batch(method, [bytes.fromhex(i) for i in call["items"]])
            return {"items": [outcome(r) for r in results]}
        try:
            return outcome(await client.call(method, bytes.fromhex(call["payload"])))
        except VolleyError as e:
            return outcome(e)
    finally:
        await client.close()


async def play_stream(client: Client, method: Method, call: dict) -> dict:
    """Plays a stream case's call on ``client``."""
    shape = call["stream"]
    timeout = call["timeout_ms"] / 1000 if "timeout_ms" in call else None
    window = {"window": call["window"]} if "window" in call else {}
    sends = [bytes.fromhex(i) for i in call.get("send", [])]
    if shape == "client":
        try:
            result = outcome(await client.client_stream(method, sends, timeout=timeout))
        except VolleyError as e:
            result = outcome(e)
    else:
        if shape == "both":
            items = client.bidi_stream(method, sends, timeout=timeout, **window)
        else:
            items = client.stream(method, bytes.fromhex(call["payload"]), timeout=timeout, **window)
        result = {"items": [], "end": "ok"}
        take = call.get("take")
        try:
            while True:
                if take is not None and len(result["items"]) == take:
                    await items.aclose()
                    result["end"] = "dropped"
                    break
                try:
                    result["items"].append(outcome(await items.__anext__()))
                except StopAsyncIteration:
                    break
        except VolleyError as e:
            result["end"] = outcome(e)
    if "then_call" in call:
        then = call["then_call"]
        try:
            reply = await client.call(Method(then["service"], then["method"]), bytes.fromhex(then["payload"]))
            result["then"] = outcome(reply)
        except VolleyError as e:
            result["then"] = outcome(e)
    return result


async def drive(address: str, timeout: float = 30.0) -> list[str]:
    """Plays every case the runner at ``address`` hands out; returns the refused ones."""
    refused = []
    async with await Client.connect(address) as control:
        while case := await control.call(NEXT, b""):
            call = json.loads(case)
            report = await play(address, call, timeout)
            try:
                await control.call(REPORT, json.dumps(report).encode())
            except RemoteError as e:
                refused.append(f"{call['name']}: {e.message}")
    return refused


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m volley.conformance",
        description="Plays the client side of the conformance cases that a `volley conformance client "
        "ADDR` runner hands out, and exits with status 1 if it refused any outcome.",
    )
    parser.add_argument("address", metavar="ADDR", help="the runner's address, e.g. tcp://127.0.0.1:7500")
    parser.add_argument("--timeout", type=float, default=30.0, help="each case's call timeout in seconds (30)")
    args = parser.parse_args(argv)
    try:
        refused = asyncio.run(drive(args.address, args.timeout))
    except (VolleyError, ValueError) as e:
        print(f"python -m volley.conformance: {e}", file=sys.stderr)
        return 2
    for line in refused:
        print(f"refused: {line}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
