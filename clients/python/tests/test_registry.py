"""The Python registry client against the Rust controller (`volley controller`)."""

from __future__ import annotations

import asyncio
import pytest

import volley
from volley.registry import InstanceSpec, Registry

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
