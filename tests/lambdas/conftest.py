"""Fixtures for the remediation functions: moto in-process, the functions' environment,
the documented sample events, throttling and a clock that does not wait."""

from __future__ import annotations

import copy
import datetime
import json
import time as systime
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.awsrequest
import botocore.client
import botocore.exceptions
import botocore.retries.standard
import pytest
from moto import mock_aws

from ftfleet.lambdas.common import aws, runtime
from ftfleet.lambdas.common.events import iso

REGION = "us-east-1"
REPLICA_REGION = "us-west-2"
ACCOUNT = "123456789012"
STACK = "aws-test"
RUN = "llm-test"
ROOT = f"checkpoints/{RUN}"
PRIMARY = "ftfleet-test-primary"
REPLICA = "ftfleet-test-replica"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dummy credentials, no real endpoint, no cached clients or configs, no backoff sleeps."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_LAMBDA_FUNCTION_NAME", "K_SERVICE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    aws.reset()
    runtime.reset()
    yield
    aws.reset()
    runtime.reset()


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every AWS call is refused at once: for handlers that must not get that far."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    aws.reset()


@pytest.fixture
def moto() -> Iterator[None]:
    with mock_aws():
        yield


def configure(monkeypatch: pytest.MonkeyPatch, config: Any) -> None:
    """Put a function's config into the environment, as the program renders it."""
    for name, value in config.to_env().items():
        monkeypatch.setenv(name, value)
    runtime.reset()


def decisions(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The JSON decision lines the functions wrote to stdout since the last call."""
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


class Context:
    """The part of Lambda's context object the functions read."""

    aws_request_id = "req-1"

    def __init__(self, remaining_s: float = 900.0):
        self.remaining_s = remaining_s

    def get_remaining_time_in_millis(self) -> int:
        return int(self.remaining_s * 1000)


class FakeClock:
    """now() advances only by sleep(), which returns at once."""

    def __init__(self, start: float):
        self.t = start
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def now_iso(offset_s: float = 0.0) -> str:
    """Now (plus ``offset_s``) as EventBridge writes times."""
    return iso(systime.time() + offset_s)


# ---------------------------------------------------------------------------
# Sample events, in the shapes AWS documents for each source
# ---------------------------------------------------------------------------


def spot_warning(instance_id: str, time: str | None = None, action: str = "terminate") -> dict:
    """EC2 Spot Instance Interruption Warning (EC2 User Guide, "Spot Instance interruption notices")."""
    return {
        "version": "0",
        "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": ACCOUNT,
        "time": time or now_iso(),
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }


def rebalance(instance_id: str, time: str | None = None) -> dict:
    """EC2 Instance Rebalance Recommendation (EC2 User Guide, "EC2 instance rebalance recommendations")."""
    return {
        "version": "0",
        "id": "12345678-1234-1234-1234-123456789013",
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": ACCOUNT,
        "time": time or now_iso(),
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }


def lifecycle_action(instance_id: str, group: str, hook: str, time: str | None = None, token: str = "tok-1") -> dict:
    """EC2 Instance-terminate Lifecycle Action (EC2 Auto Scaling User Guide, "Amazon EventBridge
    events for Amazon EC2 Auto Scaling")."""
    return {
        "version": "0",
        "id": "468fd7e6-4d36-4f87-b6fb-0b2c2f4c4c4f",
        "detail-type": "EC2 Instance-terminate Lifecycle Action",
        "source": "aws.autoscaling",
        "account": ACCOUNT,
        "time": time or now_iso(),
        "region": REGION,
        "resources": [
            f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:042cba90-ad2f-431c-9b4d-6d9055bcc9fb:"
            f"autoScalingGroupName/{group}"
        ],
        "detail": {
            "LifecycleActionToken": token,
            "AutoScalingGroupName": group,
            "LifecycleHookName": hook,
            "EC2InstanceId": instance_id,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "NotificationMetadata": "",
            "Origin": "AutoScalingGroup",
            "Destination": "EC2",
        },
    }


def scheduled(time: str | None = None, rule: str = "ftfleet-aws-test-sweep") -> dict:
    """Scheduled Event (EventBridge User Guide, "Creating a rule that runs on a schedule")."""
    return {
        "version": "0",
        "id": "89d1a02d-5ec7-412e-82f5-13505f849b41",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": time or now_iso(),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{rule}"],
        "detail": {},
    }


def cloudtrail_call(
    source: str, event_name: str, params: dict, time: str | None = None, error: str | None = None
) -> dict:
    """AWS API Call via CloudTrail (EventBridge User Guide, "Events from AWS services via
    AWS CloudTrail")."""
    service = source.split(".", 1)[1]
    detail = {
        "eventVersion": "1.09",
        "userIdentity": {"type": "AssumedRole", "arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/admin/someone"},
        "eventTime": time or now_iso(),
        "eventSource": f"{service}.amazonaws.com",
        "eventName": event_name,
        "awsRegion": REGION,
        "sourceIPAddress": "203.0.113.7",
        "requestParameters": params,
        "responseElements": None,
        "eventType": "AwsApiCall",
        "managementEvent": True,
        "readOnly": False,
        "eventCategory": "Management",
    }
    if error:
        detail["errorCode"] = error
    return {
        "version": "0",
        "id": "36eb8523-97d0-4518-b33d-ee3579ff19f0",
        "detail-type": "AWS API Call via CloudTrail",
        "source": source,
        "account": ACCOUNT,
        "time": time or now_iso(),
        "region": REGION,
        "resources": [],
        "detail": detail,
    }


