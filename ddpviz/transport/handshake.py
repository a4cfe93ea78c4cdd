"""Who may talk to a collector: CURVE keys from the session secret, and a cap on the peers that
have connected but not yet proven they hold it; and how either end notices that a connection
went silent (See [Note: a silent link]).

[Note: transport authentication]
Every message is HMAC-signed (codec.py), but a signature is only checked once zmq has handed the
whole message over, and zmq buffers a peer's messages (any number of frames, per peer) before
that. So a peer without the secret could make the kernel hold gigabytes of junk. The link is
therefore also a CurveZMQ one: both key pairs are derived from the session secret (so the
connect string stays `tcp://HOST:PORT#SECRET`), the server's public key never travels on the
wire, and a peer that does not know it fails the handshake: zmq then drops the connection
before it reads a single message. What an unauthenticated peer can still make the kernel hold is
the handshake in progress: at most `max_frame` bytes (zmq's MAXMSGSIZE) plus zmq's 8 KiB read
batch per connection, for at most `HANDSHAKE_S` seconds, and at most `MAX_PENDING` such
connections at a time: the collector watches zmq's socket monitor and shuts the oldest pending
connections down beyond that. Failed handshakes are counted as "auth" rejects. The HMAC
signature and the per-sender sequence check (collector.py) still apply inside the encrypted link.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import socket
import time
from typing import NamedTuple

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

HANDSHAKE_S = 5.0  # zmq drops a connection whose handshake takes longer
_MAX_CONFIRMED = 1 << 16  # connections remembered as past their handshake
MAX_PENDING = 12  # connections allowed mid-handshake at once (the oldest beyond go): with
#                  4 MiB messages, 12 x 4.125 MiB ~ 50 MiB of unverified data at most

LINK_PING_S = 2.0  # each end pings the other this often, and drops a connection that carried
LINK_TIMEOUT_S = 15.0  # no byte for this long (See [Note: a silent link])

# [Note: a silent link]
# A network can cut a connection without a FIN or an RST: a partition, a host that died hard,
# a NAT mapping or a tunnel dropped. TCP then says nothing for many minutes (and never, for a
# connection with nothing to send), so a sender waited for confirmations forever (See [Note:
# confirmed batches] in sender.py) and a collector kept its peers. Both ends therefore ping the
# other every LINK_PING_S (ZMTP heartbeats, answered by zmq's own I/O thread: a busy Python
# thread on either end does not count as silence) and drop a connection on which no byte
# arrived for LINK_TIMEOUT_S; the PING's time-to-live makes the far end drop its side too. The
# sender then reconnects (a connect or a handshake that hangs in a partition is given up after
# LINK_TIMEOUT_S and tried again, so the link is found soon after it heals), greets, and
# resends what is unconfirmed; whatever its close deadline finds unconfirmed counts as dropped.


def watch_link(sock: zmq.Socket[bytes], *, client: bool) -> None:
    """Make `sock` (before bind or connect) drop a connection that went silent (See [Note: a
    silent link])."""
    ms = int(LINK_TIMEOUT_S * 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(LINK_PING_S * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, ms)
    if client:  # (a server's handshakes are limited to HANDSHAKE_S by secure_server)
        sock.setsockopt(zmq.CONNECT_TIMEOUT, ms)
        sock.setsockopt(zmq.HANDSHAKE_IVL, ms)


_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_WATCHED = zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | _FAILED


class CurveKeys(NamedTuple):
    server_public: bytes  # z85; known only to holders of the secret
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def curve_keys(secret: bytes) -> CurveKeys:
    """Both CURVE key pairs of a session, derived from its secret (See [Note: transport
    authentication])."""
    if not zmq.has("curve"):
        raise RuntimeError("ddpviz: this pyzmq/libzmq lacks CURVE support, which ddpviz needs to "
                           "keep peers without the secret out.\nInstall pyzmq's wheel "
                           "(`pip install --force-reinstall pyzmq`), which bundles libsodium.")

    def pair(role: bytes) -> tuple[bytes, bytes]:
        seed = hashlib.sha256(b"ddpviz-curve-" + role + b"\0" + secret).digest()
        secret_key = z85.encode(seed)
        return zmq.curve_public(secret_key), secret_key

    server, client = pair(b"server"), pair(b"client")
    return CurveKeys(*server, *client)


def secure_server(sock: zmq.Socket[bytes], secret: bytes) -> None:
    keys = curve_keys(secret)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))


def secure_client(sock: zmq.Socket[bytes], secret: bytes) -> None:
    """Make `sock` (before connect) able to talk to a collector of this session secret."""
    keys = curve_keys(secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)


class PendingGuard:
    """Reads a server socket's monitor: counts failed handshakes and keeps at most
    `max_pending` connections mid-handshake (shutting the oldest down). Not thread-safe: the
    collector's thread owns it.

    [Note: which connection is pending]
    zmq's monitor names the listening endpoint in every event, gives the descriptor only in
    ACCEPTED and DISCONNECTED, and reaches us behind the messages: under a flood of thousands
    of connections a second, a sender's first message is often read before its ACCEPTED event,
    and by then a descriptor may already belong to another connection. So a connection is
    known by its socket's inode (unique per socket while it exists, never a recycled number
    in practice: the kernel counts them up), read with fstat: `confirm` records the inode of
    every connection a signed-in message arrived on, and a late ACCEPTED for such an inode is
    ignored. Shutting a connection that had finished its handshake loses what was in flight
    (the sender counted it as sent), so a connection once confirmed is never shut; the sender
    sends no events on a connection before the collector answered its hello (sender.py), so a
    connection shut while still pending carried no events. The guard holds no duplicate of a
    pending connection's descriptor (that would keep connections zmq closed open): before
    shutting one it duplicates the descriptor and checks the inode, so it never shuts a
    connection that took over a recycled number.
    """

    def __init__(self, sock: zmq.Socket[bytes], max_pending: int = MAX_PENDING) -> None:
        self.monitor = sock.get_monitor_socket(_WATCHED)
        self.max_pending = max_pending
        self.failed = 0  # handshakes that failed: peers without the secret
        self.shut = 0  # pending connections shut down for being over the cap
        # socket inode -> (zmq's descriptor for it, when accepted). No duplicate is held: that
        # would keep a connection zmq has closed (a failed handshake) open until we let go.
        self._pending: dict[int, tuple[int, float]] = {}
        self._confirmed: dict[int, None] = {}  # inodes past their handshake (oldest first)

    def service(self, enforce: bool = True) -> int:
        """Handle the monitor's queued events; returns how many handshakes failed among them.
        With enforce=False the cap is left to a later `enforce()` (the collector first reads
        the messages waiting, so that connections that already spoke are confirmed)."""
        failed = 0
        while True:
            try:
                msg = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = parse_monitor_message(msg)
            kind, value = event["event"], int(event["value"])
            if kind == zmq.EVENT_ACCEPTED:
                self._accepted(value)
            elif kind & _FAILED:
                failed += 1
        if enforce:
            self.enforce()
        self.failed += failed
        if failed and not self._pending:
            _trim_heap()
        return failed

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _accepted(self, fd: int) -> None:
        inode = _inode(fd)
        if inode is None or inode in self._confirmed:  # gone, or a late event for a
            return  # connection that already spoke
        self._pending.pop(inode, None)
        self._pending[inode] = (fd, time.monotonic())

    def confirm(self, fd: int) -> None:
        """A signed-in message arrived on the connection with descriptor `fd` (zmq's SRCFD), so
        its handshake succeeded: it is not pending, now or when its ACCEPTED event comes."""
        inode = _inode(fd)
        if inode is None:
            return
        self._confirmed[inode] = None
        if len(self._confirmed) > _MAX_CONFIRMED:
            del self._confirmed[next(iter(self._confirmed))]
        self._pending.pop(inode, None)

    def enforce(self) -> None:
        """Forget pending connections that are over (zmq closed them), then shut the oldest
        beyond the cap."""
        now = time.monotonic()
        for inode, (fd, since) in list(self._pending.items()):
            if now - since > HANDSHAKE_S + 2.0 or _inode(fd) != inode:
                del self._pending[inode]
        while len(self._pending) > self.max_pending:
            inode = next(iter(self._pending))  # the oldest
            fd, _ = self._pending.pop(inode)
            try:  # the duplicate pins the connection: a recycled descriptor is never shut
                dup = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            with dup:
                if _inode(dup.fileno()) == inode:
                    with contextlib.suppress(OSError):
                        dup.shutdown(socket.SHUT_RDWR)  # zmq sees the end and frees it
                    self.shut += 1

    def close(self) -> None:
        self._pending.clear()
        self.monitor.close(linger=0)


def _inode(fd: int) -> int | None:
    """The socket behind descriptor `fd`, or None when it is closed."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None


_TRIM_EVERY_S = 1.0
_last_trim = 0.0


def _trim_heap() -> None:
    """Give freed heap back to the OS (glibc keeps it in its arenas): after a flood of failed
    handshakes, the buffers zmq freed would otherwise stay in the kernel's RSS. At most once a
    second; a no-op where glibc's malloc_trim is missing."""
    global _last_trim
    now = time.monotonic()
    if now - _last_trim < _TRIM_EVERY_S:
        return
    _last_trim = now
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
