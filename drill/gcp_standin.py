"""A stand-in for Compute Engine's REST API on 127.0.0.1: regional managed instance
groups, as the API reference documents the calls ftfleet makes on them (the tests and
the GCP capacity-loss drill use it).

No Compute Engine emulator exists. :class:`Compute` answers
``regionInstanceGroupManagers.get`` (``targetSize``), ``.listManagedInstances`` (POST;
``managedInstances[]`` with ``instanceStatus`` and ``currentAction``), ``.listErrors``
(GET; ``items[]`` with ``error.code``, ``error.message`` and an RFC 3339 ``timestamp``)
``.resize`` (POST with the ``size`` query parameter; answers an Operation) and
``.deleteInstances`` (POST; ``instances[]`` of instance URLs: each goes and the target
size drops by one; ``skipInstancesOnValidationError`` skips one not in the group), in any
region of one project, and 404 for a group that does not exist. Both lists are paged
with ``maxResults``/``pageToken``/``nextPageToken``, two items a page, fewer than asked
for, as the API may.

An instance's URL names its position in the group's list, so a deletion names what the
last listing showed. A resize changes the target size at once and the instances as a MIG does over time: a
resize down marks the surplus ``STOPPING``/``DELETING`` (listed until :meth:`settle`,
which is the VMs' shutdown), a resize up adds ``STAGING``/``CREATING`` instances (running
after :meth:`settle`), or, for a group whose zone is out of resources
(``stocked_out``), none, recording ``ZONE_RESOURCE_POOL_EXHAUSTED`` in its errors; a
stocked-out group short of its target records another such error every
:data:`RETRY_S` when its errors are read, as a MIG keeps trying to create.

The same server takes Cloud Monitoring's ``projects.timeSeries.create`` (POST
``/v3/projects/P/timeSeries``) and keeps every series in ``series``: a function under
the drill writes its metrics there (``FTFLEET_MONITORING_ENDPOINT``).
"""

from __future__ import annotations

import datetime
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STOCKOUT = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
    "message": "The zone 'projects/proj-test/zones/us-central1-a' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later.",
}
RUNNING, CREATING, DELETING = ("RUNNING", "NONE"), ("STAGING", "CREATING"), ("STOPPING", "DELETING")
#: A stocked-out MIG's creation attempts, one error each.
RETRY_S = 30.0


def rfc3339(epoch: float) -> str:
    """As Compute Engine writes a timestamp: milliseconds and a local offset."""
    tz = datetime.timezone(datetime.timedelta(hours=-8))
    return datetime.datetime.fromtimestamp(epoch, tz).isoformat(timespec="milliseconds")


