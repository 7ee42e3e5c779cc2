"""A TCP link between a client and a server on 127.0.0.1 that a test can cut and heal:
cut, every open connection is closed and new ones are closed as soon as they are
accepted (the far side is unreachable, as across a network partition); healed, bytes
flow again. Protocol-blind: it carries S3 to moto and JSON to the GCS emulator alike."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit


class TcpLink:
    """``with TcpLink("http://127.0.0.1:9000") as link: ... link.url ... link.cut()``."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.scheme = parts.scheme or "http"
        self.down = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"{self.scheme}://{host}:{port}"

    def __enter__(self) -> TcpLink:
        threading.Thread(target=self._accept, name="tcplink", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self.cut()
        self._listener.close()

    def cut(self) -> None:
        self.down.set()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def heal(self) -> None:
        self.down.clear()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down.is_set():
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                _close(sock)
                with self._lock:
                    self._open.discard(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
