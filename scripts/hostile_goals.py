#!/usr/bin/env python3
"""Measures how a Volley server and controller hold up against hostile peers, from outside,
over loopback, with the wire protocol written by hand (docs/PROTOCOL.md): what an attacker or
a buggy client in another language would send.

    cargo build --release -p volley-cli
    python3 scripts/hostile_goals.py [--volley target/release/volley] [--only NAME ...]

Scenarios (each prints its figures; none asserts: these are measurements, the repository's
tests assert the behaviour with generous bounds):

  deep        40,000 / 80,000 / 160,000 echo requests pipelined on one connection to
              `volley serve-echo`, and 37,500 / 75,000 / 150,000 `alloc_client_id` to
              `volley controller`: the time until every reply arrived, the ratio to the
              smallest, and how long a new connection opened meanwhile waits for the preamble.
  flood       10,050 plain TCP connections to a tls:// `serve-echo` that never send a byte,
              then 20 real TLS clients one after the other: handshake + one echo each.
  stalled     240 peers that send half a frame and stall: when each gets GoAway(Protocol)
              (the read timeout is 30 s by default; `--read-timeout-s` lowers it).
  frames      32 peers that each send a 16 MiB frame minus one byte and stop: the server's
              resident memory before and after (bounded by its receive budget, 256 MiB by
              default), and 20 echo calls on another connection meanwhile.
"""

import argparse
import os
import resource
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

PREAMBLE = b"VLLY\x01\x00\x00\x00"


def request(rid, service, method, payload):
    s, m = service.encode(), method.encode()
    return (bytes([0x01, 0]) + struct.pack("<Q", rid) + bytes([len(s)]) + s + bytes([len(m)]) + m
            + struct.pack("<I", len(payload)) + payload)


def frame(messages):
    body = b"".join(messages)
    return struct.pack("<I", len(body)) + body


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, ready_port):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", ready_port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"{cmd[0]} did not start listening on {ready_port}")


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def count_replies(data):
    """Counts Reply (0x02) and Error (0x03) messages in a server's stream after its preamble."""
    pos, n = 8, 0
    while pos + 4 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        body, pos = data[pos + 4:pos + 4 + length], pos + 4 + length
        i = 0
        while i < len(body):
            kind = body[i]
            if kind == 0x02:
                (p,) = struct.unpack_from("<I", body, i + 9)
                i += 13 + p
            elif kind == 0x03:
                (p,) = struct.unpack_from("<I", body, i + 11)
                i += 15 + p
            else:
                raise ValueError(f"unexpected message kind {kind:#x}")
            n += 1
    return n


