"""A local AWS endpoint for drills and tests: moto's server, with a stand-in for the
Auto Scaling calls moto 5.2.5 lacks (``CompleteLifecycleAction``,
``RecordLifecycleActionHeartbeat``) and for a region out of capacity.

One HTTP server on 127.0.0.1 in front of a ``ThreadedMotoServer``: every request is
passed to moto unchanged, except those two, which it answers itself and records (the
time it received them and their parameters). It checks what moto can tell: the group
exists, has a lifecycle hook of that name, and holds the instance; otherwise it answers
AWS's ``ValidationError``. moto has no ``Terminating:Wait`` state, so whether an action
is really pending is not checked.

**Out of capacity** (:meth:`AwsStandIn.lose_capacity`): moto launches every instance a
group asks for and keeps no record of scaling activities (DescribeScalingActivities
answers an empty list), so it cannot model a spot market with nothing left to sell.
For a group marked out of capacity, this server removes the group's instances from
moto's DescribeAutoScalingGroups answers and answers DescribeScalingActivities for the
group itself, with the one Failed launch AWS records in that case (its status message
names ``InsufficientInstanceCapacity``, its start is when the group was marked). Code
that reads a group's capacity (the capacity_watch function) then runs unchanged
against this endpoint, as it would against AWS. Groups are marked by name, in every
region; every other group's answers are moto's.

Why a proxy, and not a patch of ``BaseClient._make_api_call``: the caller is the
trainer, in torchrun's worker processes, and it must run unchanged; pointing
``AWS_ENDPOINT_URL`` at this server reaches it from any process, as a real endpoint
would, with every other call (CloudWatch, S3) served by moto.
"""

from __future__ import annotations

import datetime
import http.client
import http.server
import json
import sys
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from typing import Any

#: The Auto Scaling operations moto lacks, answered here.
STANDIN_ACTIONS = ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat")
_XMLNS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
#: What Auto Scaling records for a spot group's launch that found no capacity (the
#: status message of the Failed activity; "Troubleshoot Amazon EC2 Auto Scaling: EC2
#: instance launch failures").
NO_SPOT_CAPACITY = (
    "Could not launch Spot Instances. InsufficientInstanceCapacity - "
    "There is no Spot capacity available that matches your request."
)


