"""AWS clients and the few AWS operations several functions share.

Clients come from :func:`client`, built on first use (never at import) with botocore's
``standard`` retry mode, which retries throttling and transient errors with
exponential backoff and jitter before an error reaches the handler. They are cached
per process, as Lambda reuses a warm process; tests call :func:`reset`.
"""

from __future__ import annotations

import datetime
import functools
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

import boto3
import botocore.config
from botocore.exceptions import BotoCoreError, ClientError

from ftfleet import contract
from ftfleet.lambdas.common import checkpoints

RETRIES = {"mode": "standard", "max_attempts": 6}
_CONFIG = botocore.config.Config(retries=RETRIES, connect_timeout=5, read_timeout=20)
#: Error codes of a conditional write that lost a race (S3 answers 412, or 409 when two
#: conditional writes overlap).
CONFLICT = ("PreconditionFailed", "ConditionalRequestConflict")
_lock = threading.Lock()


def client(service: str, region: str | None = None) -> Any:
    """A boto3 client with standard retries (``region`` None: the function's own)."""
    with _lock:  # boto3 sessions are not thread-safe; the heartbeat loop runs in a thread
        return _client(service, region or None)


@functools.cache
def _session() -> boto3.session.Session:
    # One session for the process: it loads each service's model once.
    return boto3.session.Session()


@functools.cache
def _client(service: str, region: str | None) -> Any:
    return _session().client(service, region_name=region, config=_CONFIG)


def reset() -> None:
    """Forget cached clients and the identity (each test gets clients bound to its own
    mock, and hooks a test registers on them end with it)."""
    _client.cache_clear()
    _identity.clear()


_identity: dict[str, str] = {}


def caller_arn() -> str | None:
    """The ARN this process acts as (STS GetCallerIdentity, which needs no permission),
    or None while STS cannot be reached: in a function, ``arn:aws:sts::<account>:
    assumed-role/<its role>/<session>``. Asked once per process."""
    if "arn" not in _identity:
        try:
            _identity["arn"] = client("sts").get_caller_identity()["Arn"]
        except (ClientError, BotoCoreError):
            return None
    return _identity["arn"]


def error_code(exc: BaseException) -> str:
    return exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""


# ---------------------------------------------------------------------------
# JSON objects in S3, read and updated with conditional writes
# ---------------------------------------------------------------------------


class ConflictLimit(RuntimeError):
    """A conditional update lost the race too many times in a row."""


def listed(bucket: str, key: str, region: str | None = None) -> dict[str, Any] | None:
    """The listing entry of the object ``key`` (``Key``, ``Size``, ``LastModified``,
    ``ETag``), or None when there is none.

    Existence is decided by listing the key's own prefix, never by HeadObject or
    GetObject: for a missing key S3 answers those with 404 only to a caller allowed
    ``s3:ListBucket`` on the bucket, and with 403 to any other (Amazon S3 API Reference,
    "HeadObject", Permissions). The functions' roles may list only under their own
    prefixes, a condition a HEAD request does not meet.
    """
    # A key sorts before every longer key it is a prefix of: it is first if present.
    found = client("s3", region).list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    return next((item for item in found if item.get("Key") == key), None)


def read_bytes(bucket: str, key: str, region: str | None = None) -> tuple[bytes | None, str | None]:
    """``(body, etag)`` of the object, or ``(None, None)`` when there is none (decided
    by :func:`listed`)."""
    s3 = client("s3", region)
    if listed(bucket, key, region) is None:
        return None, None
    try:
        got = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            return None, None
        raise
    return got["Body"].read(), got["ETag"]


def read_json(bucket: str, key: str, region: str | None = None) -> tuple[Any, str | None]:
    """``(document, etag)``; a body that is not JSON reads as the string ``"<not JSON>"``
    so that the caller replaces it instead of crashing on it."""
    body, etag = read_bytes(bucket, key, region)
    if body is None:
        return None, None
    try:
        return json.loads(body), etag
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return "<not JSON>", etag


def update_json(
    bucket: str,
    key: str,
    change: Callable[[Any], tuple[Any, bool]],
    attempts: int = 8,
    region: str | None = None,
) -> tuple[Any, bool]:
    """Read-modify-write of a JSON object that no concurrent writer can undo.

    ``change(document_or_None)`` returns ``(new_document, changed)``; when changed, the
    new document is written only if the object is still the one read (``If-Match`` its
    ETag, or ``If-None-Match: *`` when there was none), else the whole cycle repeats.
    Returns the final document and whether this call changed it.
    """
    s3 = client("s3", region)
    for _ in range(attempts):
        current, etag = read_json(bucket, key, region)
        new, changed = change(current)
        if not changed:
            return new, False
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            s3.put_object(
                Bucket=bucket,
                Key=key,
                Body=json.dumps(new, sort_keys=True).encode() if not isinstance(new, str) else new.encode(),
                ContentType="application/json",
                # A bucket with an Object Lock default retention refuses a PUT without one.
                ChecksumAlgorithm="CRC32",
                **condition,
            )
        except ClientError as exc:
            if error_code(exc) in CONFLICT:
                continue
            raise
        return new, True
    raise ConflictLimit(f"s3://{bucket}/{key}: {attempts} conditional writes in a row lost the race")


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------


def put_metrics(data: Iterable[dict[str, Any]]) -> None:
    """``PutMetricData`` into the contract's namespace (the roles may write nowhere else)."""
    items = list(data)
    now = datetime.datetime.now(datetime.UTC)
    for item in items:
        item.setdefault("Timestamp", now)
    for start in range(0, len(items), 500):
        client("cloudwatch").put_metric_data(
            Namespace=contract.METRICS_NAMESPACE, MetricData=items[start : start + 500]
        )


def dims(**values: str) -> list[dict[str, str]]:
    return [{"Name": k, "Value": v} for k, v in values.items()]


# ---------------------------------------------------------------------------
# Instances of the stack
# ---------------------------------------------------------------------------

GROUP_TAG = "aws:autoscaling:groupName"


def describe_instance(instance_id: str) -> dict[str, Any] | None:
    """The instance, or None when EC2 does not know it (any more)."""
    try:
        found = client("ec2").describe_instances(InstanceIds=[instance_id])
    except ClientError as exc:
        if error_code(exc) in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
            return None
        raise
    for reservation in found.get("Reservations", []):
        for instance in reservation.get("Instances", []):
            if instance.get("InstanceId") == instance_id:
                return instance
    return None


def tags_of(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------


class Checkpoints(checkpoints.CheckpointListing):
    """A run's checkpoints in one S3 bucket; an object's existence by listing
    (:func:`listed`)."""

    def __init__(self, name: str, region: str | None, root: str):
        super().__init__(name, root)
        self.region = region
        self.s3 = client("s3", region)

    def child_prefixes(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix, Delimiter="/")
        return [p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for page in pages for p in page.get("CommonPrefixes", [])]

    def arrival(self, key: str) -> float | None:
        # By listing: a HEAD of a missing manifest, normal while a step is being
        # written, answers a role without s3:ListBucket 403, not 404.
        item = listed(self.name, key, self.region)
        return None if item is None else item["LastModified"].timestamp()

    def read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.name, Key=key)["Body"].read()

    def sizes(self, prefix: str) -> dict[str, int]:
        have = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix):
            for item in page.get("Contents", []):
                have[item["Key"][len(prefix) :]] = item["Size"]
        return have
