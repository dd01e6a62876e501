"""The language-neutral conformance vectors of tests/conformance/, checked against this
package (crates/volley/tests/conformance.rs checks the same files against the Rust code)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from volley import Method, Server, conformance, proto
from volley.decoder import Decoder
from volley.hashing import HashRing, stable_hash
from volley.proto import Extensions, WireError

from conftest import CONFORMANCE, Running, python_server, serve_echo, volley_bin
from test_streams import REPEAT, repeat

WIRE = json.loads((CONFORMANCE / "wire.json").read_text())
ROUTING = json.loads((CONFORMANCE / "routing.json").read_text())


def to_json(m: tuple) -> dict:
    """A decoded message in the vectors' JSON form."""
    kind = m[0]
    if kind in (proto.REQUEST, proto.BATCH_REQUEST):
        _, flags, rid, service, method, ext, body = m
        v = {"kind": "request" if kind == proto.REQUEST else "batch_request", "flags": flags, "id": rid}
        v.update(service=service, method=method)
        if ext.deadline_micros is not None:
            v["deadline_micros"] = ext.deadline_micros
        if ext.trace_parent is not None:
            v["traceparent"] = ext.trace_parent.hex()
        if kind == proto.REQUEST:
            v["payload"] = body.hex()
        else:
            v["items"] = [p.hex() for p in body]
        return v
    if kind == proto.REPLY:
        return {"kind": "reply", "id": m[1], "payload": m[2].hex()}
    if kind == proto.ERROR:
        return {"kind": "error", "id": m[1], "code": m[2], "message": m[3]}
    if kind == proto.BATCH_REPLY:
        items = [{"ok": i.hex()} if isinstance(i, bytes) else {"code": i[0], "message": i[1]} for i in m[2]]
        return {"kind": "batch_reply", "id": m[1], "items": items}
    if kind == proto.GOAWAY:
        return {"kind": "goaway", "code": m[1], "message": m[2]}
    if kind == proto.AUTH:
        return {"kind": "auth", "token": m[1].hex()}
    names = {proto.CANCEL: ("cancel", "id"), proto.PING: ("ping", "token"), proto.PONG: ("pong", "token")}
    name, field = names[kind]
    return {"kind": name, field: m[1]}


def encode(v: dict) -> bytes:
    """The message ``v`` describes, built with this package's encoder."""
    kind = v["kind"]
    if kind in ("request", "batch_request"):
        ext = Extensions(v.get("deadline_micros"), bytes.fromhex(v["traceparent"]) if "traceparent" in v else None)
        names = proto.name_bytes(v["service"], "service") + proto.name_bytes(v["method"], "method")
        flags = v["flags"] & ~proto.FLAG_EXTENSIONS  # the encoder sets it from the extensions
        if kind == "request":
            return proto.request_message(v["id"], flags, names, bytes.fromhex(v["payload"]), ext)
        items = [bytes.fromhex(i) for i in v["items"]]
        return proto.batch_request_message(v["id"], flags, names, items, ext)
    if kind == "reply":
        return proto.reply_message(v["id"], bytes.fromhex(v["payload"]))
    if kind == "error":
        return proto.error_message(v["id"], v["code"], v["message"])
    if kind == "batch_reply":
        items = [(True, bytes.fromhex(i["ok"])) if "ok" in i else (False, i["code"], i["message"]) for i in v["items"]]
        return proto.batch_reply_message(v["id"], items)
    if kind == "goaway":
        return proto.goaway_message(v["code"], v["message"])
    if kind == "auth":
        return proto.auth_message(bytes.fromhex(v["token"]))
    build = {"cancel": proto.cancel_message, "ping": proto.ping_message, "pong": proto.pong_message}[kind]
    return build(v.get("id", v.get("token")))


def decode_all(data: bytes) -> list[tuple]:
    decoder = Decoder()
    decoder.feed(data)
    messages = decoder.messages()
    assert not decoder.in_frame(), "bytes after the last whole frame"
    return messages


def names(cases):
    return [c["name"] for c in cases]