def malformed_variants(event: dict, required: list[str]) -> list[Any]:
    """The broken shapes every handler must drop: empty body, wrong types, each required
    detail field missing or of the wrong type, an unknown detail-type."""
    out: list[Any] = [None, {}, [], "text", {"source": event["source"]}]
    unknown = copy.deepcopy(event)
    unknown["detail-type"] = "Something Else Entirely"
    out.append(unknown)
    wrong_detail = copy.deepcopy(event)
    wrong_detail["detail"] = ["not", "an", "object"]
    out.append(wrong_detail)
    bad_time = copy.deepcopy(event)
    bad_time["time"] = "yesterday"
    out.append(bad_time)
    for key in required:
        missing = copy.deepcopy(event)
        missing["detail"].pop(key)
        out.append(missing)
        typed = copy.deepcopy(event)
        typed["detail"][key] = 42
        out.append(typed)
    return out


# ---------------------------------------------------------------------------
# Throttling: answer the first calls of an operation with a throttling error
# ---------------------------------------------------------------------------

_THROTTLE_BODY = {
    "query": (
        400,
        b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
        b"<Message>Rate exceeded</Message></Error><RequestId>r</RequestId></ErrorResponse>",
    ),
    "ec2": (
        503,
        b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded."
        b"</Message></Error></Errors><RequestID>r</RequestID></Response>",
    ),
    "rest-xml": (503, b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"),
}


class _Raw:
    def __init__(self, body: bytes):
        self._body = body

    def stream(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._body


def throttle(client: Any, operation: str, times: int = 1) -> list[int]:
    """The next ``times`` calls of ``operation`` on ``client`` are throttled before they
    reach moto; returns a list that grows by one per throttled attempt."""
    status, body = _THROTTLE_BODY[client.meta.service_model.protocol]
    hits: list[int] = []

    def answer(request: Any, **kwargs: Any) -> Any:
        if len(hits) >= times:
            return None
        hits.append(1)
        return botocore.awsrequest.AWSResponse(request.url, status, {}, _Raw(body))

    client.meta.events.register_first(
        f"before-send.{client.meta.service_model.service_id.hyphenize()}.{operation}", answer
    )
    return hits


# ---------------------------------------------------------------------------
# Missing operations: patch only those, delegate the rest to moto (REFERENCE.md §6)
# ---------------------------------------------------------------------------


class MissingOps:
    """Stands in for the calls moto 5.2.5 lacks; records every call it answers."""

    def __init__(self, answers: dict[str, Any]):
        self.answers = answers
        self.calls: list[tuple[str, dict]] = []
        self._orig = botocore.client.BaseClient._make_api_call

    def __call__(self, client: Any, operation: str, params: dict) -> Any:
        if operation in self.answers:
            self.calls.append((operation, dict(params)))
            answer = self.answers[operation]
            return answer(params) if callable(answer) else answer
        return self._orig(client, operation, params)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def client_error(code: str, message: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": message}}, operation)


def s3_put(bucket: str, key: str, body: bytes | str, region: str = REGION) -> None:
    boto3.client("s3", region_name=region).put_object(
        Bucket=bucket, Key=key, Body=body.encode() if isinstance(body, str) else body
    )


def make_bucket(name: str, region: str = REGION) -> None:
    s3 = boto3.client("s3", region_name=region)
    if region == "us-east-1":
        s3.create_bucket(Bucket=name)
    else:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})


AMI = "ami-12c6146b"  # one of moto's built-in images


def make_group(name: str, size: int = 2, instance_type: str = "g5.2xlarge", zone: str = "us-east-1a") -> list[str]:
    """An Auto Scaling group of ``size`` running instances; returns their ids."""
    ec2 = boto3.client("ec2", region_name=REGION)
    asg = boto3.client("autoscaling", region_name=REGION)
    ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": AMI, "InstanceType": instance_type}
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
        MinSize=0,
        MaxSize=size,
        DesiredCapacity=size,
        AvailabilityZones=[zone],
    )
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return [i["InstanceId"] for i in group["Instances"]]


def instance_tags(instance_id: str) -> dict[str, str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in found.get("Tags", [])}


def metric_sum(name: str, dimensions: dict[str, str], namespace: str = "ftfleet") -> float:
    """Sum of every data point of a metric with exactly these dimensions."""
    cw = boto3.client("cloudwatch", region_name=REGION)
    now = datetime.datetime.now(datetime.UTC)
    got = cw.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": namespace,
                        "MetricName": name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
                    },
                    "Period": 86400,
                    "Stat": "Sum",
                },
            }
        ],
        StartTime=now - datetime.timedelta(days=1),
        EndTime=now + datetime.timedelta(minutes=5),
    )
    return sum(got["MetricDataResults"][0]["Values"])


