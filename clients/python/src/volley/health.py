"""The health service ``volley.health`` (PROTOCOL.md §20): whether a server, or one of its
services, takes new calls.

    from volley import health
    answer = await client.call(health.CHECK, {"service": "echo"})   # {"status": "serving"}

Every ``Server`` answers it: ``serving``, ``not_serving`` (its owner said so with
``server.set_serving``) or ``draining`` (its shutdown has begun). ``watch`` is a long poll
answered when the status is no longer the caller's ``last``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .codec import JSON, Method
from .errors import Code, RemoteError

SERVICE = "volley.health"
CHECK = Method(SERVICE, "check", JSON, JSON)
WATCH = Method(SERVICE, "watch", JSON, JSON)

SERVING = "serving"
NOT_SERVING = "not_serving"
DRAINING = "draining"

# Longest a watch is held, and most watches held at once (beyond it a watch is answered at
# once): as the Rust server.
MAX_WATCH_S = 60.0
MAX_WATCHERS = 1024


class Health:
    """A server's health: draining once it shuts down, and services marked not serving."""

    def __init__(self, services: set[str]):
        self._services = services
        self._not_serving: dict[str, str] = {}
        self._draining = False
        self._changed = asyncio.Event()
        self._watchers = 0

    def _bump(self) -> None:
        # Wake every held watch; each looks again and waits on a fresh event if nothing it
        # cares about changed.
        self._changed.set()
        self._changed = asyncio.Event()

    def start_draining(self) -> None:
        if not self._draining:
            self._draining = True
            self._bump()

    def set_serving(self, service: str, serving: bool, reason: str = "") -> None:
        before = self._not_serving.get(service)
        if serving:
            self._not_serving.pop(service, None)
        else:
            self._not_serving[service] = reason
        if self._not_serving.get(service) != before:
            self._bump()

    def status(self, service: str) -> dict[str, str]:
        if service and service not in self._services:
            raise RemoteError(f'no service named "{service}"', Code.UNKNOWN_SERVICE)
        if self._draining:
            return {"status": DRAINING, "reason": "the server is stopping"}
        if service in self._not_serving:
            return {"status": NOT_SERVING, "reason": self._not_serving[service]}
        return {"status": SERVING}

    def check(self, request: Any) -> dict[str, str]:
        return self.status(_service(request))

    async def watch(self, request: Any) -> dict[str, str]:
        service = _service(request)
        last = request.get("last") if isinstance(request, dict) else None
        timeout = min(float(request.get("timeout_ms", 30_000)) / 1000.0, MAX_WATCH_S) if isinstance(request, dict) else 0.0
        now = self.status(service)
        if last != now["status"] or now["status"] == DRAINING or timeout <= 0 or self._watchers >= MAX_WATCHERS:
            return now
        self._watchers += 1
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while True:
                left = end - loop.time()
                if left <= 0:
                    return self.status(service)
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    return self.status(service)
                now = self.status(service)
                if now["status"] != last or now["status"] == DRAINING:
                    return now
        finally:
            self._watchers -= 1


def _service(request: Any) -> str:
    service = request.get("service", "") if isinstance(request, dict) else ""
    if not isinstance(service, str):
        raise RemoteError("health: service must be a string", Code.BAD_REQUEST)
    return service
