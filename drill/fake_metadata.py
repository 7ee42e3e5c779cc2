"""A fake instance metadata service for drills and tests: AWS IMDSv2 and the GCP
metadata server on one real HTTP server on 127.0.0.1.

AWS (IMDSv2 only, as the fleet's launch templates require):

* ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1-21600)
  returns a session token; without a valid TTL header: 400.
* ``GET /latest/meta-data/...`` without a valid ``X-aws-ec2-metadata-token``: 401.
* ``spot/instance-action``: ``{"action": ..., "time": "...Z"}`` once an interruption
  is scheduled, else 404. ``events/recommendations/rebalance``:
  ``{"noticeTime": "...Z"}`` once recommended, else 404. ``instance-id``.
* ``autoscaling/target-lifecycle-state``: ``InService`` until the group terminates
  the instance (:meth:`FakeMetadataServer.terminate_in_group`), then ``Terminated``.
  ``tags/instance/aws:autoscaling:groupName``: the group's name when one is given
  (``group_name``; else 404, as outside a group).

GCP (``/computeMetadata/v1/instance/...``; without ``Metadata-Flavor: Google``: 403):

* ``preempted``: ``TRUE``/``FALSE``; ``maintenance-event``: ``NONE``,
  ``MIGRATE_ON_HOST_MAINTENANCE`` or ``TERMINATE_ON_HOST_MAINTENANCE``; ``name``.
* Every answer carries an ``ETag``. ``?wait_for_change=true`` long-polls: it answers
  at once when ``last_etag`` differs from the current ETag, otherwise when the value
  changes or after ``timeout_sec``.

Control it from Python (:class:`FakeMetadataServer` methods) or, when it runs as a
process (``python -m drill.fake_metadata --port N``), over HTTP with
:class:`FakeMetadataClient`, which has the same methods. The process prints one JSON
line ``{"url": ..., "port": ...}`` once it listens.

This module ships in the package (the drill starts it) and uses the standard library
only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import http.server
import json
import secrets
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

MAX_TOKEN_TTL_S = 21600
CONTROL_PREFIX = "/_fake/"
_AWS_META = "/latest/meta-data/"
_GCP_INSTANCE = "/computeMetadata/v1/instance/"
MAINTENANCE_EVENTS = ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE")


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class _State:
    """Everything the fake knows, guarded by one condition variable that long polls
    wait on."""

    def __init__(self, instance_id: str, max_wait_s: float, group_name: str | None) -> None:
        self.instance_id = instance_id
        self.group_name = group_name
        self.max_wait_s = max_wait_s
        self.cond = threading.Condition()
        self.closing = False
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.requests: list[tuple[str, str]] = []
        self.reset()

    def reset(self) -> None:
        with self.cond:
            self.instance_action: dict[str, str] | None = None
            self.rebalance: dict[str, str] | None = None
            self.lifecycle_state = "InService"
            self.gcp = {"preempted": "FALSE", "maintenance-event": "NONE", "name": self.instance_id}
            self.tokens.clear()
            self.cond.notify_all()

    def set_gcp(self, key: str, value: str) -> None:
        with self.cond:
            self.gcp[key] = value
            self.cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            return {
                "instance_action": self.instance_action,
                "rebalance": self.rebalance,
                "lifecycle_state": self.lifecycle_state,
                "gcp": dict(self.gcp),
                "tokens_issued": len(self.tokens),
                "requests": len(self.requests),
            }


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "FakeMetadata/1"
    state: _State  # set on the subclass the server builds
    quiet = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if not self.quiet:
            super().log_message(format, *args)

    def _send(
        self,
        status: int,
        body: str | bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "text/plain",
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left during a long poll (a node killed or stopped): nobody to answer

    def _record(self) -> urllib.parse.SplitResult:
        url = urllib.parse.urlsplit(self.path)
        with self.state.cond:
            self.state.requests.append((self.command, url.path))
        return url

    # -- AWS ---------------------------------------------------------------------

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        url = self._record()
        if url.path != "/latest/api/token":
            return self._send(404, "Not Found")
        raw = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOKEN_TTL_S:
            return self._send(400, "Bad Request: token TTL header missing or invalid")
        token = secrets.token_urlsafe(32)
        with self.state.cond:
            self.state.tokens[token] = time.monotonic() + int(raw)
        self._send(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": raw})

    def _aws_get(self, path: str) -> None:
        st = self.state
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        with st.cond:
            expiry = st.tokens.get(token)
            items = {
                "spot/instance-action": st.instance_action,
                "events/recommendations/rebalance": st.rebalance,
                "instance-id": st.instance_id,
                "autoscaling/target-lifecycle-state": st.lifecycle_state,
                "tags/instance/aws:autoscaling:groupName": st.group_name,
            }
        if expiry is None or expiry < time.monotonic():
            return self._send(401, "Unauthorized")
        item = items.get(path)
        if item is None:  # unknown path, or no such event (yet)
            return self._send(404, "Not Found")
        if isinstance(item, str):
            return self._send(200, item)
        self._send(200, json.dumps(item), content_type="application/json")

    # -- GCP ---------------------------------------------------------------------

    def _gcp_get(self, key: str, query: dict[str, list[str]]) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        st = self.state
        with st.cond:
            if key not in st.gcp:
                return self._send(404, "Not Found")
            if query.get("wait_for_change", ["false"])[0].lower() == "true":
                baseline = query.get("last_etag", [_etag(st.gcp[key])])[0]
                try:
                    wait = float(query.get("timeout_sec", [st.max_wait_s])[0])
                except ValueError:
                    return self._send(400, "Bad Request: timeout_sec")
                end = time.monotonic() + min(max(wait, 0.0), st.max_wait_s)
                while _etag(st.gcp[key]) == baseline and not st.closing and time.monotonic() < end:
                    st.cond.wait(max(0.0, end - time.monotonic()))
            value = st.gcp[key]
        self._send(200, value, {"ETag": _etag(value), "Metadata-Flavor": "Google"}, content_type="application/text")

    def do_GET(self) -> None:  # noqa: N802
        url = self._record()
        if url.path.startswith(_AWS_META):
            return self._aws_get(url.path[len(_AWS_META) :])
        if url.path.startswith(_GCP_INSTANCE):
            return self._gcp_get(url.path[len(_GCP_INSTANCE) :], urllib.parse.parse_qs(url.query))
        if url.path == CONTROL_PREFIX + "state":
            return self._send(200, json.dumps(self.state.snapshot()), content_type="application/json")
        self._send(404, "Not Found")

    # -- control -------------------------------------------------------------------

    def do_POST(self) -> None:  # noqa: N802
        url = self._record()
        if not url.path.startswith(CONTROL_PREFIX):
            return self._send(405, "Method Not Allowed")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            args = json.loads(self.rfile.read(length) or b"{}")
            fake = self.server.fake  # type: ignore[attr-defined]
            result = _control(fake, url.path[len(CONTROL_PREFIX) :], args)
        except (ValueError, TypeError, KeyError) as exc:
            return self._send(400, f"Bad Request: {exc}")
        self._send(200, json.dumps(result), content_type="application/json")


def _control(server: FakeMetadataServer, op: str, args: dict[str, Any]) -> Any:
    ops = {
        "spot-interruption": lambda: server.schedule_spot_interruption(**args),
        "rebalance": lambda: server.recommend_rebalance(**args),
        "group-termination": lambda: server.terminate_in_group(**args),
        "preempt": lambda: server.preempt(**args),
        "maintenance": lambda: server.maintenance(**args),
        "expire-tokens": lambda: server.expire_tokens(),
        "reset": lambda: server.reset(),
    }
    if op not in ops:
        raise KeyError(f"unknown control operation {op!r}")
    return ops[op]()


class FakeMetadataServer:
    """The fake, in this process. ``port=0`` picks a free port; :attr:`url` is the
    base URL to give the watcher (FTFLEET_METADATA_ENDPOINT)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        instance_id: str = "i-0fake0000000000000",
        group_name: str | None = None,
        max_wait_s: float = 30.0,
        quiet: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self._state = _State(instance_id, max_wait_s, group_name)
        self._quiet = quiet
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> FakeMetadataServer:
        """Listen (again, on the same port after :meth:`stop`) and serve in a thread."""
        handler = type("Handler", (_Handler,), {"state": self._state, "quiet": self._quiet})
        httpd = http.server.ThreadingHTTPServer((self.host, self.port), handler)
        httpd.daemon_threads = True
        httpd.fake = self  # type: ignore[attr-defined]
        self.port = httpd.server_address[1]
        self._state.closing = False
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="fake-metadata", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening; pending long polls return at once. State is kept."""
        if self._httpd is None:
            return
        with self._state.cond:
            self._state.closing = True
            self._state.cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeMetadataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- control -------------------------------------------------------------------

    def schedule_spot_interruption(self, action: str = "terminate", in_seconds: float = 120.0) -> dict[str, str]:
        """Post spot/instance-action now: the instance is ``action``-ed in ``in_seconds``."""
        if action not in ("terminate", "stop", "hibernate"):
            raise ValueError(f"action {action!r}: use terminate, stop or hibernate")
        item = {"action": action, "time": _iso(time.time() + float(in_seconds))}
        with self._state.cond:
            self._state.instance_action = item
        return item

    def recommend_rebalance(self) -> dict[str, str]:
        """Post events/recommendations/rebalance with the current time."""
        item = {"noticeTime": _iso(time.time())}
        with self._state.cond:
            self._state.rebalance = item
        return item

    def terminate_in_group(self) -> str:
        """Set autoscaling/target-lifecycle-state to Terminated: the Auto Scaling group
        is terminating the instance (scale-in, rebalancing, a health replacement) and its
        lifecycle hook holds it in Terminating:Wait."""
        with self._state.cond:
            self._state.lifecycle_state = "Terminated"
        return "Terminated"

    def preempt(self) -> str:
        """Set instance/preempted to TRUE (GCE stops the VM 30 s later)."""
        self._state.set_gcp("preempted", "TRUE")
        return "TRUE"

    def maintenance(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> str:
        """Set instance/maintenance-event (NONE ends the event)."""
        if event not in MAINTENANCE_EVENTS:
            raise ValueError(f"maintenance event {event!r}: use one of {', '.join(MAINTENANCE_EVENTS)}")
        self._state.set_gcp("maintenance-event", event)
        return event

    def expire_tokens(self) -> int:
        """Invalidate every IMDSv2 token issued so far (clients must fetch a new one)."""
        with self._state.cond:
            count = len(self._state.tokens)
            self._state.tokens.clear()
        return count

    def reset(self) -> None:
        """No notices, no tokens; the request log is kept."""
        self._state.reset()

    def state(self) -> dict[str, Any]:
        return self._state.snapshot()

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request served so far."""
        with self._state.cond:
            return list(self._state.requests)