# ---------------------------------------------------------------------------
# S3 as it answers a role that may list only under a prefix
# ---------------------------------------------------------------------------


def list_only_under(client: Any, prefix: str, refused: list[str] | None = None) -> list[str]:
    """Make ``client`` (an S3 client of a function, under moto) answer as S3 answers a
    role whose ``s3:ListBucket`` has an ``s3:prefix`` condition on ``prefix*``, as the
    functions' roles do. moto answers 404 to a HEAD or GET of a missing key whoever
    asks; S3 answers 404 only to a caller allowed to list the bucket, and 403 to any
    other (Amazon S3 API Reference, "HeadObject" and "GetObject", Permissions). A
    listing outside ``prefix`` is refused with AccessDenied. Returns the operations
    refused. Only ``client`` answers so (botocore copies the hooks into each client).
    Call it again for another client, with the same list as ``refused``."""
    plain = boto3.client("s3", region_name=client.meta.region_name)
    refused = [] if refused is None else refused

    def exists(bucket: str, key: str) -> bool:
        found = plain.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
        return any(item["Key"] == key for item in found)

    def answer(model: Any, params: dict, **kwargs: Any) -> Any:
        name = model.name
        if name in ("HeadObject", "GetObject") and not exists(params["Bucket"], params["Key"]):
            refused.append(name)
            if name == "HeadObject":  # a HEAD answer has no body: botocore names the status
                raise client_error("403", "Forbidden", name)
            raise client_error("AccessDenied", "Access Denied", name)
        if name in ("ListObjectsV2", "ListObjects") and not params.get("Prefix", "").startswith(prefix):
            refused.append(name)
            raise client_error("AccessDenied", "Access Denied", name)
        return None

    # API parameters are seen before they are serialized, by before-parameter-build.
    client.meta.events.register_first("before-parameter-build.s3", answer, unique_id="ftfleet-list-only-under")
    return refused


# ---------------------------------------------------------------------------
# S3's SSE-C block, as S3 reports it (moto 5.2.5 drops BlockedEncryptionTypes)
# ---------------------------------------------------------------------------


class SseCBlock:
    """Stands in for the part of S3 that moto lacks: each bucket's blocked encryption
    types. Buckets created since April 2026 have SSE-C blocked, and GetBucketEncryption
    reports ``BlockedEncryptionTypes: {EncryptionType: [SSE-C]}`` in each rule; a
    PutBucketEncryption that names the field sets it ("Blocking or unblocking SSE-C for a
    general purpose bucket", Amazon S3 User Guide). What a Put that omits it does is not
    documented: ``omitted`` says what this stand-in does then ("keep" the block or
    "unblock"). Every other part of the call goes to moto. ``puts`` records the
    BlockedEncryptionTypes of each PutBucketEncryption (None: omitted)."""

    def __init__(self, buckets: list[str], omitted: str = "keep"):
        self.blocked = dict.fromkeys(buckets, ["SSE-C"])
        self.omitted = omitted
        self.puts: list[Any] = []

    def attach(self, target: Any) -> Any:
        """Answer the calls of ``target``: a client, or a boto3 session (every client it
        makes from now on; botocore copies the hooks into each client)."""
        events = target.events if isinstance(target, boto3.session.Session) else target.meta.events
        events.register_first("before-parameter-build.s3.PutBucketEncryption", self._put, unique_id="sse-c-put")
        events.register_first("before-parameter-build.s3.GetBucketEncryption", self._ask, unique_id="sse-c-ask")
        events.register("after-call.s3.GetBucketEncryption", self._get, unique_id="sse-c-get")
        return target

    @staticmethod
    def _ask(params: dict, context: dict, **kwargs: Any) -> None:
        context["sse_c_bucket"] = params["Bucket"]  # the answer's hook sees only the context

    def _put(self, params: dict, **kwargs: Any) -> None:
        # A copy: the caller's own dicts stay as they were.
        config = params["ServerSideEncryptionConfiguration"] = copy.deepcopy(
            params["ServerSideEncryptionConfiguration"]
        )
        named = [r.pop("BlockedEncryptionTypes") for r in config.get("Rules", []) if "BlockedEncryptionTypes" in r]
        self.puts.append(named[0]["EncryptionType"] if named else None)
        if named:
            self.blocked[params["Bucket"]] = [t for t in named[0]["EncryptionType"] if t != "NONE"]
        elif self.omitted == "unblock":
            self.blocked[params["Bucket"]] = []

    def _get(self, parsed: dict, context: dict, **kwargs: Any) -> None:
        blocked = self.blocked.get(context.get("sse_c_bucket"))
        for rule in parsed.get("ServerSideEncryptionConfiguration", {}).get("Rules", []):
            rule["BlockedEncryptionTypes"] = {"EncryptionType": list(blocked) if blocked else ["NONE"]}
