"""Scheduled: the run's retention schedule applied to the primary checkpoint bucket.

The trainer prunes the bucket after each of its uploads. Nobody does for checkpoints the
fast tier exports itself (``FTFLEET_CKPT_UPLOAD=fsx-export``) or for a run that is gone;
this function does, every hour, with the same decision (ftfleet/retention.py,
:func:`~ftfleet.retention.plan_sweep`):

* kept: what the newest readable manifest's recorded policy keeps (its rules and pinned
  steps; ``checkpointRetention`` where no manifest records one), every milestone as its
  manifest marks it, the newest committed checkpoint, the newest complete one, and every
  checkpoint whose manifest does not read;
* deleted: the other committed checkpoints, oldest first, each ``manifest.json`` first
  so that it stops being a checkpoint before it loses a file; then step directories
  without a manifest, older than the newest checkpoint, whose newest object is a day old
  (debris of a crashed save or upload).

Deletes replicate to the replica bucket as delete markers (the replication rule's
delete-marker replication), so the replica follows without a sweep of its own; the
bucket's versioning and lifecycle rules keep a deleted version for their noncurrent
window. The bucket is listed once (``<root>/step-``, a call per thousand objects) and
each manifest read once; a survey that cannot finish in the invocation decides nothing
(counted as a failure, which is alarmed). A step that fails to delete is logged and
counted, and the sweep goes on; the sweep stops starting deletions when its invocation
has little time left (the next hour's goes on). Published: ``RetentionDeleted``, ``RetentionKept`` and
``RetentionFailures`` (dimension ``Stack``).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from ftfleet import contract, retention
from ftfleet.lambdas.common import aws, checkpoints, eventbridge, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.retention_sweep.config import Config

NAME = "retention_sweep"
#: Seconds of the invocation kept for the last deletion and the metrics.
RESERVE_S = 30.0
#: Keys per DeleteObjects request (S3's limit).
DELETE_BATCH = 1000

clock = runtime.Clock()


class Bucket:
    """The run's step directories in one S3 bucket."""

    def __init__(self, name: str, root: str):
        self.name, self.root = name, root
        self.s3 = aws.client("s3")

    def step_prefix(self, step: int) -> str:
        return f"{self.root}/{contract.step_dir_name(step)}/"

    def listing(self) -> dict[int, dict[str, dict[str, Any]]]:
        """step -> (object name under its directory -> its listing entry), from one
        paginated listing of ``<root>/step-`` (a call per thousand objects, not per step)."""
        base = f"{self.root}/"
        out: dict[int, dict[str, dict[str, Any]]] = {}
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=f"{base}{contract.STEP_DIR_PREFIX}"
        )
        for page in pages:
            for item in page.get("Contents", []):
                top, _, name = item["Key"][len(base) :].partition("/")
                step = contract.parse_step_dir(top)
                if step is not None and name:
                    out.setdefault(step, {})[name] = item
        return out

    def read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.name, Key=key)["Body"].read()

    def remove(self, step: int, listed: dict[str, dict[str, Any]]) -> None:
        """Delete the step's objects as listed: the manifest first (alone, so that the step
        stops existing before it loses a file), then the rest in batches. Each delete is
        conditional on the ETag listed (Amazon S3 User Guide, "How to perform conditional
        deletes"): an object written since the listing (an upload of the step starting
        again) is left alone. Raises on any key S3 did not delete."""
        prefix = self.step_prefix(step)
        rest = dict(listed)
        manifest = rest.pop(contract.MANIFEST_NAME, None)
        if manifest is not None:
            self.s3.delete_object(Bucket=self.name, Key=f"{prefix}{contract.MANIFEST_NAME}", IfMatch=manifest["ETag"])
        names = sorted(rest)
        for i in range(0, len(names), DELETE_BATCH):
            batch = [{"Key": f"{prefix}{n}", "ETag": rest[n]["ETag"]} for n in names[i : i + DELETE_BATCH]]
            answer = self.s3.delete_objects(Bucket=self.name, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise RuntimeError(
                    f"{len(answer['Errors'])} keys not deleted, first {first.get('Key')}: {first.get('Code')}"
                )


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


class OutOfTime(Exception):
    """The survey did not finish within the invocation: nothing is decided on part of it."""


def survey(
    bucket: Bucket, context: Any
) -> tuple[dict[int, retention.Recorded | None], set[int], dict[int, float], dict]:
    """(step -> what its manifest records or None, the complete steps, uncommitted step ->
    its newest object's time, step -> its objects), from the bucket's listing and one
    read per manifest. Raises :class:`OutOfTime` when the invocation runs short first."""
    recorded: dict[int, retention.Recorded | None] = {}
    complete: set[int] = set()
    uncommitted: dict[int, float] = {}
    objects = bucket.listing()
    sizes = {step: {name: item["Size"] for name, item in have.items()} for step, have in objects.items()}
    for step, have in sorted(objects.items()):
        if contract.MANIFEST_NAME not in have:
            uncommitted[step] = max(item["LastModified"].timestamp() for item in have.values())
            continue
        if runtime.remaining_s(context) < RESERVE_S:
            raise OutOfTime(f"{len(recorded)} of the manifests read")
        try:
            text = bucket.read(f"{bucket.step_prefix(step)}{contract.MANIFEST_NAME}")
        except ClientError as exc:
            if aws.error_code(exc) in ("NoSuchKey", "404"):
                continue  # deleted since the listing (the trainer pruned it): not a checkpoint any more
            recorded[step] = None  # cannot be read now: kept
            continue
        recorded[step], whole = checkpoints.recorded(text, step, sizes)
        if whole:
            complete.add(step)
    return recorded, complete, uncommitted, objects


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    eventbridge.parse(event, (eventbridge.SCHEDULED,))
    bucket = Bucket(cfg.bucket, cfg.root)
    try:
        recorded, complete, uncommitted, objects = survey(bucket, context)
    except OutOfTime as exc:
        aws.put_metrics(
            [
                {
                    "MetricName": "RetentionFailures",
                    "Dimensions": aws.dims(Stack=cfg.stack),
                    "Value": 1.0,
                    "Unit": "Count",
                }
            ]
        )
        return log.decision("survey-incomplete", level="WARNING", reason=str(exc))
    plan = retention.plan_sweep(recorded, complete, uncommitted, clock.now(), retention.Policy(tuple(cfg.rules)))
    deleted, failed, left = [], [], []
    for step in [*plan.delete, *plan.debris]:
        if runtime.remaining_s(context) < RESERVE_S:
            left.append(step)
            continue
        try:
            bucket.remove(step, objects[step])
            deleted.append(step)
        except Exception as exc:  # noqa: BLE001 - one step's failure must not stop the sweep
            failed.append(step)
            log.decision("delete-failed", level="WARNING", step=step, error=f"{type(exc).__name__}: {exc}")
    aws.put_metrics(
        {"MetricName": name, "Dimensions": aws.dims(Stack=cfg.stack), "Value": float(value), "Unit": "Count"}
        for name, value in (
            ("RetentionDeleted", len(deleted)),
            ("RetentionKept", len(plan.kept)),
            ("RetentionFailures", len(failed)),
        )
    )
    return log.decision(
        "swept" if recorded else "no-checkpoint",
        level="WARNING" if failed else "INFO",
        deleted=deleted,
        failed=failed,
        left_for_next=left,
        kept=len(plan.kept),
        rules=list(plan.policy.rules),
    )


runtime.prime(Config)
