"""CloudTrail calls that weaken a managed bucket or change the FSx data repository
association: restore what the program rendered, read it back, report what changed.

Triggered by EventBridge rules on "AWS API Call via CloudTrail" (needs a trail that
logs management events: the stack's own or the account's). Idempotent by bucket name:
whatever call triggered it, every managed setting of that bucket is compared with the
rendered one and only what differs is written, so a duplicate delivery finds nothing to
do. A failed call (``errorCode``), a call made by this function's own role (its own
repair) and a bucket or association of another stack are dropped with a log line.

It compares only what the stack owns (desired.owned): S3 reports settings the stack
does not declare (``BlockedEncryptionTypes`` on every bucket where SSE-C is blocked by
default, as S3 does for new buckets), and those neither count as drift nor are dropped
by a repair, which writes the rendered setting over what is there (desired.merged). A
bucket policy holds when every rendered statement is in it and any other statement
denies; a repair keeps those denials. Bucket settings are eventually consistent, so a
repair is read back several times, a few seconds apart, before it counts as failed.

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
    merged,
    normalized,
    owned,
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
#: Settings the stack declares as a whole (every rule): compared and written whole.
_WHOLE = ("lifecycle", "replication")
#: Seconds between the reads back of a repair. S3 bucket configuration is eventually
#: consistent (Amazon S3 User Guide, "Amazon S3 data consistency model": a change "might
#: take a short amount of time" to propagate), so one stale read is no failed repair.
VERIFY_DELAYS_S = (0.0, 1.0, 2.0, 4.0, 8.0)


clock = runtime.Clock()


class RepairNotVerified(RuntimeError):
    """A setting read back differs from what was written: retry, then the DLQ."""


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    env = eventbridge.parse(event, (S3_CALL, FSX_CALL))
    d = env.detail
    call = events.text(d, "eventName", "event.detail")
    identity = d.get("userIdentity") if isinstance(d.get("userIdentity"), dict) else {}
    caller = identity.get("arn") if isinstance(identity.get("arn"), str) else None
    params = events.mapping(d.get("requestParameters") or {}, "event.detail.requestParameters")
    if env.source == "aws.s3":
        if call not in BUCKET_CALLS:
            raise Dropped(f"call {call} does not change a managed bucket setting", call=call)
        bucket = events.text(params, "bucketName", "event.detail.requestParameters")
        if bucket not in cfg.buckets:
            raise Dropped("bucket of another stack", bucket=bucket, call=call)
        if d.get("errorCode"):
            raise Dropped("the call failed; nothing changed", bucket=bucket, call=call, error=d.get("errorCode"))
        if _by_own_role(identity):
            raise Dropped("the call was this function's own repair", bucket=bucket, call=call, caller=caller)
        return _reconcile_bucket(cfg, log, bucket, call=call, caller=caller, context=context)
    if call not in ASSOCIATION_CALLS:
        raise Dropped(f"call {call} does not change a data repository association", call=call)
    association_id = events.text(params, "associationId", "event.detail.requestParameters")
    if d.get("errorCode"):
        raise Dropped("the call failed; nothing changed", association_id=association_id, error=d.get("errorCode"))
    if _by_own_role(identity):
        raise Dropped("the call was this function's own repair", association_id=association_id, caller=caller)
    return _reconcile_association(cfg, log, association_id, call=call, caller=caller, context=context)


def _by_own_role(identity: Any) -> bool:
    """Whether a CloudTrail ``userIdentity`` is this function's own (its role's session):
    its repairs produce events like anyone's. Unknown (STS unreachable): False, and the
    comparison finds nothing to do for its own repair anyway."""
    own = aws.caller_arn()
    if own is None or not isinstance(identity, dict):
        return False
    arn = identity.get("arn")
    # arn:aws:sts::<account>:assumed-role/<role>/<session>: any session of the role.
    parts = own.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        role = parts[5].split("/")[1]
        issuer = ((identity.get("sessionContext") or {}).get("sessionIssuer") or {}).get("arn")
        if isinstance(issuer, str) and issuer.startswith(f"arn:{parts[1]}:iam::{parts[4]}:role/"):
            return issuer.rsplit("/", 1)[-1] == role
        return isinstance(arn, str) and arn.startswith(f"{':'.join(parts[:5])}:assumed-role/{role}/")
    return arn == own


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


def _holds(aspect: str, got: Any, want: Any) -> bool:
    """Whether the bucket's ``got`` still holds what the stack rendered as ``want``."""
    if got is None:
        return False
    if aspect == "policy":
        return _policy_holds(got, want)
    if aspect in _WHOLE:
        return normalized(got) == normalized(want)
    return normalized(owned(got, want)) == normalized(want)


def _statements(policy: Any) -> list[Any]:
    normal = policy_normalized(policy) if policy is not None else None
    return list(normal.get("Statement", [])) if isinstance(normal, dict) else []


def _policy_holds(got: Any, want: Any) -> bool:
    ours, theirs = _statements(want), _statements(got)
    return all(st in theirs for st in ours) and all(
        st in ours or (isinstance(st, dict) and st.get("Effect") == "Deny") for st in theirs
    )


def _to_write(aspect: str, got: Any, want: Any) -> Any:
    """The rendered setting, keeping what the bucket holds that the stack does not own
    (for a policy: the statements that deny)."""
    if aspect in _WHOLE:
        return want
    if aspect == "policy":
        ours = _statements(want)
        theirs = zip(_statements(got), (got.get("Statement", []) if isinstance(got, dict) else []), strict=False)
        denials = [raw for st, raw in theirs if st not in ours and isinstance(st, dict) and st.get("Effect") == "Deny"]
        statements = want.get("Statement", [])
        return {**want, "Statement": [*(statements if isinstance(statements, list) else [statements]), *denials]}
    return merged(got, want)


def _read_back(read: Callable[[str], Any], bucket: str, aspect: str, want: Any, deadline: float) -> tuple[Any, bool]:
    """Read the setting until it holds, :data:`VERIFY_DELAYS_S` apart (eventual
    consistency), until ``deadline`` (clock time): (last read, whether it holds)."""
    after = None
    for delay in VERIFY_DELAYS_S:
        if delay:
            if clock.now() + delay > deadline:
                break
            clock.sleep(delay)
        after = read(bucket)
        if _holds(aspect, after, want):
            return after, True
    return after, False


def _reconcile_bucket(
    cfg: Config, log: DecisionLog, bucket: str, call: str, caller: str | None, context: Any = None
) -> dict[str, Any]:
    want = cfg.buckets[bucket]
    s3 = aws.client("s3", want.get("region"))
    # Reads back stop in time to report (30 s before the invocation's end).
    deadline = clock.now() + max(0.0, runtime.remaining_s(context) - 30.0)
    restored, unverified = [], []
    for aspect in ASPECTS:
        if aspect not in want:
            continue
        read = _reader(s3, aspect)
        before = read(bucket)
        if _holds(aspect, before, want[aspect]):
            continue
        written = _to_write(aspect, before, want[aspect])
        _writer(s3, aspect)(bucket, written)
        _after, verified = _read_back(read, bucket, aspect, want[aspect], deadline)
        log.decision(
            "restored" if verified else "restore-not-verified",
            level="WARNING" if verified else "ERROR",
            bucket=bucket,
            setting=aspect,
            found=before,
            restored_to=written,
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