class FakeMetadataClient:
    """Controls a fake running in another process, with the server's method names."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _post(self, op: str, **args: Any) -> Any:
        request = urllib.request.Request(
            self.url + CONTROL_PREFIX + op,
            method="POST",
            data=json.dumps(args).encode(),
            headers={"Content-Type": "application/json"},
        )
        with self._opener.open(request, timeout=self.timeout_s) as response:
            return json.loads(response.read())

    def schedule_spot_interruption(self, action: str = "terminate", in_seconds: float = 120.0) -> dict[str, str]:
        return self._post("spot-interruption", action=action, in_seconds=in_seconds)

    def recommend_rebalance(self) -> dict[str, str]:
        return self._post("rebalance")

    def terminate_in_group(self) -> str:
        return self._post("group-termination")

    def preempt(self) -> str:
        return self._post("preempt")

    def maintenance(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> str:
        return self._post("maintenance", event=event)

    def expire_tokens(self) -> int:
        return self._post("expire-tokens")

    def reset(self) -> None:
        self._post("reset")

    def state(self) -> dict[str, Any]:
        with self._opener.open(self.url + CONTROL_PREFIX + "state", timeout=self.timeout_s) as response:
            return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drill.fake_metadata", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--instance-id", default="i-0fake0000000000000")
    parser.add_argument("--group-name", default=None, help="the instance's Auto Scaling group (default: none)")
    parser.add_argument("--max-wait", type=float, default=30.0, help="ceiling of a wait_for_change long poll, seconds")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    server = FakeMetadataServer(
        args.host,
        args.port,
        instance_id=args.instance_id,
        group_name=args.group_name,
        max_wait_s=args.max_wait,
        quiet=not args.verbose,
    ).start()
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    print(json.dumps({"url": server.url, "port": server.port}), flush=True)
    while not stopping.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
