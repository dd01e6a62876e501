"""Reflection (``volley.reflect``): what a server serves, as the Rust server reports it.

Every ``Server`` answers ``volley.reflect/list`` (an empty request) with a JSON catalog of its
services, their methods, each method's handler kind and the tier, format and type name of its
request and reply (PROTOCOL.md, *Reflection*), unless made with ``Server(reflection=False)``.
``volley describe`` prints it and ``volley call`` reads it to encode JSON typed at a shell.
"""

from __future__ import annotations

from typing import Any

from .codec import JSON, UNIT, Codec, Method

SERVICE = "volley.reflect"
LIST = Method(SERVICE, "list", UNIT, JSON)


def type_info(codec: Codec) -> dict[str, Any]:
    """What reflection says of a type travelling with ``codec``."""
    info: dict[str, Any] = {"name": codec.type_name, "tier": codec.tier, "format": codec.format}
    protobuf = getattr(codec, "reflection", None)
    if protobuf is not None:
        info["protobuf"] = protobuf()
    return info


def catalog(routes: dict) -> dict[str, Any]:
    """The catalog of ``routes`` (``(service, method) -> Route``), sorted by name."""
    services: dict[str, list] = {}
    for (service, name), route in sorted(routes.items()):
        services.setdefault(service, []).append(
            {
                "name": name,
                "kind": "batch" if route.batch else "single",
                "request": type_info(route.method.request),
                "reply": type_info(route.method.reply),
            }
        )
    return {"services": [{"name": s, "methods": m} for s, m in services.items()]}
