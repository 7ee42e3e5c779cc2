"""An HTTP proxy in front of the moto S3 server on 127.0.0.1 that records every request
and can fail or hold chosen ones: 5xx injection, and a gate that parks a request until
a test has killed the client."""

from __future__ import annotations

import http.client
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Rule = Callable[[str, str], "tuple | None"]  # (method, path) -> action or None


class _QuietServer(ThreadingHTTPServer):
    """A client that went away (a SIGKILLed trainer, whose held request is answered
    later) is expected here: not a traceback on stderr in whatever test runs then."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.log: list[tuple[str, str, int]] = []  # (method, path, status) in arrival order
        self.rules: list[Rule] = []
        self.injected = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                action = proxy._action(self.command, self.path)
                if action and action[0] == "error":
                    status = action[1]
                    payload = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                        f"{'SlowDown' if status == 503 else 'InternalError'}</Code>"
                        f"<Message>injected by the test proxy</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    proxy._record(self.command, self.path, status)
                    return
                if action and action[0] == "hold":
                    action[1].set()  # tell the test; it will kill the client
                    time.sleep(action[2])  # the client is gone before this returns
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("transfer-encoding", "expect", "connection", "content-length")
                }
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()
                proxy._record(self.command, self.path, resp.status)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def _action(self, method: str, path: str):
        with self._lock:
            for rule in self.rules:
                action = rule(method, path)
                if action:
                    if action[0] == "error":
                        self.injected += 1
                    return action
        return None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.log.append((method, path, status))

    # --- rules ---------------------------------------------------------------
    def fail_every(self, n: int, status: int = 500, methods=("PUT", "POST")) -> None:
        """Fail every n-th matching request (1st, n+1-th, ...) with ``status``."""
        count = [0]

        def rule(method: str, path: str):
            if method in methods:
                count[0] += 1
                if count[0] % n == 1 or n == 1:
                    return ("error", status)
            return None

        self.rules.append(rule)

    def hold_first(self, match: Callable[[str, str], bool], event: threading.Event, seconds: float = 30) -> None:
        fired = [False]

        def rule(method: str, path: str):
            if not fired[0] and match(method, path):
                fired[0] = True
                return ("hold", event, seconds)
            return None

        self.rules.append(rule)

    def writes(self, status: int = 200) -> list[str]:
        """Paths of successful object writes (PUT, and POST completing a multipart)."""
        return [
            p.split("?")[0]
            for m, p, s in self.log
            if s == status and (m == "PUT" and "uploadId=" not in p or m == "POST" and "uploadId=" in p)
        ]