def pipeline_once(port, total, service, method, payload):
    """Pipelines `total` requests on one connection; returns (seconds until every reply
    arrived, seconds a connection opened meanwhile waited for the server's preamble)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = bytearray(PREAMBLE)
    for first in range(1, total + 1, 1000):
        data += frame(request(rid, service, method, payload) for rid in range(first, min(first + 1000, total + 1)))
    received = bytearray()

    def read_all():
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=read_all)
    newcomer = {}

    def newcomer_preamble():
        time.sleep(0.002)  # after the pipeline has started
        t = time.perf_counter()
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(PREAMBLE)
        recv_exact(c, 8)
        newcomer["wait"] = time.perf_counter() - t
        c.close()

    side = threading.Thread(target=newcomer_preamble)
    t0 = time.perf_counter()
    reader.start()
    side.start()
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    reader.join()
    elapsed = time.perf_counter() - t0
    side.join()
    s.close()
    replies = count_replies(bytes(received))
    if replies != total:
        print(f"    !! {replies} replies to {total} requests")
    return elapsed, newcomer.get("wait", float("nan"))


def deep(volley):
    print("deep pipelines (one connection; time until every reply arrived)")
    port, reg_port = free_port(), free_port()
    echo = start([volley, "serve-echo", "--listen", f"tcp://127.0.0.1:{port}"], port)
    ctl = start([volley, "controller", "--listen", f"tcp://127.0.0.1:{reg_port}"], reg_port)
    try:
        for name, p, sizes, svc, meth, payload in [
            ("serve-echo, 8 B echo", port, [40_000, 80_000, 160_000], "echo", "echo", b"12345678"),
            ("controller, alloc_client_id", reg_port, [37_500, 75_000, 150_000], "volley.registry",
             "alloc_client_id", b""),
        ]:
            base = None
            for n in sizes:
                took, wait = pipeline_once(p, n, svc, meth, payload)
                base = base or took
                print(f"  {name}: {n:>7} requests {took * 1000:8.1f} ms ({took / base:4.1f}x the first); "
                      f"a new connection's preamble after {wait * 1000:.1f} ms")
    finally:
        echo.kill()
        ctl.kill()


def make_cert(tmp):
    key, cert = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def flood(volley, stalled_count):
    print(f"TLS handshake flood: {stalled_count} stalled TCP connections, then 20 real TLS clients")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, stalled_count + 1000)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = make_cert(tmp)
        port = free_port()
        server = start([volley, "serve-echo", "--listen", f"tls://127.0.0.1:{port}", "--tls-cert", cert,
                        "--tls-key", key], port)
        stalled = []
        try:
            for _ in range(stalled_count):
                stalled.append(socket.create_connection(("127.0.0.1", port)))
            time.sleep(0.5)
            ctx = ssl.create_default_context(cafile=cert)
            times = []
            for i in range(20):
                t = time.perf_counter()
                raw = socket.create_connection(("127.0.0.1", port), timeout=30)
                s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
                s.sendall(PREAMBLE + frame([request(i + 1, "echo", "echo", b"real")]))
                got = recv_exact(s, 8 + 4 + 13 + 4)
                times.append(time.perf_counter() - t)
                assert got.endswith(b"real"), got
                s.close()
            times.sort()
            print(f"  20 of 20 served: handshake + echo median {times[10] * 1000:.1f} ms, "
                  f"max {times[-1] * 1000:.1f} ms")
        except Exception as e:  # noqa: BLE001 - a measurement reports what failed
            print(f"  failed: {e!r}")
        finally:
            for s in stalled:
                s.close()
            server.kill()


def stalled_mid_frame(volley, peers, read_timeout_s):
    print(f"{peers} peers stalled in the middle of a frame (read timeout {read_timeout_s} s)")
    port = free_port()
    cmd = [volley, "serve-echo", "--listen", f"tcp://127.0.0.1:{port}"]
    server = start(cmd, port)
    ends, lock = [], threading.Lock()

    def peer():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(PREAMBLE + struct.pack("<I", 100) + b"\x01" * 10)
        t = time.perf_counter()
        s.settimeout(read_timeout_s * 3 + 30)
        data = bytearray()
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        go_away = len(data) > 12 and data[12] == 0x07 and struct.unpack_from("<H", data, 13)[0] == 12
        with lock:
            ends.append((time.perf_counter() - t, go_away))

    threads = [threading.Thread(target=peer) for _ in range(peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.kill()
    times = sorted(e[0] for e in ends)
    with_go_away = sum(1 for e in ends if e[1])
    print(f"  {with_go_away} of {peers} got GoAway(Protocol); closed after {times[0]:.2f} s to {times[-1]:.2f} s")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def frames(volley, peers):
    size = 16 << 20
    print(f"{peers} peers each sending a {size >> 20} MiB frame minus one byte")
    port = free_port()
    server = start([volley, "serve-echo", "--listen", f"tcp://127.0.0.1:{port}"], port)
    before = rss_kib(server.pid)
    body = b"\0" * (size - 1)
    held = []

    def peer():
        s = socket.create_connection(("127.0.0.1", port))
        held.append(s)
        try:
            s.sendall(PREAMBLE + struct.pack("<I", size) + body)
        except OSError:
            pass

    threads = [threading.Thread(target=peer, daemon=True) for _ in range(peers)]
    for t in threads:
        t.start()
    time.sleep(5)  # the senders past the budget stay blocked in sendall
    after = rss_kib(server.pid)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(PREAMBLE)
    recv_exact(c, 8)
    answered, t = 0, time.perf_counter()
    for i in range(20):
        c.sendall(frame([request(i + 1, "echo", "echo", b"canary")]))
        n = struct.unpack("<I", recv_exact(c, 4))[0]
        recv_exact(c, n)
        answered += 1
    took = time.perf_counter() - t
    print(f"  server RSS {before / 1024:.0f} MiB before, {after / 1024:.0f} MiB with the frames held; "
          f"canary: {answered} of 20 answered in {took * 1000:.0f} ms")
    for s in held:
        s.close()
    server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--volley", default="target/release/volley")
    ap.add_argument("--only", nargs="*", choices=["deep", "flood", "stalled", "frames"])
    ap.add_argument("--stalled-connections", type=int, default=10_050)
    ap.add_argument("--read-timeout-s", type=float, default=30.0)
    args = ap.parse_args()
    todo = args.only or ["deep", "flood", "stalled", "frames"]
    if "deep" in todo:
        deep(args.volley)
    if "flood" in todo:
        flood(args.volley, args.stalled_connections)
    if "stalled" in todo:
        stalled_mid_frame(args.volley, 240, args.read_timeout_s)
    if "frames" in todo:
        frames(args.volley, 32)


if __name__ == "__main__":
    main()
