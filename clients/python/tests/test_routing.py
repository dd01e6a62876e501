"""Calls by name: the Python ServiceClient (direct) and relayed calls through the Rust
controller, over Python servers that each answer with their own name."""

from __future__ import annotations

import asyncio
import time

import pytest

import volley
from volley import InstanceSpec, Method, Registry, Server

WHO = Method("svc", "who", volley.RAW, volley.UTF8)


async def start_servers(names: list[str]) -> list[tuple[Server, str]]:
    out = []
    for name in names:
        server = Server().handle(WHO, lambda _payload, name=name: name)
        out.append((server, await server.listen("tcp://127.0.0.1:0")))
    return out


async def wait_until(condition, what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_round_robin_by_weight_and_key_routing_agree_with_the_rust_controller(controller):
    async def main():
        servers = await start_servers(["a", "b", "c"])
        registry = await Registry.connect(controller.address)
        weights = [1, 2, 1]
        specs = [InstanceSpec("svc", addr, weight=w) for (_, addr), w in zip(servers, weights)]
        lease = await registry.register(specs)
        svc = await registry.service("svc")
        try:
            order = [i.address for i in svc.instances]
            assert sorted(order) == sorted(addr for _, addr in servers)
            names = {addr: name for (_, addr), name in zip(servers, "abc")}
            weight = {addr: w for (_, addr), w in zip(servers, weights)}
            # §16.6: instance i takes `weight` consecutive turns out of every sum of weights.
            expected = [names[a] for a in order for _ in range(weight[a])] * 3
            assert [await svc.call(WHO, b"") for _ in expected] == expected

            # The controller's relay routes keys on its own (Rust) ring: the same instances.
            keys = [f"user-{i}" for i in range(10_000)]
            direct = await asyncio.gather(*(svc.call(WHO, b"", key=k) for k in keys))
            relayed = await asyncio.gather(*(registry.relay(WHO, b"", key=k) for k in keys))
            assert direct == relayed
            assert set(direct) == {"a", "b", "c"}

            _, b_address = servers[1]
            assert await registry.relay(WHO, b"", address=b_address) == "b"
            with pytest.raises(volley.NotRegisteredError):
                await registry.relay(Method("nobody", "who"), b"")
        finally:
            await svc.close()
            await lease.deregister()
            await registry.close()
            for server, _ in servers:
                await server.shutdown()

    asyncio.run(main())


def test_the_service_client_follows_instances_that_come_and_go(controller):
    async def main():
        (first, _), (second, b_address) = servers = await start_servers(["a", "b"])
        await first.register(controller.address)
        registry = await Registry.connect(controller.address)
        svc = await registry.service("svc")
        try:
            assert {await svc.call(WHO, b"") for _ in range(4)} == {"a"}
            await second.register(controller.address)
            await wait_until(lambda: len(svc.instances) == 2, "the second instance")
            assert {await svc.call(WHO, b"") for _ in range(4)} == {"a", "b"}
            # A fresh controller is settling (§16.1): an instance that leaves is merged back
            # into the list held, as the Rust ServiceClient does, until settling ends.
            before = svc.resolved.revision
            await first.shutdown()  # deregisters first
            await wait_until(lambda: svc.resolved.revision > before, "the watch to see it leave")
            assert svc.resolved.settling and [i.address for i in svc.resolved.instances] == [b_address]
            assert len(svc.instances) == 2
            with pytest.raises(volley.NotRegisteredError):
                await (await registry.service("nobody")).call(WHO, b"")
        finally:
            await svc.close()
            await registry.close()
            for server, _ in servers:
                await server.shutdown()

    asyncio.run(main())