class AwsStandIn:
    """``with AwsStandIn() as aws: os.environ["AWS_ENDPOINT_URL"] = aws.url``.
    :attr:`calls` lists ``{"action", "at", "params"}`` of every lifecycle call answered
    here; :attr:`out_of_capacity` maps each group marked out of capacity to when
    (epoch seconds)."""

    def __init__(self, moto_url: str | None = None) -> None:
        self._moto: Any = None
        self._moto_url = moto_url
        self.calls: list[dict[str, Any]] = []
        self.out_of_capacity: dict[str, float] = {}
        self._lock = threading.Lock()
        self._httpd: _Server | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> AwsStandIn:
        if self._moto_url is None:
            from moto.server import ThreadedMotoServer

            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._moto.start()
            host, port = self._moto.get_host_and_port()
            self._moto_url = f"http://{host}:{port}"
        handler = type("Handler", (_Handler,), {"standin": self})
        self._httpd = _Server(("127.0.0.1", 0), handler)
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="aws-standin", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._moto is not None:
            self._moto.stop()
            self._moto = None

    def __enter__(self) -> AwsStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def moto_url(self) -> str:
        assert self._moto_url is not None, "not started"
        return self._moto_url

    def completions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self.calls if c["action"] == "CompleteLifecycleAction"]

    # -- a region out of capacity -----------------------------------------------

    def lose_capacity(self, group: str, at: float | None = None) -> float:
        """Mark ``group`` out of capacity from ``at`` (default now); that time."""
        at = time.time() if at is None else at
        with self._lock:
            self.out_of_capacity[group] = at
        return at

    def restore_capacity(self, group: str) -> None:
        with self._lock:
            self.out_of_capacity.pop(group, None)

    def _lost_since(self, group: str) -> float | None:
        with self._lock:
            return self.out_of_capacity.get(group)

    def failed_launches(self, group: str, region: str = "us-east-1") -> str | None:
        """DescribeScalingActivities' answer for a group out of capacity: its one
        Failed launch (shaped as the Auto Scaling API returns it); None for any other
        group (moto answers)."""
        since = self._lost_since(group)
        if since is None:
            return None
        start = _iso(since)
        failed = f"{NO_SPOT_CAPACITY} Launching EC2 instance failed."
        root = ET.Element("DescribeScalingActivitiesResponse", xmlns=_XMLNS)
        activities = ET.SubElement(ET.SubElement(root, "DescribeScalingActivitiesResult"), "Activities")
        member = ET.SubElement(activities, "member")
        for tag, text in (
            ("ActivityId", str(uuid.uuid5(uuid.NAMESPACE_URL, f"{region}/{group}/{since}"))),
            ("AutoScalingGroupName", group),
            ("Description", f"Launching a new EC2 instance.  Status Reason: {failed}"),
            (
                "Cause",
                f"At {start} an instance was started in response to a difference between desired and "
                "actual capacity, increasing the capacity from 0 to 1.",
            ),
            ("StartTime", start),
            ("EndTime", start),
            ("StatusCode", "Failed"),
            ("StatusMessage", failed),
            ("Progress", "100"),
            ("Details", json.dumps({"Availability Zone": f"{region}a"})),
        ):
            ET.SubElement(member, tag).text = text
        ET.SubElement(ET.SubElement(root, "ResponseMetadata"), "RequestId").text = "standin"
        return ET.tostring(root, encoding="unicode")

    def hide_instances(self, body: bytes) -> bytes:
        """moto's DescribeAutoScalingGroups answer without the instances of the groups
        out of capacity (unchanged when none of them is in it)."""
        with self._lock:
            lost = set(self.out_of_capacity)
        if not lost:
            return body
        ns = {"a": _XMLNS}
        root = ET.fromstring(body)
        changed = False
        for group in root.iterfind("a:DescribeAutoScalingGroupsResult/a:AutoScalingGroups/a:member", ns):
            instances = group.find("a:Instances", ns)
            if group.findtext("a:AutoScalingGroupName", "", ns) in lost and instances is not None and len(instances):
                instances.clear()
                changed = True
        return ET.tostring(root, encoding="utf-8", default_namespace=_XMLNS) if changed else body

    # -- the lifecycle stand-in --------------------------------------------------

    def answer(self, action: str, params: dict[str, str]) -> tuple[int, str]:
        """(status, XML body) for a stand-in call, recorded whatever the answer."""
        at = time.time()
        with self._lock:
            self.calls.append({"action": action, "at": at, "params": params})
        problem = self._problem(params)
        if problem is not None:
            body = (
                f'<ErrorResponse xmlns="{_XMLNS}"><Error><Type>Sender</Type><Code>ValidationError</Code>'
                f"<Message>{problem}</Message></Error><RequestId>standin</RequestId></ErrorResponse>"
            )
            return 400, body
        return 200, (
            f'<{action}Response xmlns="{_XMLNS}"><{action}Result/>'
            f"<ResponseMetadata><RequestId>standin</RequestId></ResponseMetadata></{action}Response>"
        )

    def _problem(self, params: dict[str, str]) -> str | None:
        import boto3

        group, hook = params.get("AutoScalingGroupName", ""), params.get("LifecycleHookName", "")
        instance = params.get("InstanceId", "")
        asg = boto3.session.Session(
            aws_access_key_id="standin", aws_secret_access_key="standin", region_name="us-east-1"
        ).client("autoscaling", endpoint_url=self.moto_url)
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
        if not groups:
            return f"Group {group} not found"
        hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=group)["LifecycleHooks"]
        if hook not in {h["LifecycleHookName"] for h in hooks}:
            return f"No Lifecycle Hook found with name {hook} for group {group}"
        if instance and instance not in {i["InstanceId"] for i in groups[0].get("Instances", [])}:
            return f"No active Lifecycle Action found with instance ID {instance}"
        if params.get("LifecycleActionResult", "CONTINUE") not in ("CONTINUE", "ABANDON"):
            return "LifecycleActionResult must be CONTINUE or ABANDON"
        return None


def _iso(epoch_s: float) -> str:
    """As the Auto Scaling API writes times: ISO 8601 in UTC with milliseconds and ``Z``."""
    t = datetime.datetime.fromtimestamp(epoch_s, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _region(authorization: str) -> str:
    """The region of a SigV4 request (``Credential=KEY/DATE/REGION/SERVICE/aws4_request``)."""
    scope = authorization.partition("Credential=")[2].split(",")[0].split("/")
    return scope[2] if len(scope) > 2 and scope[2] else "us-east-1"


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closed its kept-alive connection is no error (the default
        prints a traceback on stderr)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    standin: AwsStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        params = {}
        if "x-www-form-urlencoded" in self.headers.get("Content-Type", ""):
            params = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}
        action = params.get("Action")
        if action in STANDIN_ACTIONS:
            params.pop("Version", None)
            status, xml = self.standin.answer(params.pop("Action"), params)
            self._reply(status, xml.encode(), {"Content-Type": "text/xml"})
            return
        if action == "DescribeScalingActivities":
            region = _region(self.headers.get("Authorization", ""))
            failed = self.standin.failed_launches(params.get("AutoScalingGroupName", ""), region)
            if failed is not None:
                self._reply(200, failed.encode(), {"Content-Type": "text/xml"})
                return
        upstream = urllib.parse.urlsplit(self.standin.moto_url)
        conn = http.client.HTTPConnection(upstream.hostname or "", upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "transfer-encoding")}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            if action == "DescribeAutoScalingGroups" and response.status == 200:
                data = self.standin.hide_instances(data)
            passed = {
                k: v
                for k, v in response.getheaders()
                if k.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date")
            }
            self._reply(response.status, data, passed)
        finally:
            conn.close()

    def _reply(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle  # noqa: N815