class Compute:
    """The stand-in (module doc). ``groups[name]`` holds ``region``, ``target``,
    ``instances`` ([(instanceStatus, currentAction)]), ``errors`` ([(epoch, error)]) and
    ``stocked_out``; ``calls`` records (method, path after the group collection) of every
    request; ``status`` other than 200 answers every request with it."""

    PAGE = 2

    def __init__(self, project: str, clock=time.time):
        self.project, self.clock = project, clock
        self.groups: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.series: list[dict] = []
        self.status = 200
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.answer(*outer.answer("GET", self.path))

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/v3/projects/") and self.path.endswith("/timeSeries"):
                    outer.series.extend(json.loads(body or b"{}").get("timeSeries") or [])
                    self.answer(200, {})
                    return
                self.answer(*outer.answer("POST", self.path, json.loads(body or b"{}")))

            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def group(self, name, target, ready=0, booting=(), errors=(), region="us-central1", stocked_out=False):
        self.groups[name] = {
            "region": region,
            "target": target,
            "instances": [RUNNING] * ready + list(booting),
            "errors": list(errors),
            "stocked_out": stocked_out,
        }

    def lose_capacity(self, name: str) -> float:
        """The group's zone has no resources left: one of its VMs is preempted and none
        comes in its place. Returns when (the stand-in's clock)."""
        with self.lock:
            group = self.groups[name]
            group["stocked_out"] = True
            if RUNNING in group["instances"]:
                group["instances"].remove(RUNNING)
            now = self.clock()
            group["errors"].insert(0, (now, STOCKOUT))
            return now

    def settle(self) -> None:
        """The VMs being deleted are gone; those being created run."""
        with self.lock:
            for g in self.groups.values():
                g["instances"] = [RUNNING for i in g["instances"] if i != DELETING]

    def live(self, name: str) -> int:
        return sum(1 for i in self.groups[name]["instances"] if i != DELETING)

    def _resize(self, group: dict, size: int) -> None:
        group["target"] = size
        kept = [i for i in group["instances"] if i != DELETING]
        gone = [i for i in group["instances"] if i == DELETING]
        if len(kept) > size:
            gone += [DELETING] * (len(kept) - size)
            kept = kept[:size]
        elif len(kept) < size:
            if group["stocked_out"]:
                group["errors"].insert(0, (self.clock(), STOCKOUT))
            else:
                kept += [CREATING] * (size - len(kept))
        group["instances"] = kept + gone

    def answer(self, method, raw_path, body=None):
        url = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(url.query)
        head = f"/compute/v1/projects/{self.project}/regions/"
        region, _, rest = url.path.removeprefix(head).partition("/instanceGroupManagers/")
        rest = rest if url.path.startswith(head) else ""
        self.calls.append((method, rest or url.path))
        if self.status != 200:
            return self.status, {"error": {"code": self.status, "message": "backendError"}}
        name, _, verb = rest.partition("/")
        name = urllib.parse.unquote(name)
        with self.lock:
            group = self.groups.get(name)
            if (
                group is None
                or group["region"] != region
                or (method, verb)
                not in (
                    ("GET", ""),
                    ("POST", "listManagedInstances"),
                    ("GET", "listErrors"),
                    ("POST", "resize"),
                    ("POST", "deleteInstances"),
                )
            ):
                message = f"The resource 'projects/{self.project}/regions/{region}/instanceGroupManagers/{name}' "
                return 404, {
                    "error": {"code": 404, "message": message + "was not found", "errors": [{"reason": "notFound"}]}
                }
            if verb == "":
                return 200, {"kind": "compute#instanceGroupManager", "name": name, "targetSize": group["target"]}
            if verb == "resize":
                size = int(query["size"][0])
                if size < 0:
                    return 400, {"error": {"code": 400, "message": "Invalid value for field 'size'"}}
                self._resize(group, size)
                return 200, {"kind": "compute#operation", "operationType": "compute.instanceGroupManagers.resize"}
            if verb == "deleteInstances":
                urls = list((body or {}).get("instances") or [])
                live = [i for i, state in enumerate(group["instances"]) if state != DELETING]
                named = [int(u.rsplit("-", 1)[1]) for u in urls if u.startswith(f"{self.url}/instances/{name}-")]
                for index in named:
                    if index in live:
                        group["instances"][index] = DELETING
                        group["target"] = max(0, group["target"] - 1)
                return 200, {
                    "kind": "compute#operation",
                    "operationType": "compute.instanceGroupManagers.deleteInstances",
                }
            if verb == "listManagedInstances":
                items = [
                    {"instance": f"{self.url}/instances/{name}-{i}", "instanceStatus": s, "currentAction": a}
                    for i, (s, a) in enumerate(group["instances"])
                ]
                return 200, self.page(items, "managedInstances", query)
            if group["stocked_out"] and self.live(name) < group["target"]:
                newest = max((when for when, _ in group["errors"]), default=0.0)
                if self.clock() - newest >= RETRY_S:
                    group["errors"].insert(0, (self.clock(), STOCKOUT))
            items = [
                {
                    "error": error,
                    "timestamp": rfc3339(when),
                    "instanceActionDetails": {"action": "CREATING", "instance": f"{self.url}/instances/{name}-new"},
                }
                for when, error in group["errors"]
            ]
            return 200, self.page(items, "items", query)

    def page(self, items, key, query):
        start = int(query.get("pageToken", ["0"])[0])
        size = min(self.PAGE, int(query.get("maxResults", ["500"])[0]))
        body = {key: items[start : start + size]}
        if start + size < len(items):
            body["nextPageToken"] = str(start + size)
        return body
