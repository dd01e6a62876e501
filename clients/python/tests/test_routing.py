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


NAMES = Method("svc", "names", volley.U64, volley.UTF8)
COUNTED = Method("svc", "counted", volley.U64, volley.UTF8)
TAGGED = Method("svc", "tagged", volley.U64, volley.UTF8)


async def start_stream_servers(names: list[str]) -> list[tuple[Server, str]]:
    """Servers whose streams say which instance they ran on: `names` (n items, each the
    server's name), `counted` (a client stream: the name and how many items came) and `tagged`
    (both ways: each item back with the name)."""
    out = []
    for name in names:

        async def names_(n: int, name=name):
            for _ in range(n):
                yield name

        async def counted(requests, name=name):
            return f"{name}:{len([r async for r in requests])}"

        async def tagged(requests, name=name):
            async for r in requests:
                yield f"{name}{r}"

        server = Server().handle(WHO, lambda _payload, name=name: name)
        server.handle_stream(NAMES, names_)
        server.handle_client_stream(COUNTED, counted)
        server.handle_bidi_stream(TAGGED, tagged)
        out.append((server, await server.listen("tcp://127.0.0.1:0")))
    return out


def test_the_service_client_opens_streams_on_one_instance_each_by_weight_or_key(controller):
    """Streams through the ServiceClient (PROTOCOL.md §9.9, §16.6): each opens on the instance
    a call would go to (round-robin by weight, or the key's on the ring) and stays there for
    all its items; an instance that cannot be connected to is passed over."""

    async def main():
        servers = await start_stream_servers(["a", "b"])
        names = {addr: name for (_, addr), name in zip(servers, "ab")}
        # A registered address nobody listens on: connecting to it fails at once.
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead = f"tcp://127.0.0.1:{probe.sockets[0].getsockname()[1]}"
        probe.close()
        await probe.wait_closed()
        registry = await Registry.connect(controller.address)
        specs = [InstanceSpec("svc", addr) for _, addr in servers] + [InstanceSpec("svc", dead)]
        lease = await registry.register(specs)
        svc = await registry.service("svc")
        try:
            order = [i.address for i in svc.instances]
            assert sorted(order) == sorted([dead, *names])
            # Round-robin over three, one of them dead: six streams pick it at least once, and
            # pass it over for a live one; every stream stays on the instance it opened on.
            turns = []
            for _ in range(6):
                items = [n async for n in svc.stream(NAMES, 50)]
                assert len(items) == 50 and len(set(items)) == 1, items
                turns.append(items[0])
            assert set(turns) == {"a", "b"}, turns
            assert await svc.client_stream(COUNTED, range(7)) in {"a:7", "b:7"}
            tagged = [t async for t in svc.bidi_stream(TAGGED, range(5))]
            assert len({t[0] for t in tagged}) == 1 and [t[1:] for t in tagged] == [str(i) for i in range(5)]
            # By key: the instance a call with that key reaches.
            for key in (f"user-{i}" for i in range(20)):
                by_call = await svc.call(WHO, b"", key=key)
                assert {n async for n in svc.stream(NAMES, 3, key=key)} == {by_call}
                assert await svc.client_stream(COUNTED, [1, 2], key=key) == f"{by_call}:2"
        finally:
            await svc.close()
            await lease.deregister()
            await registry.close()
            for server, _ in servers:
                await server.shutdown()

    asyncio.run(main())
