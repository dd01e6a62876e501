"""Streams (PROTOCOL.md §9.9): the Python client against the Rust server's `echo`/`repeat`, the
Python server against the Rust conformance runner (see test_conformance.py), and Python to
Python for every shape, with credit, cancel, errors mid-stream, deadlines and shutdown."""

from __future__ import annotations

import asyncio
import struct

import pytest

import volley
from volley import U64, CallTimeoutError, Method, Server, proto
from volley.decoder import Decoder

# Generous: the machine running the tests may be loaded by builds.
PATIENCE = 60.0

REPEAT = Method("echo", "repeat")
ECHO = Method("echo", "echo")
COUNT = Method("py", "count", U64, U64)
SUM = Method("py", "sum", U64, U64)
DOUBLE = Method("py", "double", U64, U64)
FAILING = Method("py", "failing", U64, U64)
ENDLESS = Method("py", "endless", U64, U64)


def repeat_request(count: int, body: bytes) -> bytes:
    return struct.pack("<I", count) + body


async def repeat(request: bytes):
    """`echo`/`repeat` as the Rust echo server serves it (PROTOCOL.md §19): a 4-byte count,
    then a body; the items are that many copies of the body."""
    if len(request) < 4:
        raise volley.BadRequestError("expected a 4-byte count, then the body")
    body = request[4:]
    for _ in range(struct.unpack_from("<I", request)[0]):
        yield body


async def eventually(condition, what: str) -> None:
    """Waits for ``condition()`` to hold, yielding to the loop, within PATIENCE."""
    deadline = asyncio.get_running_loop().time() + PATIENCE
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 4 * PATIENCE))


# -- the wire -------------------------------------------------------------------------------


def test_the_documented_stream_example_encodes_and_decodes():
    """PROTOCOL.md §12.5, byte for byte."""
    names = proto.name_bytes("log", "service") + proto.name_bytes("tail", "method")
    rid = 0x0000000100000000
    open_ = proto.frames([proto.stream_open_message(rid, 0, names, proto.SHAPE_SERVER, 2, b"q")])[0]
    assert open_.hex() == "1d000000" "10" "00" "0000000001000000" "036c6f67" "047461696c" "01" "02000000" "0100000071"
    items = proto.frames([proto.stream_item_message(rid, b"a"), proto.stream_item_message(rid, b"b")])[0]
    assert items.hex() == "1c000000" + "11000000000100000001000000" "61" + "11000000000100000001000000" "62"
    credit = proto.frames([proto.stream_credit_message(rid, 2)])[0]
    assert credit.hex() == "0d000000" "13000000000100000002000000"
    end = proto.frames([proto.stream_end_message(rid)])[0]
    assert end.hex() == "09000000" "120000000001000000"
    decoder = Decoder()
    decoder.feed(open_ + items + credit + end)
    assert decoder.messages() == [
        (proto.STREAM_OPEN, 0, rid, "log", "tail", proto.NO_EXTENSIONS, 1, 2, b"q"),
        (proto.STREAM_ITEM, rid, b"a"),
        (proto.STREAM_ITEM, rid, b"b"),
        (proto.STREAM_CREDIT, rid, 2),
        (proto.STREAM_END, rid),
    ]


def test_a_stream_open_cut_short_is_refused():
    names = proto.name_bytes("log", "service") + proto.name_bytes("tail", "method")
    message = proto.stream_open_message(1, 0, names, 1, 2, b"q")
    decoder = Decoder()
    decoder.feed(proto.frames([message[:-1]])[0])
    with pytest.raises(proto.WireError, match="runs past the end of its frame"):
        decoder.messages()


# -- the Python client, the Rust server -----------------------------------------------------


