"""The client's batch path: its framing against the one-message encoder, its decoding of
uniform replies against the general loop, and every item ending exactly once when a server
answers some chunks and not others, answers with the wrong kind, or the caller gives up."""

from __future__ import annotations

import array
import asyncio
import gc
import random
import struct

import pytest

import volley
from volley import proto
from volley.decoder import Decoder

from conftest import serve_echo

ECHO = volley.Method("echo", "echo")
NAMES = ECHO.names


def run(coro):
    return asyncio.run(coro)


def one_message_per_chunk(rids, payloads, edges, ext=None) -> bytes:
    """The same chunks through the one-message encoder and ``frames``."""
    messages = [proto.batch_request_message(r, 0, NAMES, payloads[s:e], ext) for r, s, e in zip(rids, edges, edges[1:])]
    return b"".join(proto.frames(messages))


@pytest.mark.parametrize(
    "payloads, per_chunk",
    [
        ([b"x" * 64] * 10_000, 128),  # one size: frames closed at 256 KiB
        ([b""] * 300, 7),  # empty items
        ([bytes([i % 256]) * (i % 97) for i in range(5_000)], 128),  # sizes differ
        ([b"ab"] * 5_000, 1),  # more than 4,096 messages for one frame
        ([b"y" * 5_000_000, b"z" * 5_000_000, b"w" * 5_000_000, b"v"], 2),  # 16 MiB frames
    ],
)
def test_batch_frames_are_the_bytes_of_one_message_per_chunk(payloads, per_chunk):
    sizes = set(map(len, payloads))
    size = next(iter(sizes)) if len(sizes) == 1 else None
    edges = [*range(0, len(payloads), per_chunk), len(payloads)]
    rids = [7 << 32 | k for k in range(len(edges) - 1)]
    for ext in (None, proto.Extensions(deadline_micros=1_500_000)):
        frames = list(proto.batch_request_frames(rids, 0, NAMES, payloads, edges, size, ext))
        assert b"".join(frames) == one_message_per_chunk(rids, payloads, edges, ext)
        for f in frames:  # each is one whole frame
            assert struct.unpack_from("<I", f)[0] == len(f) - 4
        decoder = Decoder()
        decoder.feed(b"".join(frames))
        assert [m[6] for m in decoder.messages()] == [payloads[s:e] for s, e in zip(edges, edges[1:])]


def general_loop(items: list[tuple]) -> list:
    """The items as the general decoding loop would return them."""
    return [i[1] if i[0] else (i[1], i[2]) for i in items]


@pytest.mark.parametrize(
    "items",
    [
        [(True, b"x" * 64)] * 128,
        [(True, b"")] * 50,
        [(True, bytes([i % 256]) * 300) for i in range(3_000)],  # over one struct's piece
        [(True, b"x" * 64)] * 127 + [(True, b"x" * 63)],  # the last one's length differs
        [(True, b"x" * 64)] * 64 + [(False, 4, "no")] + [(True, b"x" * 64)] * 63,  # one error
        [(True, b"\x00\x40\x00\x00\x00" * 13)] * 40,  # payloads that look like item headers
    ],
)
def test_batch_replies_decode_as_the_general_loop_does_whatever_the_reads(items):
    failed = sum(1 for i in items if not i[0])
    reply = (proto.BATCH_REPLY, 5, general_loop(items), failed)
    two = (proto.BATCH_REPLY, 6, [b"ok"] * 3, 0)
    # A frame of BatchReplies alone (read where it lies when they all succeeded with one size
    # each), and one with another kind of message too (read from a copy, message by message).
    for messages, want in [
        ([proto.batch_reply_message(5, items), proto.batch_reply_message(6, [(True, b"ok")] * 3)], [reply, two]),
        ([proto.batch_reply_message(5, items), proto.pong_message(1)], [reply, (proto.PONG, 1)]),
    ]:
        data = b"".join(proto.frames(messages))
        rng = random.Random(len(items))
        cuts = sorted(rng.sample(range(1, len(data)), 20))
        decoder = Decoder()
        got = []
        for start, end in zip([0, *cuts], [*cuts, len(data)]):
            decoder.feed(data[start:end])
            got += decoder.messages()
        assert not decoder.in_frame()
        assert got == want


@pytest.mark.parametrize("second", [b"", proto.pong_message(1)])
def test_a_truncated_uniform_reply_is_a_wire_error(second):
    message = proto.batch_reply_message(5, [(True, b"x" * 64)] * 128)
    decoder = Decoder()
    decoder.feed(proto.frames([message[:-1] + second])[0] + proto.frames([message])[0])
    with pytest.raises(proto.WireError, match="runs past the end") as e:
        decoder.messages()
    assert e.value.before == []


