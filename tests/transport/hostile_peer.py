"""A local peer WITHOUT the session secret that tries to make the collector hold memory.

Run: python -m tests.transport.hostile_peer HOST PORT SECONDS [connections]
With "connections": only open (and drop) bare TCP connections as fast as one thread can, up to
500 held at once, and print how many a second. Otherwise:
Three attacks in parallel until SECONDS pass, then it prints how many bytes it pushed:
- zmq DEALERs (no CURVE) sending 1 MiB multi-frame messages with bad signatures;
- a zmq DEALER with CURVE keys from a wrong secret, same messages;
- raw TCP connections that greet as a CURVE client and then stream one ~1 MiB frame each,
  never finishing it (what zmq reads before the handshake can fail), up to 200 at once.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

import zmq

from ddpviz.transport.handshake import secure_client

CHUNK = 1 << 20


def _zmq_flood(address: str, deadline: float, secret: bytes | None, sent: list[int]) -> None:
    ctx = zmq.Context()
    junk = [b"ddpviz", b"0" * 64, b"h" * 100] + [b"x" * CHUNK] * 8
    while time.monotonic() < deadline:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 200)
        if secret is not None:
            secure_client(sock, secret)
        sock.connect(address)
        for _ in range(20):
            try:
                sock.send_multipart(junk)
                sent[0] += 8 * CHUNK
            except zmq.Again:
                break
        sock.close(linger=0)
    ctx.term()


def _greeting(mechanism: bytes) -> bytes:
    return (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0"
            + b"\0" * 31)


def _raw_flood(host: str, port: int, deadline: float, sent: list[int]) -> None:
    open_socks: list[socket.socket] = []
    body = b"y" * (CHUNK - 1)
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((host, port), timeout=1.0)
            s.sendall(_greeting(b"CURVE"))
            s.sendall(b"\x06" + struct.pack(">Q", CHUNK))  # a long command frame of 1 MiB
            s.sendall(body)  # ... all but its last byte: zmq keeps waiting for it
            sent[0] += CHUNK
            open_socks.append(s)
        except OSError:
            pass
        if len(open_socks) >= 200:
            open_socks.pop(0).close()
    for s in open_socks:
        s.close()


def _connection_flood(host: str, port: int, seconds: float) -> float:
    held: list[socket.socket] = []
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((host, port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        held.append(s)
        n += 1
        if len(held) > 500:
            held.pop(0).close()
    for s in held:
        s.close()
    return n / (time.monotonic() - start)


def main() -> None:
    host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    if sys.argv[4:] == ["connections"]:
        print(int(_connection_flood(host, port, seconds)))
        return
    address = f"tcp://{host}:{port}"
    deadline = time.monotonic() + seconds
    sent = [[0] for _ in range(4)]
    threads = [
        threading.Thread(target=_zmq_flood, args=(address, deadline, None, sent[0])),
        threading.Thread(target=_zmq_flood, args=(address, deadline, b"wrong" * 8, sent[1])),
        threading.Thread(target=_raw_flood, args=(host, port, deadline, sent[2])),
        threading.Thread(target=_raw_flood, args=(host, port, deadline, sent[3])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sum(s[0] for s in sent))


if __name__ == "__main__":
    main()
