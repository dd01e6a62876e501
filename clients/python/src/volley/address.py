"""Addresses (PROTOCOL.md §2): ``tcp://HOST:PORT``, ``tls://HOST:PORT``, ``unix:///PATH``.

``inproc://`` names a server inside a Rust process and carries no bytes, so it cannot be
reached from Python.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Address:
    scheme: str  # "tcp", "tls" or "unix"
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse(addr: str) -> Address:
    scheme, sep, rest = addr.partition("://")
    if not sep:
        raise UsageError(f"invalid address {addr!r}: expected SCHEME://… (tcp, tls or unix)")
    if scheme == "unix":
        if not rest.startswith("/"):
            raise UsageError(f"invalid address {addr!r}: a unix socket path must be absolute (unix:///path)")
        return Address("unix", path=rest)
    if scheme in ("tcp", "tls"):
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            port = tail[1:] if tail.startswith(":") else ""
        else:
            host, _, port = rest.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise UsageError(f"invalid address {addr!r}: expected {scheme}://HOST:PORT")
        return Address(scheme, host=host, port=int(port))
    if scheme == "inproc":
        raise UsageError(f"invalid address {addr!r}: inproc:// lives inside a Rust process; use unix or tcp")
    raise UsageError(f"invalid address {addr!r}: unknown scheme {scheme!r} (tcp, tls or unix)")


def client_ssl(address: Address, ssl: ssl_module.SSLContext | None) -> ssl_module.SSLContext | None:
    """The TLS context to connect with: the one given, or the system's defaults for tls://."""
    if address.scheme != "tls":
        return None
    return ssl or ssl_module.create_default_context()


async def open_connection(address: Address, factory, ssl: ssl_module.SSLContext | None = None):
    """Connects and returns ``(transport, protocol)``; TCP_NODELAY on tcp and tls (§13)."""
    loop = asyncio.get_running_loop()
    if address.scheme == "unix":
        return await loop.create_unix_connection(factory, address.path)
    ctx = client_ssl(address, ssl)
    transport, protocol = await loop.create_connection(
        factory, address.host, address.port, ssl=ctx, server_hostname=address.host if ctx else None
    )
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return transport, protocol