class FakeServer:
    """A server that reads requests and answers each BatchRequest as ``answer(id, items)``
    says (bytes to send, or None for no answer); it records the Cancels it gets."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[int] = []
        self.cancels: list[int] = []
        self.got_cancels = asyncio.Event()
        self.expected_cancels = 0

    async def handle(self, reader, writer):
        await reader.readexactly(8)
        writer.write(proto.preamble())  # no extensions: plain requests
        decoder = Decoder()
        while data := await reader.read(1 << 16):
            decoder.feed(data)
            for m in decoder.messages():
                if m[0] == proto.BATCH_REQUEST:
                    self.requests.append(m[2])
                    reply = self.answer(m[2], m[6])
                    if reply is not None:
                        writer.write(proto.frames([reply])[0])
                elif m[0] == proto.CANCEL:
                    self.cancels.append(m[1])
                    if len(self.cancels) >= self.expected_cancels:
                        self.got_cancels.set()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()


def echo_reply(rid: int, items: list[bytes]) -> bytes:
    return proto.batch_reply_message(rid, [(True, i) for i in items])


def test_chunks_left_unanswered_time_out_item_by_item_and_are_cancelled():
    """Every other chunk is answered: those items get their replies, the others one
    CallTimeoutError each at the deadline; their ids are forgotten and cancelled."""

    async def main():
        fake = FakeServer(lambda rid, items: echo_reply(rid, items) if rid % 2 == 0 else None)
        async with fake as address:
            client = volley.Client(address)
            items = [i.to_bytes(4, "little") for i in range(1_000)]
            fake.expected_cancels = len(range(0, 1_000, 100)) // 2
            results = await client.call_batch(ECHO, items, chunk=100, timeout=1.0)
            assert len(results) == len(items)
            chunk_ids = fake.requests
            assert len(chunk_ids) == 10
            for k, rid in enumerate(chunk_ids):
                for i in range(k * 100, k * 100 + 100):
                    if rid % 2 == 0:
                        assert results[i] == items[i], i
                    else:
                        assert isinstance(results[i], volley.CallTimeoutError), (i, results[i])
            assert not client._conn.pending
            await asyncio.wait_for(fake.got_cancels.wait(), 60)
            assert sorted(fake.cancels) == sorted(r for r in chunk_ids if r % 2)
            await client.close(timeout=1)

    run(main())


def test_a_cancelled_batch_forgets_and_cancels_every_chunk():
    async def main():
        fake = FakeServer(lambda rid, items: None)
        async with fake as address:
            client = await volley.Client.connect(address)
            fake.expected_cancels = 5
            task = asyncio.ensure_future(client.call_batch(ECHO, [b"a"] * 500, chunk=100))
            deadline = asyncio.get_running_loop().time() + 60
            while len(fake.requests) < 5 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not client._conn.pending
            await asyncio.wait_for(fake.got_cancels.wait(), 60)
            assert sorted(fake.cancels) == sorted(fake.requests)
            await client.close(timeout=1)

    run(main())


def test_a_chunk_answered_with_an_error_or_a_reply_fails_alone():
    """An Error for one chunk fails its items, a Reply where a BatchReply is due fails that
    chunk's with a protocol error, and the other chunks' items carry their replies."""

    async def main():
        def answer(rid, items):
            if items[0] == b"\x00":
                return proto.reply_message(rid, b"?")
            if items[0] == b"\x01":
                return proto.error_message(rid, volley.Code.OVERLOADED, "busy")
            return echo_reply(rid, items)

        async with FakeServer(answer) as address:
            client = volley.Client(address)
            items = [bytes([i // 10]) for i in range(30)]
            results = await client.call_batch(ECHO, items, chunk=10, timeout=60)
            assert all(isinstance(r, volley.ProtocolViolationError) for r in results[:10]), results[:10]
            assert "answered a BatchRequest with a Reply" in str(results[0])
            assert all(isinstance(r, volley.OverloadedError) for r in results[10:20]), results[10:20]
            assert results[20:] == items[20:]
            assert not client._conn.pending
            await client.close(timeout=1)

    run(main())


def test_items_that_cannot_go_fail_alone():
    """An item that does not encode and one too large for a frame fail; the others, of many
    sizes and cut into chunks by bytes as well as by count, come back in their places."""
    server = serve_echo()

    async def main():
        async with await volley.Client.connect(server.address) as client:
            big = b"b" * (6 << 20)  # three of them do not fit in one frame
            items = [b"a", "not bytes", big, b"c" * 1000, big, b"", bytes(17 << 20), big, b"d"]
            results = await client.call_batch(ECHO, items, timeout=120)
            assert isinstance(results[1], volley.CodecError)
            assert isinstance(results[6], volley.TooLargeError)
            assert [r for k, r in enumerate(results) if k not in (1, 6)] == [
                i for k, i in enumerate(items) if k not in (1, 6)
            ]

    try:
        run(main())
    finally:
        server.stop()


def test_raw_items_of_other_types_go_as_their_bytes_or_fail_alone(echo_server):
    """Bytes-like items travel as their bytes (a memoryview of 32-bit numbers as its 8 bytes,
    not as 2), other values fail with a clear error in their slot, and the rest are served."""
    numbers = memoryview(array.array("I", [1, 2]))
    items = [b"ab", bytearray(b"cd"), numbers, "a str", 7, None, b"ef"]

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            return await client.call_batch(ECHO, items, chunk=2)

    results = run(main())
    assert results[:3] == [b"ab", b"cd", numbers.tobytes()]
    assert results[6] == b"ef"
    for bad, result in zip(items[3:6], results[3:6]):
        assert isinstance(result, volley.CodecError), result
        assert f"raw payloads are bytes, not {type(bad).__name__}" in str(result)


def test_a_batch_keeps_nothing_per_chunk_alive_so_it_sets_off_no_garbage_collection(echo_server):
    """A container kept per chunk until the batch ends (782 chunks here) would set off the
    cyclic collector in the middle of the batch, whose pass over the batch's large lists
    cost a fifth of the batch's CPU: the batch's own objects must not."""
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    async def main():
        async with await volley.Client.connect(echo_server.address) as client:
            items = [b"x" * 64] * 100_000
            gc.collect()
            gc.callbacks.append(count)
            try:
                results = await client.call_batch(ECHO, items, timeout=120)
            finally:
                gc.callbacks.remove(count)
            assert results == items

    threshold = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        run(main())
    finally:
        gc.set_threshold(*threshold)
    assert collections == []