@pytest.mark.parametrize("case", WIRE["decode"], ids=names(WIRE["decode"]))
def test_frames_decode_to_their_messages_and_back(case):
    data = bytes.fromhex(case["frame"])
    assert [to_json(m) for m in decode_all(data)] == case["messages"]
    assert b"".join(proto.frames([encode(v) for v in case["messages"]])).hex() == case["frame"]
    # Split anywhere, the stream decodes to the same messages.
    for cut in range(0, len(data), max(1, len(data) // 7)):
        decoder = Decoder()
        decoder.feed(data[:cut])
        first = decoder.messages()
        decoder.feed(data[cut:])
        assert [to_json(m) for m in first + decoder.messages()] == case["messages"]


@pytest.mark.parametrize("case", WIRE["reject"], ids=names(WIRE["reject"]))
def test_malformed_frames_fail_with_their_reason(case):
    with pytest.raises(WireError) as e:
        decode_all(bytes.fromhex(case["frame"]))
    assert str(e.value).startswith(case["error"]), str(e.value)


@pytest.mark.parametrize("case", WIRE["preambles"], ids=names(WIRE["preambles"]))
def test_preambles_give_their_features_or_their_error(case):
    data = bytes.fromhex(case["bytes"])
    if "error" in case:
        with pytest.raises(WireError) as e:
            proto.check_preamble(data)
        assert str(e.value).startswith(case["error"]), str(e.value)
    else:
        assert proto.check_preamble(data) == case["features"]


def test_keys_hash_and_route_on_the_ring_as_listed():
    for case in ROUTING["stable_hash"]:
        assert f"{stable_hash(bytes.fromhex(case['canonical'])):016x}" == case["hash"]
    ring = HashRing([(a, w) for a, w in ROUTING["ring"]["nodes"]])
    for pick in ROUTING["ring"]["picks"]:
        h = stable_hash(bytes.fromhex(pick["key"]))
        assert f"{h:016x}" == pick["hash"]
        assert ring.node(h) == pick["node"]
        owner = pick["node"]
        assert ring.node(h, skip=lambda i, owner=owner: i == owner) == pick["node_without_it"]


@pytest.mark.parametrize("case", WIRE["echo_server"], ids=names(WIRE["echo_server"]))
def test_the_rust_server_reacts_to_each_exchange_as_listed(echo_server, case):
    check_exchange(echo_server.address, case)


@pytest.fixture(scope="module")
def python_echo_server(tmp_path_factory):
    """The Python server, serving echo/echo on tcp and unix; yields the two addresses."""
    sock = tmp_path_factory.mktemp("conformance") / "echo.sock"

    def make():
        return Server().handle(Method("echo", "echo"), lambda payload: payload).handle_stream(REPEAT, repeat)

    with python_server(make, "tcp://127.0.0.1:0", f"unix://{sock}") as (tcp, unix):
        yield {"tcp": tcp, "unix": unix}


@pytest.mark.parametrize("case", WIRE["echo_server"], ids=names(WIRE["echo_server"]))
def test_the_python_server_reacts_to_each_exchange_as_listed(python_echo_server, case):
    check_exchange(python_echo_server["tcp"], case)


def run_conformance(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([volley_bin(), "conformance", *args], capture_output=True, text=True, timeout=300)


# The stream cases the runner plays against a server that announces STREAMS and serves
# echo/repeat (PROTOCOL.md §19), as the Rust server and this fixture's Python server do.
STREAM_CASES = 4
STREAM_CASE_NAMES = [
    "a server stream sends no item beyond its credit, the rest as credit comes, then StreamEnd",
    "an empty server stream ends with StreamEnd",
    "a cancelled server stream sends no item after the Cancel",
    "a StreamOpen of a single-call method is answered Error(BadRequest)",
]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_python_server_passes_the_conformance_runner(python_echo_server, transport):
    """Every server case, the stream cases included: the runner is a Rust client of the
    Python server's streams (credit, an empty stream, cancel, the wrong shape)."""
    out = run_conformance("server", python_echo_server[transport])
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(WIRE['echo_server']) + STREAM_CASES} cases, 0 failed" in out.stdout, out.stdout
    for case in STREAM_CASE_NAMES:
        assert f"ok      {case}" in out.stdout, out.stdout


def test_the_rust_server_passes_the_conformance_runner(echo_server):
    out = run_conformance("server", echo_server.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(WIRE['echo_server']) + STREAM_CASES} cases, 0 failed" in out.stdout, out.stdout


def test_the_runner_stops_the_rust_server_with_its_command_and_sees_goaway():
    server = serve_echo()
    try:
        out = run_conformance("server", server.address, "--stop-command", f"kill -INT {server.proc.pid}")
    finally:
        server.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(WIRE['echo_server']) + STREAM_CASES + 1} cases, 0 failed" in out.stdout, out.stdout
    assert "ok      a graceful stop sends GoAway(ShuttingDown)" in out.stdout, out.stdout


def test_the_python_server_passes_every_server_case_and_the_graceful_stop(tmp_path):
    """The README's serving example (it serves echo/echo) in a process of its own, stopped by
    the runner with SIGINT: serve_forever shuts it down with GoAway(ShuttingDown)."""
    import re as re_

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re_.search(r"```python\n(.*?)```", readme[readme.index("## Serving") :], re_.S).group(1)
    script = tmp_path / "serve.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        address = re_.match(r"serving on (\S+)", proc.stdout.readline()).group(1)
        out = run_conformance("server", address, "--stop-command", f"kill -INT {proc.pid}")
        assert out.returncode == 0, out.stdout + out.stderr
        # It takes streams but serves no echo/repeat: of the stream cases, only the one that
        # opens echo/echo as a stream is played; the graceful stop is the last case.
        assert f"{len(WIRE['echo_server']) + 1 + 1} cases, 0 failed, 3 not played" in out.stdout, out.stdout
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_runner_fails_a_server_that_does_not_serve_echo():
    server = serve_echo("--name", "other")
    try:
        out = run_conformance("server", server.address)
    finally:
        server.stop()
    assert out.returncode != 0
    assert "FAILED  an echo call" in out.stdout, out.stdout


# The runner's stream cases for clients (crates/volley-conformance/src/client_streams.rs),
# played after the `client` cases of wire.json.
CLIENT_STREAM_CASES = 10


def client_runner(listen: str) -> Running:
    return Running(["conformance", "client", listen, "--timeout", "240"], r"conformance runner on (\S+)")


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_python_client_passes_the_conformance_runner(tmp_path, transport):
    runner = client_runner("tcp://127.0.0.1:0" if transport == "tcp" else f"unix://{tmp_path}/r.sock")
    try:
        assert asyncio.run(conformance.drive(runner.address)) == []
        assert runner.proc.wait(timeout=120) == 0, runner.output()
        assert f"{len(WIRE['client']) + CLIENT_STREAM_CASES} cases, 0 failed" in runner.output()
    finally:
        runner.stop()


def test_the_rust_client_passes_the_conformance_runner():
    runner = client_runner("tcp://127.0.0.1:0")
    try:
        out = run_conformance("drive", runner.address)
        assert out.returncode == 0, out.stderr
        assert runner.proc.wait(timeout=120) == 0, runner.output()
    finally:
        runner.stop()


def test_a_driver_whose_client_misreports_fails_the_run(monkeypatch):
    """Every outcome reported as a timeout: the runner refuses each, and exits non-zero."""
    runner = client_runner("tcp://127.0.0.1:0")
    try:

        async def timed_out(address, call, timeout):
            return {"timeout": "not really"}

        monkeypatch.setattr(conformance, "play", timed_out)
        refused = asyncio.run(conformance.drive(runner.address))
        assert len(refused) == len(WIRE["client"]) + CLIENT_STREAM_CASES
        assert runner.proc.wait(timeout=120) != 0
    finally:
        runner.stop()


def check_exchange(address: str, case: dict) -> None:
    """Send, half-close (the server answers what it read, then closes: §9.6.1), read all."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    first = bytes.fromhex(case["preamble"]) if "preamble" in case else proto.preamble()
    if "send_frame_of" in case:
        repeat = case["send_frame_of"]
        send = proto.frames([bytes.fromhex(repeat["message"]) * repeat["count"]])[0]
    else:
        send = bytes.fromhex(case["send"])
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(first + send)
        s.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    proto.check_preamble(received[:8])
    messages = [to_json(m) for m in decode_all(received[8:])]
    if case["then"] != "open":
        last = messages.pop()
        assert (last["kind"], last["code"]) == ("goaway", case["then"]["goaway"])
    assert messages == case["answers"]


@pytest.mark.parametrize(
    "items",
    [
        [(True, b"abcd")] * 300,  # one size: the strided fast path
        [(True, b"")] * 5,
        [(True, b"abcd")] * 299 + [(True, b"abc")],  # the last differs: the general loop
        [(True, b"abcd")] * 10 + [(False, 4, "no")] + [(True, b"abcd")] * 10,
        [(True, bytes([1, 0, 0, 0, 0]))] * 3,  # payload bytes that look like item headers
    ],
)
def test_batch_replies_decode_alike_on_every_path(items):
    """A BatchReply between two other messages in one frame decodes to its items whichever
    path reads it, and the messages after it still decode."""
    body = [proto.ping_message(1), proto.batch_reply_message(9, items), proto.pong_message(2)]
    want = [i[1] if i[0] else (i[1], i[2]) for i in items]
    messages = decode_all(b"".join(proto.frames(body)))
    assert [m[0] for m in messages] == [proto.PING, proto.BATCH_REPLY, proto.PONG]
    assert messages[1][2] == want
    # Cut short by one byte, the same frame is refused, not misread.
    frame = proto.frames([proto.batch_reply_message(9, items)])[0]
    broken = proto.frames([frame[4:-1]])[0]
    with pytest.raises(WireError):
        decode_all(broken)
