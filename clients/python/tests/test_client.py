"""The Python client against the Rust echo server (`volley serve-echo`)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

import volley
from volley import proto
from volley.decoder import Decoder

from conftest import serve_echo

ECHO = volley.Method("echo", "echo")


def run(coro):
    return asyncio.run(coro)


def test_single_calls_echo_payloads_byte_for_byte(echo_server):
    rng = random.Random(7)
    sizes = [0, 1, 13, 4096, 16 * 1024, 100_000, 1024 * 1024]

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            for n in sizes:
                payload = rng.randbytes(n)
                assert await client.call(ECHO, payload) == payload, n
            # A request that cannot fit in a frame is refused here, and nothing is sent.
            with pytest.raises(volley.TooLargeError):
                await client.call(ECHO, bytes(proto.MAX_FRAME_LEN))
            assert await client.call(ECHO, b"after") == b"after"

    run(main())


def test_pipelined_calls_each_get_their_own_reply(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            payloads = [f"call {i}".encode() * (i % 7) for i in range(1000)]
            replies = await asyncio.gather(*(client.call(ECHO, p) for p in payloads))
            assert replies == payloads

    run(main())


def test_a_batch_call_returns_every_item_in_order(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            items = [i.to_bytes(4, "little") for i in range(10_000)]
            assert await client.call_batch(ECHO, items) == items
            # More items than one BatchRequest carries: many chunks, one wait.
            many = [bytes([i % 251]) for i in range(70_000)]
            assert await client.call_batch(ECHO, many) == many
            # One chunk as large as the protocol allows is served whole (by an idle server).
            assert await client.call_batch(ECHO, many[:65_536], chunk=65_536) == many[:65_536]
            assert await client.call_batch(ECHO, []) == []

    run(main())


def test_codecs_round_trip_through_the_echo_service(echo_server):
    """Echo returns the payload, so each codec's bytes come back and decode to the value."""
    cases = [
        (volley.UTF8, "héllo, wörld"),
        (volley.JSON, {"a": [1, 2, None], "b": "x", "big": 18446744073709551615}),
        (volley.U64, 2**64 - 1),
        (volley.I32, -5),
        (volley.F64, 1.5),
        (volley.BOOL, True),
        (volley.UNIT, None),
        (volley.I128, -(2**127)),
        (volley.Array("I"), [1, 2, 3]),
        (volley.Pod("<iiii"), (1, 2, 3, 4)),
    ]

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            for codec, value in cases:
                method = volley.Method("echo", "echo", codec, codec)
                assert await client.call(method, value) == value, codec

    run(main())


