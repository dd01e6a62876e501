"""The Python registry client against the Rust controller (`volley controller`)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

import volley
from volley.errors import CodecError
from volley.registry import Instance, InstanceSpec, Registry, host_id

from conftest import Running, run_bench, serve_echo


def run(coro):
    return asyncio.run(coro)


def test_register_resolve_watch_and_deregister(controller):
    async def main():
        async with await Registry.connect(controller.address) as registry:
            assert registry.client_id != 0
            before = await registry.resolve("search")
            assert not before.known and before.instances == ()

            spec = InstanceSpec("search", "tcp://10.0.0.5:7000", weight=2, metadata={"zone": "eu-1"})
            # A watch from the state before, outstanding while the registration happens.
            watching = asyncio.create_task(registry.watch("search", before, timeout=30))
            lease = await registry.register([spec], ttl=10.0)
            assert lease.lease != 0 and len(lease.instance_ids) == 1
            changed = await watching
            assert changed.known and changed.revision > before.revision
            assert [(i.address, i.weight, i.metadata) for i in changed.instances] == [
                ("tcp://10.0.0.5:7000", 2, {"zone": "eu-1"})
            ]
            assert changed.instances[0].id == lease.instance_ids[0]
            assert changed.instances[0].lease == lease.lease

            # Nothing changes: a short watch answers with the same revision.
            same = await registry.watch("search", changed, timeout=0.05)
            assert same.revision == changed.revision

            assert await lease.renew() is True
            watching = asyncio.create_task(registry.watch("search", changed, timeout=30))
            assert await lease.deregister() == 1
            gone = await watching
            assert gone.known and gone.instances == () and gone.revision > changed.revision

            info = await registry.info()
            assert info == {"registration_credential": False, "token": False, "durable": False}

    run(main())


def test_a_lease_keeps_itself_alive_past_its_ttl(controller):
    """With a 300 ms ttl, the instance is still listed after several ttls: the background
    renewals keep it. Once renewing stops, the controller drops it."""

    async def main():
        async with await Registry.connect(controller.address) as registry:
            lease = await registry.register([InstanceSpec("kept", "tcp://10.0.0.6:1")], ttl=0.3)
            resolved = await registry.resolve("kept")
            for _ in range(4):
                resolved = await registry.watch("kept", resolved, timeout=0.5)
                assert len(resolved.instances) == 1, resolved
            await lease.stop()
            while resolved.instances:  # lapses within about one ttl
                resolved = await registry.watch("kept", resolved, timeout=30)

    run(main())


def test_a_renewal_of_an_unknown_lease_registers_again(controller):
    async def main():
        async with await Registry.connect(controller.address) as registry:
            lease = await registry.register([InstanceSpec("again", "tcp://10.0.0.7:1")], ttl=10.0)
            await lease.stop()
            first = lease.lease
            other = await Registry.connect(controller.address)
            assert await other._call(volley.registry.DEREGISTER, {"lease": first}) == 1
            await other.close()
            assert await lease.renew() is False  # the controller no longer knows it
            assert lease.lease != first and lease.registrations == 2
            assert [i.lease for i in (await registry.resolve("again")).instances] == [lease.lease]
            await lease.deregister()

    run(main())


def test_a_registration_credential_is_required_when_configured():
    c = Running(
        ["controller", "--listen", "tcp://127.0.0.1:0", "--registration-credential", "let-me-in"],
        r"registry controller on ([^\s,]+)",
    )
    try:

        async def main():
            spec = InstanceSpec("guarded", "tcp://10.0.0.8:1")
            async with await Registry.connect(c.address) as registry:
                with pytest.raises(volley.UnauthenticatedError):
                    await registry.register([spec])
            async with await Registry.connect(c.address, credential="let-me-in") as registry:
                lease = await registry.register([spec])
                await lease.deregister()

        run(main())
    finally:
        c.stop()


def test_a_rust_client_calls_a_service_python_registered(controller):
    """Python registers a Rust echo server (serving the name, not registering it itself);
    `volley bench --registry` (the Rust ServiceClient) resolves the name and calls it."""
    server = serve_echo("--name", "pyregistered")
    try:

        async def main():
            async with await Registry.connect(controller.address) as registry:
                lease = await registry.register([InstanceSpec("pyregistered", server.address)])
                report = await asyncio.to_thread(
                    run_bench, "--registry", controller.address, "--service", "pyregistered"
                )
                assert report["registry_mode"] == "direct", report
                await lease.deregister()
                return report

        run(main())
    finally:
        server.stop()


def test_same_host_fields_are_read_and_written_and_left_out_when_empty():
    """Revision 2 of §16.2: ``host_id`` and ``local_addresses``, optional both ways."""
    plain = InstanceSpec("s", "tcp://h:1")
    assert plain.to_json() == {"service": "s", "address": "tcp://h:1", "weight": 1, "metadata": {}}
    spec = InstanceSpec("s", "tcp://h:1", host_id="boot/net:[1]", local_addresses=("shm://s",))
    assert spec.to_json() == {**plain.to_json(), "host_id": "boot/net:[1]", "local_addresses": ["shm://s"]}
    listed = {"id": 1, "lease": 2, "service": "s", "address": "tcp://h:1"}
    old = Instance.from_json(listed)
    assert (old.host_id, old.local_addresses) == ("", ())
    new = Instance.from_json({**listed, "host_id": "h", "local_addresses": ["shm://s", "unix:///x"]})
    assert (new.host_id, new.local_addresses) == ("h", ("shm://s", "unix:///x"))
    with pytest.raises(CodecError):
        Instance.from_json({**listed, "local_addresses": "shm://s"})
    with pytest.raises(CodecError):
        Instance.from_json({**listed, "local_addresses": [1]})


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="shm:// and the host id are Linux's")


@linux_only
def test_a_rust_server_with_a_shm_address_resolves_in_python_and_is_called_at_its_address(controller):
    """`serve-echo --listen-local` registers tcp with shm beside it: Python reads both (and
    computes the same host id as Rust), and calls the tcp address, the one it can dial."""
    name, local = f"shm-echo-{os.getpid()}", f"shm://py-resolve-{os.getpid()}"
    server = serve_echo("--name", name, "--listen-local", local, "--registry", controller.address)
    try:

        async def main():
            async with await Registry.connect(controller.address) as registry:
                found = await registry.resolve(name)
                while not found.instances:
                    found = await registry.watch(name, found, timeout=30)
                [instance] = found.instances
                assert instance.address == server.address
                assert instance.local_addresses == (local,)
                assert instance.host_id == host_id() is not None
                echo = await registry.service(name)
                assert await echo.call(volley.Method(name, "echo"), b"over tcp") == b"over tcp"

        run(main())
    finally:
        server.stop()


@linux_only
def test_a_shm_address_python_registers_is_taken_by_a_rust_client_on_this_host(controller):
    """Python registers a Rust echo server's tcp address with its shm address beside it;
    `volley bench --prefer-local` (the Rust ServiceClient) calls over shm."""
    local = f"shm://py-register-{os.getpid()}"
    server = serve_echo("--name", "pyshm", "--listen-local", local)
    try:

        async def main():
            async with await Registry.connect(controller.address) as registry:
                spec = InstanceSpec("pyshm", server.address, host_id=host_id(), local_addresses=(local,))
                lease = await registry.register([spec])
                args = ("--registry", controller.address, "--service", "pyshm")
                for prefer, transport in ((True, "shm"), (False, "tcp")):
                    extra = ("--prefer-local",) if prefer else ()
                    report = await asyncio.to_thread(run_bench, *args, *extra)
                    assert report["transport"] == transport, report
                await lease.deregister()

        run(main())
    finally:
        server.stop()
