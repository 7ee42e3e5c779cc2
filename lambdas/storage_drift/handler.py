"""CloudTrail calls that weaken a managed bucket or change the FSx data repository
association: restore what the program rendered, read it back, report what changed.

Triggered by EventBridge rules on "AWS API Call via CloudTrail" (needs a trail that
logs management events: the stack's own or the account's). Idempotent by bucket name:
whatever call triggered it, every managed setting of that bucket is compared with the
rendered one and only what differs is written, so a duplicate delivery, or the event
of this function's own repair, finds nothing to do. A failed call (``errorCode``) and a
bucket or association of another stack are dropped with a log line.

If Pulumi changes a setting in the same ``pulumi up`` that updates this function, a
stale copy of the function may restore the old value once; the event of that restore
then reaches the updated function, which writes the new value: it converges.

It never deletes a bucket, an object or an association, never loosens a setting, and
never touches a bucket it was not given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ftfleet.lambdas.common import aws, eventbridge, events, runtime
from ftfleet.lambdas.common.events import Dropped
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.storage_drift.config import Config
from ftfleet.lambdas.storage_drift.desired import (
    ASPECTS,
    ASSOCIATION_CALLS,
    BUCKET_CALLS,
    FSX_CALL,
    S3_CALL,
    normalized,
    policy_normalized,
)

NAME = "storage_drift"
#: Error codes meaning "this setting is not configured at all".
_NOT_SET = {
    "NoSuchPublicAccessBlockConfiguration",
    "ServerSideEncryptionConfigurationNotFoundError",
    "NoSuchBucketPolicy",
    "NoSuchLifecycleConfiguration",
    "ReplicationConfigurationNotFoundError",
}
#: Lifecycle states of an association that is going away or never came.
_GONE = ("DELETING", "FAILED")
_BUSY = ("CREATING", "UPDATING")


clock = runtime.Clock()


class RepairNotVerified(RuntimeError):
    """A setting read back differs from what was written: retry, then the DLQ."""


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    env = eventbridge.parse(event, (S3_CALL, FSX_CALL))
    d = env.detail
    call = events.text(d, "eventName", "event.detail")
    caller = (d.get("userIdentity") or {}).get("arn") if isinstance(d.get("userIdentity"), dict) else None
    params = events.mapping(d.get("requestParameters") or {}, "event.detail.requestParameters")
    if env.source == "aws.s3":
        if call not in BUCKET_CALLS:
            raise Dropped(f"call {call} does not change a managed bucket setting", call=call)
        bucket = events.text(params, "bucketName", "event.detail.requestParameters")
        if bucket not in cfg.buckets:
            raise Dropped("bucket of another stack", bucket=bucket, call=call)
        if d.get("errorCode"):
            raise Dropped("the call failed; nothing changed", bucket=bucket, call=call, error=d.get("errorCode"))
        return _reconcile_bucket(cfg, log, bucket, call=call, caller=caller)
    if call not in ASSOCIATION_CALLS:
        raise Dropped(f"call {call} does not change a data repository association", call=call)
    association_id = events.text(params, "associationId", "event.detail.requestParameters")
    if d.get("errorCode"):
        raise Dropped("the call failed; nothing changed", association_id=association_id, error=d.get("errorCode"))
    return _reconcile_association(cfg, log, association_id, call=call, caller=caller, context=context)


# ---------------------------------------------------------------------------
# Buckets
# ---------------------------------------------------------------------------


def _reader(s3: Any, aspect: str) -> Callable[[str], Any]:
    def read(bucket: str) -> Any:
        try:
            if aspect == "versioning":
                got = s3.get_bucket_versioning(Bucket=bucket)
                return {"Status": got["Status"]} if got.get("Status") else None
            if aspect == "public_access_block":
                return s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
            if aspect == "encryption":
                return s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]
            if aspect == "policy":
                return json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
            if aspect == "lifecycle":
                return {"Rules": s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
            if aspect == "replication":
                return s3.get_bucket_replication(Bucket=bucket)["ReplicationConfiguration"]
        except Exception as exc:
            if aws.error_code(exc) in _NOT_SET:
                return None
            raise
        raise KeyError(aspect)

    return read


def _writer(s3: Any, aspect: str) -> Callable[[str, Any], None]:
    calls: dict[str, Callable[[str, Any], Any]] = {
        "versioning": lambda b, v: s3.put_bucket_versioning(Bucket=b, VersioningConfiguration=v),
        "public_access_block": lambda b, v: s3.put_public_access_block(Bucket=b, PublicAccessBlockConfiguration=v),
        "encryption": lambda b, v: s3.put_bucket_encryption(Bucket=b, ServerSideEncryptionConfiguration=v),
        "policy": lambda b, v: s3.put_bucket_policy(Bucket=b, Policy=json.dumps(v)),
        "lifecycle": lambda b, v: s3.put_bucket_lifecycle_configuration(Bucket=b, LifecycleConfiguration=v),
        "replication": lambda b, v: s3.put_bucket_replication(Bucket=b, ReplicationConfiguration=v),
    }
    return calls[aspect]


def _same(aspect: str, a: Any, b: Any) -> bool:
    if aspect == "policy":
        return a is not None and b is not None and policy_normalized(a) == policy_normalized(b)
    return normalized(a) == normalized(b) and (a is None) == (b is None)


def _reconcile_bucket(cfg: Config, log: DecisionLog, bucket: str, call: str, caller: str | None) -> dict[str, Any]:
    want = cfg.buckets[bucket]
    s3 = aws.client("s3", want.get("region"))
    restored, unverified = [], []
    for aspect in ASPECTS:
        if aspect not in want:
            continue
        read = _reader(s3, aspect)
        before = read(bucket)
        if _same(aspect, before, want[aspect]):
            continue
        _writer(s3, aspect)(bucket, want[aspect])
        after = read(bucket)
        verified = _same(aspect, after, want[aspect])
        log.decision(
            "restored" if verified else "restore-not-verified",
            level="WARNING" if verified else "ERROR",
            bucket=bucket,
            setting=aspect,
            found=before,
            restored_to=want[aspect],
            verified=verified,
            trigger=call,
            caller=caller,
        )
        (restored if verified else unverified).append(aspect)
    if restored or unverified:
        aws.put_metrics(
            [
                {
                    "MetricName": "DriftRepairs",
                    "Dimensions": aws.dims(Stack=cfg.stack),
                    "Value": float(len(restored) + len(unverified)),
                    "Unit": "Count",
                }
            ]
        )
    if unverified:
        raise RepairNotVerified(f"s3://{bucket}: {', '.join(unverified)} read back differently from what was written")
    return log.decision(
        "repaired" if restored else "in-sync", bucket=bucket, restored=restored, trigger=call, caller=caller
    )


# ---------------------------------------------------------------------------
# The FSx data repository association
# ---------------------------------------------------------------------------


def _associations(fsx: Any, file_system_id: str) -> list[dict[str, Any]]:
    # botocore has no paginator for this call: follow NextToken by hand.
    found, token = [], None
    while True:
        page = fsx.describe_data_repository_associations(
            Filters=[{"Name": "file-system-id", "Values": [file_system_id]}], **({"NextToken": token} if token else {})
        )
        found += page.get("Associations", [])
        token = page.get("NextToken")
        if not token:
            return found


def _describe(fsx: Any, association_id: str) -> dict[str, Any] | None:
    try:
        found = fsx.describe_data_repository_associations(AssociationIds=[association_id])["Associations"]
    except Exception as exc:
        if aws.error_code(exc) in ("DataRepositoryAssociationNotFound", "BadRequest"):
            return None
        raise
    return found[0] if found else None


def _reconcile_association(
    cfg: Config, log: DecisionLog, association_id: str, call: str, caller: str | None, context: Any
) -> dict[str, Any]:
    want = cfg.association
    fsx = aws.client("fsx")
    named = _describe(fsx, association_id)
    if named is not None and named.get("FileSystemId") != want["file_system_id"]:
        raise Dropped(
            "association of another file system", association_id=association_id, file_system=named.get("FileSystemId")
        )
    deadline = clock.now() + max(0.0, runtime.remaining_s(context) - 30.0)
    while True:
        on_path = [
            a
            for a in _associations(fsx, want["file_system_id"])
            if a.get("FileSystemPath") == want["file_system_path"] and a.get("Lifecycle") != "DELETED"
        ]
        settling = [a for a in on_path if a.get("Lifecycle") in _GONE + _BUSY]
        current = next((a for a in on_path if a.get("Lifecycle") not in _GONE + _BUSY), None)
        if current is not None or not settling:
            break
        if clock.now() >= deadline:
            raise TimeoutError(
                f"association on {want['file_system_path']} is still {settling[0].get('Lifecycle')}; retrying later"
            )
        clock.sleep(15)

    if current is None:
        created = fsx.create_data_repository_association(
            FileSystemId=want["file_system_id"],
            FileSystemPath=want["file_system_path"],
            DataRepositoryPath=want["data_repository_path"],
            BatchImportMetaDataOnCreate=bool(want.get("batch_import_meta_data_on_create", False)),
            S3=want["s3"],
            Tags=[{"Key": "ftfleet:restored-by", "Value": NAME}, {"Key": "ftfleet:stack", "Value": cfg.stack}],
        )["Association"]
        verified = normalized(created.get("S3")) == normalized(want["s3"])
        record = log.decision(
            "recreated",
            level="WARNING",
            association_id=created.get("AssociationId"),
            replaces=association_id,
            verified=verified,
            trigger=call,
            caller=caller,
            next_step=(
                "Pulumi still records the deleted association: run `pulumi refresh`, then "
                "`pulumi import aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation <name> "
                f"{created.get('AssociationId')}` (or `pulumi up` after deleting the new one)"
            ),
        )
        if not verified:
            raise RepairNotVerified(f"recreated association {created.get('AssociationId')} has other S3 settings")
        return record
    if normalized(current.get("S3")) == normalized(want["s3"]):
        return log.decision("in-sync", association_id=current["AssociationId"], trigger=call, caller=caller)
    fsx.update_data_repository_association(AssociationId=current["AssociationId"], S3=want["s3"])
    after = _describe(fsx, current["AssociationId"]) or {}
    verified = normalized(after.get("S3")) == normalized(want["s3"])
    record = log.decision(
        "restored" if verified else "restore-not-verified",
        level="WARNING" if verified else "ERROR",
        association_id=current["AssociationId"],
        setting="s3",
        found=current.get("S3"),
        restored_to=want["s3"],
        verified=verified,
        trigger=call,
        caller=caller,
    )
    if not verified:
        raise RepairNotVerified(f"association {current['AssociationId']}: S3 settings read back differently")
    return record


runtime.prime(Config)
