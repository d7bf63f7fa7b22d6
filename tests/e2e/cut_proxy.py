"""A loopback TCP forwarder that can be cut: a sink that fails at once (connection closed), where a
frozen server would only fail after the client's 30 s request timeout."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class CutProxy:
    """127.0.0.1:`port` -> `target`. `cut()`: every open connection is closed and new ones are
    closed as soon as accepted, until the context ends."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="cut-proxy", daemon=True).start()

    @contextlib.contextmanager
    def cut(self) -> Iterator[None]:
        self._cut.set()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()
        try:
            yield
        finally:
            self._cut.clear()

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            for sock in self._open:
                _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _close(sock)
                with self._lock:
                    self._open.discard(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