def test_a_server_stream_from_the_rust_server_arrives_whole_and_in_order(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            assert client.server_accepts_streams is True
            items = [i async for i in client.stream(REPEAT, repeat_request(5, b"ab"))]
            assert items == [b"ab"] * 5
            assert [i async for i in client.stream(REPEAT, repeat_request(0, b"x"))] == []
            # 100,000 items through a window of 64: never more than 64 wait unread.
            stream = client.stream(REPEAT, repeat_request(100_000, b"0123456789"), window=64)
            n = most = 0
            async for item in stream:
                assert item == b"0123456789"
                n += 1
                most = max(most, len(stream._state.items))
            assert (n, most <= 64) == (100_000, True), (n, most)
            # Single calls shared the connection all along, and still do.
            assert await client.call(ECHO, b"after") == b"after"
            assert client._conn.pending == {}

    run(main())


def test_a_reader_that_stops_holds_the_rust_producer_at_its_window(echo_server):
    """A reader that takes nothing: the items waiting stop at the window (the server sends
    none beyond its credit), and move on by the credit granted as the reader takes half."""

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            async with client.stream(REPEAT, repeat_request(1_000_000, b"x" * 64), window=32) as stream:
                state = stream._state
                await eventually(lambda: len(state.items) == 32, "the window to fill")
                await client.ping()  # a round trip: items beyond the credit would be in by now
                await client.call(ECHO, b"sync")
                assert (len(state.items), state.allowance) == (32, 0)
                for _ in range(16):
                    assert await stream.__anext__() == b"x" * 64
                # Half the window taken: 16 more granted, and sent, no more.
                await eventually(lambda: len(state.items) == 32, "the granted items")
                await client.call(ECHO, b"sync")
                assert len(state.items) == 32 and not state.ended
            # Leaving the block cancelled it: the id is forgotten, the connection goes on.
            assert state.ended and state.rid not in client._conn.pending
            assert await client.call(ECHO, b"on") == b"on"

    run(main())


def test_an_error_at_the_open_and_a_deadline_end_a_rust_stream(echo_server):
    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            with pytest.raises(volley.BadRequestError, match="4-byte count"):
                async for _ in client.stream(REPEAT, b"\x01"):
                    pass
            with pytest.raises(volley.UnknownMethodError):
                async for _ in client.stream(Method("echo", "nope"), b""):
                    pass
            # A single-call method opened as a stream: BadRequest naming the shape.
            with pytest.raises(volley.BadRequestError):
                async for _ in client.stream(ECHO, b""):
                    pass
            # A reader too slow for the stream's deadline: it ends with a time-out, whichever
            # side saw it first, after the items that came before.
            # (A million items at 10 ms each would take hours.)
            start = asyncio.get_running_loop().time()
            with pytest.raises(CallTimeoutError):
                async for _ in client.stream(REPEAT, repeat_request(1_000_000, b"t"), timeout=0.5):
                    await asyncio.sleep(0.01)
            assert asyncio.get_running_loop().time() - start < PATIENCE
            assert await client.call(ECHO, b"on") == b"on"

    run(main())


GATHER = Method("echo", "gather")
EACH = Method("echo", "each")


def test_client_and_both_way_streams_to_the_rust_server(echo_server):
    """`echo`/`gather` (a client stream: the items joined) and `echo`/`each` (both ways: each
    item back), PROTOCOL.md §19: the Rust server's credit paces the Python sender."""

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            items = [i.to_bytes(4, "little") for i in range(20_000)]
            assert await client.client_stream(GATHER, items) == b"".join(items)
            assert await client.client_stream(GATHER, []) == b""

            async def slowly():  # an async iterable that waits between its requests
                for i in items[:500]:
                    if i[0] % 50 == 0:
                        await asyncio.sleep(0)
                    yield i

            assert await client.client_stream(GATHER, slowly()) == b"".join(items[:500])
            assert [r async for r in client.bidi_stream(EACH, items, window=32)] == items
            # Closed early, a both-way stream stops its sender too.
            stream = client.bidi_stream(EACH, iter(lambda: b"again", None))
            async for r in stream:
                assert r == b"again"
                break
            await stream.aclose()
            await eventually(lambda: stream._feeder.done(), "the sender to stop")
            assert client._conn.pending == {}
            assert await client.call(ECHO, b"on") == b"on"

    run(main())


def test_the_blocking_client_reads_and_sends_streams(echo_server):
    with volley.blocking.Client(echo_server.address) as client:
        assert list(client.stream(REPEAT, repeat_request(1000, b"b"), window=16)) == [b"b"] * 1000
        items = client.stream(REPEAT, repeat_request(1_000_000, b"c"))
        assert next(items) == b"c"
        items.close()  # early: cancelled
        assert client.client_stream(GATHER, [b"x", b"y", b"z"]) == b"xyz"
        assert client.call(ECHO, b"on") == b"on"
        assert client._client._conn.pending == {}


def test_the_blocking_client_streams_both_ways(echo_server):
    """`echo`/`each` through the blocking client: every item back in order, the Rust server's
    credit pacing the sender on the client's thread; closed early, the stream is cancelled
    and its sender stops."""
    with volley.blocking.Client(echo_server.address) as client:
        items = [i.to_bytes(4, "little") for i in range(5_000)]
        assert list(client.bidi_stream(EACH, items, window=16)) == items
        assert list(client.bidi_stream(EACH, [])) == []
        endless = client.bidi_stream(EACH, iter(lambda: b"again", None))
        assert next(endless) == b"again"
        endless.close()  # early: cancelled, and its sender stopped
        assert client._client._conn.pending == {}
        assert client.call(ECHO, b"on") == b"on"
        with pytest.raises(ValueError, match="window"):
            client.bidi_stream(EACH, [b"x"], window=1)


def test_a_stream_is_refused_locally_by_a_server_without_streams():
    """A server whose preamble did not announce STREAMS is sent no StreamOpen (§4.4)."""

    async def main():
        received = bytearray()

        async def old_server(reader, writer):
            writer.write(proto.preamble(proto.FEATURE_EXTENSIONS))
            while data := await reader.read(65536):
                received.extend(data)
            writer.close()

        listener = await asyncio.start_server(old_server, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        client = await volley.Client.connect(f"tcp://127.0.0.1:{port}")
        assert client.server_accepts_streams is False
        with pytest.raises(volley.UsageError, match="takes no streams"):
            async for _ in client.stream(REPEAT, b""):
                pass
        with pytest.raises(volley.UsageError, match="takes no streams"):
            await client.client_stream(SUM, [1, 2])
        await client.close()
        listener.close()
        await listener.wait_closed()
        assert bytes(received) == proto.preamble(0)  # nothing but the client's preamble

    run(main())


# -- Python to Python -----------------------------------------------------------------------


class Probe:
    """What the handlers of ``stream_server`` did."""

    def __init__(self):
        self.produced = 0
        self.closed = 0
        self.taken = 0


def stream_server(probe: Probe) -> Server:
    async def count(n: int):
        for i in range(n):
            yield i

    async def endless(start: int):
        try:
            i = start
            while True:
                probe.produced += 1
                yield i
                i += 1
        finally:
            probe.closed += 1

    async def failing(n: int):
        for i in range(n):
            yield i
        raise volley.ApplicationError(f"failed after {n}")

    async def sum_(requests):
        total = 0
        async for x in requests:
            probe.taken += 1
            if x == 2**64 - 1:
                raise volley.BadRequestError("no such item")
            total += x
        return total

    async def double(requests):
        async for x in requests:
            probe.taken += 1
            yield 2 * x

    server = Server()
    server.handle(ECHO, lambda p: p)
    server.handle_stream(COUNT, count)
    server.handle_stream(ENDLESS, endless)
    server.handle_stream(FAILING, failing)
    server.handle_stream(REPEAT, repeat)
    server.handle_client_stream(SUM, sum_)
    server.handle_bidi_stream(DOUBLE, double)
    return server


def python_pair(body):
    async def main():
        probe = Probe()
        async with stream_server(probe) as server:
            address = await server.listen("tcp://127.0.0.1:0")
            async with await volley.Client.connect(address) as client:
                await body(client, probe, server)

    run(main())


N = 100_000


def test_every_shape_python_to_python():
    async def body(client, probe, server):
        assert [i async for i in client.stream(COUNT, N)] == list(range(N))
        assert await client.client_stream(SUM, range(N)) == N * (N - 1) // 2
        assert await client.client_stream(SUM, []) == 0

        async def numbers():  # an async iterable of requests
            for i in range(N):
                yield i

        assert [d async for d in client.bidi_stream(DOUBLE, numbers())] == [2 * i for i in range(N)]
        assert probe.taken == 2 * N
        assert client._conn.pending == {} and not server.connections.pop().streams

    python_pair(body)


def test_a_slow_reader_bounds_the_python_producer_and_closing_early_stops_it():
    async def body(client, probe, server):
        stream = client.stream(ENDLESS, 0, window=16)
        assert await stream.__anext__() == 0
        await eventually(lambda: len(stream._state.items) == 15, "the window to fill")
        await client.call(ECHO, b"sync")
        # The producer was pulled once per item sent: the window, and not one more.
        assert probe.produced == 16
        for want in range(1, 9):
            assert await stream.__anext__() == want
        await eventually(lambda: probe.produced == 16 + 8, "the credit granted")
        await client.call(ECHO, b"sync")
        assert probe.produced == 24
        # Dropped early: Cancel; the server closes the generator and sends nothing more.
        state = stream._state
        del stream
        await eventually(lambda: probe.closed == 1, "the producer to be closed")
        assert state.ended and state.rid not in client._conn.pending
        (conn,) = server.connections
        assert conn.streams == {}
        # A stream left by ``break`` inside ``async with`` ends the same way.
        async with client.stream(ENDLESS, 100) as s:
            async for i in s:
                if i == 102:
                    break
        await eventually(lambda: probe.closed == 2, "the second producer to be closed")
        assert await client.call(ECHO, b"on") == b"on"

    python_pair(body)


def test_an_error_mid_stream_comes_after_the_items_before_it():
    async def body(client, probe, server):
        got = []
        with pytest.raises(volley.ApplicationError, match="failed after 3"):
            async for i in client.stream(FAILING, 3):
                got.append(i)
        assert got == [0, 1, 2]
        # A client stream's item the handler refuses ends it with that error.
        with pytest.raises(volley.BadRequestError, match="no such item"):
            await client.client_stream(SUM, [1, 2, 2**64 - 1, 4])
        # A request that fails to come ends the stream on both sides.

        def broken():
            yield 1
            raise ValueError("no more requests")

        with pytest.raises(ValueError, match="no more requests"):
            await client.client_stream(SUM, broken())
        with pytest.raises(ValueError, match="no more requests"):
            async for _ in client.bidi_stream(DOUBLE, broken()):
                pass
        (conn,) = server.connections
        await eventually(lambda: not conn.streams, "the server to forget the streams")
        assert client._conn.pending == {}

    python_pair(body)


def test_the_wrong_shape_and_a_request_to_a_stream_method_are_bad_requests():
    async def body(client, probe, server):
        with pytest.raises(volley.BadRequestError, match="is a client stream"):
            async for _ in client.stream(SUM, 1):
                pass
        with pytest.raises(volley.BadRequestError, match="single-call method"):
            async for _ in client.stream(Method("echo", "echo", U64, U64), 1):
                pass
        with pytest.raises(volley.BadRequestError, match="is a server stream"):
            await client.call(COUNT, 3)
        with pytest.raises(volley.UnknownServiceError):
            await client.client_stream(Method("nope", "sum", U64, U64), [1])

    python_pair(body)


def test_a_deadline_ends_a_stream_on_both_sides():
    async def body(client, probe, server):
        # The reader takes nothing: the server's timer ends the stream (DeadlineExceeded,
        # seen as the stream's time-out) and closes the producer.
        stream = client.stream(ENDLESS, 0, timeout=0.2, window=4)
        with pytest.raises(CallTimeoutError):
            async with stream:
                await eventually(lambda: stream._state.ended, "the deadline")
                async for _ in stream:
                    pass
        await eventually(lambda: probe.closed == 1, "the producer to be closed")
        # A client stream whose requests never finish ends at its deadline too.

        async def stalled():
            yield 1
            await asyncio.Event().wait()

        with pytest.raises(CallTimeoutError):
            await client.client_stream(SUM, stalled(), timeout=0.2)
        (conn,) = server.connections
        await eventually(lambda: not conn.streams, "the server to end the stream")
        assert await client.call(ECHO, b"on") == b"on"

    python_pair(body)


def test_a_shutdown_ends_open_streams_with_shutting_down():
    async def main():
        probe = Probe()
        server = stream_server(probe)
        address = await server.listen("tcp://127.0.0.1:0")
        client = await volley.Client.connect(address)
        stream = client.stream(ENDLESS, 0, window=4)
        assert await stream.__anext__() == 0
        await server.shutdown()
        with pytest.raises((volley.ShuttingDownError, volley.ConnectionLostError)) as e:
            async for _ in stream:
                pass
        assert isinstance(e.value, volley.ShuttingDownError), e.value
        assert probe.closed == 1
        await client.close()

    run(main())


def test_a_lost_connection_ends_every_stream_with_an_error():
    async def main():
        probe = Probe()
        server = stream_server(probe)
        address = await server.listen("tcp://127.0.0.1:0")
        client = await volley.Client.connect(address)
        stream = client.stream(ENDLESS, 0, window=4)
        assert await stream.__anext__() == 0
        for conn in list(server.connections):
            conn.transport.abort()
        with pytest.raises(volley.ConnectionLostError):
            async for _ in stream:
                pass
        await eventually(lambda: probe.closed == 1, "the producer to be closed")
        await server.shutdown()
        await client.close()

    run(main())
