"""A TCP proxy that can go silent: a partition, a host that died hard, a dropped NAT mapping.

`SilentLink(host, port)` listens on loopback and forwards every connection to (host, port).
`freeze()` stops it cold in both directions without closing anything: no byte is read, written,
accepted or refused, so neither end sees a FIN or an RST (the kernel's buffers fill, as a
partitioned route's would). `thaw()` carries on where it stopped: buffered bytes go through,
and a connection one end closed meanwhile then ends at the other end too.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time


class _Pipe:
    """One direction of one connection: bytes read from `src` that `dst` has not taken yet."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.pending = b""
        self.eof = False  # src ended: shut dst's write side once pending is out
        self.done = False


class SilentLink:
    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._frozen = threading.Event()
        self._stop = threading.Event()
        self._pipes: list[_Pipe] = []
        self.accepted = 0  # connections forwarded so far
        self._thread = threading.Thread(target=self._run, name="silent-link", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._listener.close()
        for pipe in self._pipes:
            pipe.src.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._frozen.is_set():
                time.sleep(0.01)
                continue
            self._round()

    def _round(self) -> None:
        # Per socket: read it while its pipe out is open and drained (backpressure), write it
        # while the pipe into it holds bytes.
        interest: dict[socket.socket, int] = {}
        for pipe in self._pipes:
            if pipe.pending:
                interest[pipe.dst] = interest.get(pipe.dst, 0) | selectors.EVENT_WRITE
            elif not pipe.eof:
                interest[pipe.src] = interest.get(pipe.src, 0) | selectors.EVENT_READ
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            for sock, events in interest.items():
                sel.register(sock, events)
            ready = {key.fileobj: mask for key, mask in sel.select(0.01)}
        if self._listener in ready:
            self._accept()
        for pipe in list(self._pipes):
            if ready.get(pipe.src, 0) & selectors.EVENT_READ and not pipe.pending:
                self._read(pipe)
            if ready.get(pipe.dst, 0) & selectors.EVENT_WRITE and pipe.pending:
                self._write(pipe)
        for pipe in [p for p in self._pipes if p.done]:
            self._pipes.remove(pipe)
            if not any(p.src is pipe.src or p.dst is pipe.src for p in self._pipes):
                pipe.src.close()
                pipe.dst.close()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        server = socket.create_connection(self._upstream)
        for s in (client, server):
            s.setblocking(False)
        self._pipes += [_Pipe(client, server), _Pipe(server, client)]
        self.accepted += 1

    def _read(self, pipe: _Pipe) -> None:
        try:
            data = pipe.src.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            pipe.pending = data
            self._write(pipe)
        else:
            pipe.eof = True
            self._end(pipe)

    def _write(self, pipe: _Pipe) -> None:
        try:
            n = pipe.dst.send(pipe.pending)
        except BlockingIOError:
            return
        except OSError:  # the far end is gone: what it was sent is lost, as with TCP
            pipe.pending, pipe.eof = b"", True
            self._end(pipe)
            return
        pipe.pending = pipe.pending[n:]
        self._end(pipe)

    def _end(self, pipe: _Pipe) -> None:
        if pipe.eof and not pipe.pending and not pipe.done:
            with contextlib.suppress(OSError):
                pipe.dst.shutdown(socket.SHUT_WR)
            pipe.done = True