def test_unknown_service_and_method_raise_their_codes(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            with pytest.raises(volley.UnknownServiceError) as e:
                await client.call(volley.Method("nope", "echo"), b"x")
            assert e.value.code == volley.Code.UNKNOWN_SERVICE == 1
            assert 'no service named "nope"' in e.value.message
            with pytest.raises(volley.UnknownMethodError) as e:
                await client.call(volley.Method("echo", "nope"), b"x")
            assert e.value.code == 2
            # A whole chunk refused: every item carries the chunk's error.
            results = await client.call_batch(volley.Method("nope", "echo"), [b"a", b"b"])
            assert [type(r) for r in results] == [volley.UnknownServiceError] * 2
            # The connection is still good afterwards.
            assert await client.call(ECHO, b"still here") == b"still here"

    run(main())


def test_ping_gets_a_pong_and_the_server_announces_extensions(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            assert await client.ping() >= 0
            assert client.server_accepts_extensions is True

    run(main())


def test_unix_sockets_carry_the_same_protocol():
    path = os.path.join(tempfile.mkdtemp(prefix="volley-py-"), "echo.sock")
    server = serve_echo(listen=f"unix://{path}")
    try:

        async def main():
            async with await volley.Client.connect(server.address) as client:
                payloads = [os.urandom(n) for n in (0, 10, 70_000)]
                assert await asyncio.gather(*(client.call(ECHO, p) for p in payloads)) == payloads
                assert await client.call_batch(ECHO, payloads) == payloads

        run(main())
    finally:
        server.stop()


def test_a_token_is_required_and_checked():
    server = serve_echo("--token", "s3cret")
    try:

        async def main():
            async with await volley.Client.connect(server.address, token="s3cret") as client:
                assert await client.call(ECHO, b"in") == b"in"
            async with await volley.Client.connect(server.address, token="wrong") as client:
                with pytest.raises(volley.UnauthenticatedError):
                    await client.call(ECHO, b"out")

        run(main())
    finally:
        server.stop()


def test_a_call_to_a_closed_port_fails_with_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main():
        with pytest.raises(volley.ConnectionLostError, match="cannot connect") as e:
            await volley.Client.connect(f"tcp://127.0.0.1:{port}")
        assert e.value.never_ran  # nothing was sent: safe to send anywhere

    run(main())


def _exchange(address: str, send: bytes) -> list[tuple]:
    """Sends raw bytes after a client preamble; returns the server's messages until it closes."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(proto.preamble() + send)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    assert proto.check_preamble(received[:8]) & proto.FEATURE_EXTENSIONS
    decoder = Decoder()
    decoder.feed(received[8:])
    return decoder.messages()


def test_a_malformed_frame_gets_a_goaway_protocol_from_the_server(echo_server):
    # A good request, then a frame whose message runs past the end of its frame.
    good = proto.frames([proto.request_message(1, 0, ECHO.names, b"ok")])[0]
    bad = struct.pack("<I", 5) + bytes([proto.REPLY, 0, 0, 0, 0])
    messages = _exchange(echo_server.address, good + bad)
    assert messages[0] == (proto.REPLY, 1, b"ok")
    kind, code, message = messages[-1]
    assert (kind, code) == (proto.GOAWAY, volley.Code.PROTOCOL)
    assert message.startswith("malformed message"), message


def test_a_server_that_sends_bad_bytes_fails_the_calls_with_a_protocol_error():
    """A fake server answers the preamble with a frame of an unknown kind."""

    async def main():
        async def handle(reader, writer):
            await reader.readexactly(8)
            writer.write(proto.preamble() + struct.pack("<I", 1) + b"\x0b")
            await writer.drain()
            await reader.read()  # until the client closes
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            client = volley.Client(f"tcp://127.0.0.1:{port}")
            with pytest.raises(volley.ProtocolError, match="unknown message kind 0x0b"):
                await client.call(ECHO, b"x", timeout=30)
            await client.close()

    run(main())


def test_a_call_times_out_when_the_server_never_answers():
    async def main():
        async def handle(reader, writer):
            writer.write(proto.preamble())
            await reader.read()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            client = await volley.Client.connect(f"tcp://127.0.0.1:{port}")
            with pytest.raises(volley.CallTimeoutError):
                await client.call(ECHO, b"x", timeout=0.2)
            assert not client._conn.pending  # the abandoned id is forgotten
            await client.close(timeout=1)

    run(main())


def test_the_blocking_client_calls_from_several_threads(echo_server):
    with volley.blocking.Client(echo_server.address) as client:
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda i: client.call(ECHO, bytes([i])), range(100)))
        assert replies == [bytes([i]) for i in range(100)]
        assert client.call_batch(ECHO, [b"a", b"b"]) == [b"a", b"b"]
        with pytest.raises(volley.UnknownServiceError):
            client.call(volley.Method("nope", "echo"), b"")
    with pytest.raises(volley.ConnectionLostError):
        volley.blocking.Client("tcp://127.0.0.1:1")


class RecordingServer:
    """A fake server that sends its preamble (``features``) ``delay`` seconds after the
    client's, records every message it reads and answers none."""

    def __init__(self, features: int = proto.FEATURE_EXTENSIONS, delay: float = 0.0):
        self.features = features
        self.delay = delay
        self.messages: list[tuple] = []
        self.changed = asyncio.Event()

    async def handle(self, reader, writer):
        await reader.readexactly(8)
        await asyncio.sleep(self.delay)
        writer.write(proto.preamble(self.features))
        decoder = Decoder()
        while data := await reader.read(1 << 16):
            decoder.feed(data)
            self.messages += decoder.messages()
            self.changed.set()
        writer.close()

    async def wait_for(self, kind: int, n: int = 1) -> list[tuple]:
        async def enough():
            while len(got := [m for m in self.messages if m[0] == kind]) < n:
                self.changed.clear()
                await self.changed.wait()
            return got

        return await asyncio.wait_for(enough(), 60)

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()


def test_a_deadline_that_passes_while_connecting_times_the_call_out():
    """The call's budget runs out before the server's preamble arrives (so before its request
    is encoded): it fails with CallTimeoutError, and nothing is sent."""

    async def main():
        async with RecordingServer(delay=0.3) as address:
            client = volley.Client(address)
            calls = [client.call(ECHO, b"x", timeout=0.01), client.call_raw(ECHO, b"x", timeout=0.01)]
            for outcome in await asyncio.gather(*calls, client.call_batch(ECHO, [b"x"], timeout=0.01),
                                                return_exceptions=True):
                assert isinstance(outcome, volley.CallTimeoutError), repr(outcome)
            await client.close(timeout=1)

    run(main())


def test_a_budget_too_long_for_the_deadline_field_is_left_out():
    """§6.2.2: a budget over 4,294,967,295 µs travels without a DEADLINE (not clamped to it);
    one that fits travels as it is."""

    async def main():
        rec = RecordingServer()
        async with rec as address:
            client = await volley.Client.connect(address)
            calls = [client.call(ECHO, b"long", timeout=5_000.0), client.call(ECHO, b"fits", timeout=4_000.0)]
            long_, fits = await rec.wait_for(proto.REQUEST, 2)
            assert long_[6] == b"long" and not long_[1] & proto.FLAG_EXTENSIONS and not long_[5]
            assert fits[6] == b"fits" and 3_900e6 < fits[5].deadline_micros <= 4_000e6
            for c in calls:
                c.cancel()
            await client.close(timeout=1)

    run(main())


def test_deadlines_share_one_timer_and_each_call_times_out_at_its_own():
    """Calls of different timeouts on one connection: each fails at its own deadline, in
    deadline order, is forgotten and cancelled; answered ones leave no deadline behind."""

    async def main():
        rec = RecordingServer()
        async with rec as address:
            client = await volley.Client.connect(address)
            conn = client._conn
            order: list[float] = []
            loop = asyncio.get_running_loop()

            async def timed(t: float):
                start = loop.time()
                with pytest.raises(volley.CallTimeoutError):
                    await client.call(ECHO, b"x", timeout=t)
                assert loop.time() - start >= t - 0.01
                order.append(t)

            await asyncio.gather(timed(0.6), timed(0.2), timed(0.4))
            assert order == [0.2, 0.4, 0.6]
            assert not conn.pending and conn.timer is None
            cancels = await rec.wait_for(proto.CANCEL, 3)
            requests = [m[2] for m in rec.messages if m[0] == proto.REQUEST]
            assert sorted(m[1] for m in cancels) == sorted(requests)
            await client.close(timeout=1)

    run(main())


def test_a_cancelled_caller_forgets_its_call_and_tells_the_server():
    async def main():
        rec = RecordingServer()
        async with rec as address:
            client = await volley.Client.connect(address)
            task = asyncio.ensure_future(client.call(ECHO, b"x"))
            (request,) = await rec.wait_for(proto.REQUEST)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            (cancel,) = await rec.wait_for(proto.CANCEL)
            assert cancel[1] == request[2] and not client._conn.pending
            await client.close(timeout=1)

    run(main())


def test_many_calls_on_one_connection_keep_the_deadline_heap_small(echo_server):
    """Answered calls leave the heap of deadlines as new ones come: it holds about the calls
    in flight, not every call of the last timeout's span."""

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            for _ in range(20):
                await asyncio.gather(*(client.call(ECHO, b"x") for _ in range(50)))
            for _ in range(200):
                assert await client.call(ECHO, b"y") == b"y"
            assert len(client._conn.deadlines) <= 51
            assert client._conn.timer is not None  # the 30 s default is still armed

    run(main())
