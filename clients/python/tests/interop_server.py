"""The Python server of the interop contract (crates/volley-conformance's interop module):
``echo``/``echo`` and ``echo``/``fail_odd``. Run as a process by the tests that kill it:
``python interop_server.py ADDRESS [TOKEN]`` prints ``serving ADDRESS`` once listening."""

from __future__ import annotations

import asyncio
import sys

from volley import ApplicationError, Method, Server

ECHO = Method("echo", "echo")
FAIL_ODD = Method("echo", "fail_odd")


def fail_odd(payload: bytes) -> bytes:
    if payload and payload[0] % 2:
        raise ApplicationError(f"{payload[0]} is odd")
    return payload


def interop_server(token: str | None = None) -> Server:
    return Server(token=token).handle(ECHO, lambda p: p).handle(FAIL_ODD, fail_odd)


async def main(address: str, token: str | None) -> None:
    server = interop_server(token)
    print(f"serving {await server.listen(address)}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
