"""storage_drift: a weakened bucket setting or a changed association is restored to what
the program rendered and read back; foreign buckets and failed calls are dropped."""

from __future__ import annotations

import copy
import json
from unittest import mock

import boto3
import botocore.client
import pytest

from ftfleet.infra.aws.bucket import tls_only_policy
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.storage_drift import handler as drift
from ftfleet.lambdas.storage_drift.config import Config, render
from tests.lambdas.conftest import (
    ACCOUNT,
    PRIMARY,
    REGION,
    REPLICA,
    REPLICA_REGION,
    RUN,
    STACK,
    Context,
    FakeClock,
    MissingOps,
    SseCBlock,
    client_error,
    cloudtrail_call,
    configure,
    decisions,
    make_bucket,
    malformed_variants,
    metric_sum,
    throttle,
)

ROLE = f"arn:aws:iam::{ACCOUNT}:role/ftfleet-aws-test-replication"
FS = "fs-0123456789abcdef0"
DRA = "dra-0123456789abcdef0"
BLOCK_ALL = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}


def lifecycle():
    return {
        "Rules": [
            {
                "ID": "abort-incomplete-multipart-uploads",
                "Status": "Enabled",
                "Filter": {"Prefix": ""},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2},
            },
            {
                "ID": "checkpoints-age",
                "Status": "Enabled",
                "Filter": {"Prefix": "checkpoints/"},
                "Transitions": [{"Days": 30, "StorageClass": "STANDARD_IA"}],
                "NoncurrentVersionExpiration": {"NoncurrentDays": 14},
            },
        ]
    }


def bucket_settings(name, region, key):
    return {
        "region": region,
        "versioning": {"Status": "Enabled"},
        "public_access_block": dict(BLOCK_ALL),
        "encryption": {
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key},
                    "BucketKeyEnabled": True,
                    "BlockedEncryptionTypes": {"EncryptionType": ["SSE-C"]},
                }
            ]
        },
        "policy": json.loads(tls_only_policy(f"arn:aws:s3:::{name}")),
        "lifecycle": lifecycle(),
    }


def association():
    return {
        "region": REGION,
        "id": DRA,
        "file_system_id": FS,
        "file_system_path": "/checkpoints",
        "data_repository_path": f"s3://{PRIMARY}/checkpoints/",
        "batch_import_meta_data_on_create": True,
        "s3": {
            "AutoExportPolicy": {"Events": ["NEW", "CHANGED"]},
            "AutoImportPolicy": {"Events": ["NEW", "CHANGED"]},
        },
    }


@pytest.fixture
def sse_c():
    """S3's SSE-C block on the stack's buckets, as S3 reports it (moto drops it)."""
    return SseCBlock([PRIMARY, REPLICA])


@pytest.fixture
def admin():
    """A boto3 session of its own: an administrator, not the function."""
    return boto3.session.Session()


@pytest.fixture
def stack(moto, monkeypatch, tmp_path, sse_c, admin):
    sse_c.attach(aws.client("s3", REGION))  # the function's clients, both regions
    sse_c.attach(aws.client("s3", REPLICA_REGION))
    sse_c.attach(admin)
    key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["Arn"]
    replica_key = boto3.client("kms", region_name=REPLICA_REGION).create_key()["KeyMetadata"]["Arn"]
    buckets = {
        PRIMARY: bucket_settings(PRIMARY, REGION, key),
        REPLICA: bucket_settings(REPLICA, REPLICA_REGION, replica_key),
    }
    buckets[PRIMARY]["replication"] = {
        "Role": ROLE,
        "Rules": [
            {
                "ID": "everything",
                "Status": "Enabled",
                "Priority": 1,
                "Filter": {"Prefix": ""},
                # moto 5.2.5 stores Disabled whatever is sent; the program renders Enabled
                "DeleteMarkerReplication": {"Status": "Disabled"},
                "Destination": {"Bucket": f"arn:aws:s3:::{REPLICA}", "StorageClass": "STANDARD"},
            }
        ],
    }
    for name, want in buckets.items():
        make_bucket(name, want["region"])
        s3 = admin.client("s3", region_name=want["region"])
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration=want["versioning"])
        s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=want["public_access_block"])
        s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration=want["encryption"])
        s3.put_bucket_policy(Bucket=name, Policy=json.dumps(want["policy"]))
        s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration=want["lifecycle"])
    boto3.client("s3", region_name=REGION).put_bucket_replication(
        Bucket=PRIMARY, ReplicationConfiguration=buckets[PRIMARY]["replication"]
    )
    desired = tmp_path / "desired.json"
    desired.write_text(render(buckets, association()))
    configure(monkeypatch, Config(stack=STACK, run_id=RUN, desired_file=str(desired)))
    monkeypatch.setattr(drift, "clock", FakeClock(0.0))
    buckets["admin"] = admin
    return buckets


def s3_of(bucket, stack):
    """An administrator's client, S3's SSE-C block standing in."""
    return stack["admin"].client("s3", region_name=stack[bucket]["region"])


def call(event_name, bucket=PRIMARY, error=None):
    return drift.handler(cloudtrail_call("aws.s3", event_name, {"bucketName": bucket, "Host": "s3"}, error=error), None)


def writes_of(client):
    seen = []
    client.meta.events.register("before-call.s3.*", lambda model, **kw: seen.append(model.name))
    return seen


def test_suspended_versioning_is_enabled_again_and_verified(stack, capsys):
    s3_of(PRIMARY, stack).put_bucket_versioning(Bucket=PRIMARY, VersioningConfiguration={"Status": "Suspended"})
    result = call("PutBucketVersioning")
    assert result["decision"] == "repaired" and result["restored"] == ["versioning"]
    assert s3_of(PRIMARY, stack).get_bucket_versioning(Bucket=PRIMARY)["Status"] == "Enabled"
    (restored,) = [d for d in decisions(capsys) if d["decision"] == "restored"]
    assert restored["found"] == {"Status": "Suspended"} and restored["verified"] is True
    assert restored["caller"].endswith("assumed-role/admin/someone")
    assert metric_sum("DriftRepairs", {"Stack": STACK}) == 1


@pytest.mark.parametrize(
    ("event_name", "weaken", "setting"),
    [
        (
            "DeleteBucketPublicAccessBlock",
            lambda s3: s3.delete_public_access_block(Bucket=PRIMARY),
            "public_access_block",
        ),
        (
            "PutBucketPublicAccessBlock",
            lambda s3: s3.put_public_access_block(
                Bucket=PRIMARY, PublicAccessBlockConfiguration={**BLOCK_ALL, "BlockPublicPolicy": False}
            ),
            "public_access_block",
        ),
        ("DeleteBucketPolicy", lambda s3: s3.delete_bucket_policy(Bucket=PRIMARY), "policy"),
        (
            "PutBucketPolicy",
            lambda s3: s3.put_bucket_policy(
                Bucket=PRIMARY,
                Policy=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Principal": "*",
                                "Action": "s3:GetObject",
                                "Resource": f"arn:aws:s3:::{PRIMARY}/*",
                            }
                        ],
                    }
                ),
            ),
            "policy",
        ),
        ("DeleteBucketEncryption", lambda s3: s3.delete_bucket_encryption(Bucket=PRIMARY), "encryption"),
        (
            "PutBucketEncryption",
            lambda s3: s3.put_bucket_encryption(
                Bucket=PRIMARY,
                ServerSideEncryptionConfiguration={
                    "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
                },
            ),
            "encryption",
        ),
        ("DeleteBucketLifecycle", lambda s3: s3.delete_bucket_lifecycle(Bucket=PRIMARY), "lifecycle"),
        (
            "PutBucketLifecycle",
            lambda s3: s3.put_bucket_lifecycle_configuration(
                Bucket=PRIMARY,
                LifecycleConfiguration={
                    "Rules": [
                        *lifecycle()["Rules"],
                        {"ID": "wipe", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}},
                    ]
                },
            ),
            "lifecycle",
        ),
        ("DeleteBucketReplication", lambda s3: s3.delete_bucket_replication(Bucket=PRIMARY), "replication"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_weakened_setting_is_restored_and_read_back(stack, event_name, weaken, setting):
    weaken(s3_of(PRIMARY, stack))
    result = call(event_name)
    assert result["restored"] == [setting]
    assert call(event_name)["decision"] == "in-sync"  # and the repair's own event changes nothing


def test_the_replica_is_repaired_in_its_own_region(stack):
    s3_of(REPLICA, stack).delete_public_access_block(Bucket=REPLICA)
    assert call("DeleteBucketPublicAccessBlock", bucket=REPLICA)["restored"] == ["public_access_block"]
    got = s3_of(REPLICA, stack).get_public_access_block(Bucket=REPLICA)["PublicAccessBlockConfiguration"]
    assert got == BLOCK_ALL


def test_a_bucket_in_sync_is_only_read(stack):
    seen = writes_of(aws.client("s3", REGION))
    result = call("PutBucketVersioning")
    assert result["decision"] == "in-sync" and result["restored"] == []
    assert seen and all(name.startswith("Get") for name in seen)


def test_a_duplicate_delivery_is_harmless(stack):
    s3_of(PRIMARY, stack).delete_bucket_policy(Bucket=PRIMARY)
    assert call("DeleteBucketPolicy")["decision"] == "repaired"
    assert call("DeleteBucketPolicy")["decision"] == "in-sync"
    assert metric_sum("DriftRepairs", {"Stack": STACK}) == 1


def test_another_stack_s_bucket_is_dropped(stack):
    make_bucket("someone-elses-bucket")
    result = call("DeleteBucketPolicy", bucket="someone-elses-bucket")
    assert result["decision"] == "dropped" and result["reason"] == "bucket of another stack"


def test_a_failed_call_is_dropped(stack):
    result = call("DeleteBucketPolicy", error="AccessDenied")
    assert result["decision"] == "dropped" and result["error"] == "AccessDenied"


def test_a_call_that_changes_nothing_managed_is_dropped(stack):
    assert call("PutBucketTagging")["decision"] == "dropped"


def test_a_repair_that_does_not_read_back_raises_for_a_retry(stack, capsys):
    s3_of(PRIMARY, stack).put_bucket_versioning(Bucket=PRIMARY, VersioningConfiguration={"Status": "Suspended"})
    ignored = MissingOps({"PutBucketVersioning": {}})
    with mock.patch.object(botocore.client.BaseClient, "_make_api_call", lambda c, op, p: ignored(c, op, p)):
        with pytest.raises(drift.RepairNotVerified, match="versioning"):
            call("PutBucketVersioning")
    assert [d["decision"] for d in decisions(capsys)] == ["restore-not-verified", "error"]


# --- S3's SSE-C block, settings it does not own, its own events, eventual consistency --


def own_call(event_name, bucket=PRIMARY):
    """The CloudTrail record of a call by the function's own role."""
    event = cloudtrail_call("aws.s3", event_name, {"bucketName": bucket, "Host": "s3"})
    event["detail"]["userIdentity"] = {
        "type": "AssumedRole",
        "arn": OWN_SESSION,
        "sessionContext": {"sessionIssuer": {"type": "Role", "arn": OWN_ROLE}},
    }
    return drift.handler(event, None)


OWN_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ftfleet-aws-test-remediation-storage-drift-role-1a2b3c4"
OWN_SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/ftfleet-aws-test-remediation-storage-drift-role-1a2b3c4/fn"


@pytest.fixture
def as_function_role(monkeypatch):
    """STS answers as inside the function: an assumed-role session of its role."""
    monkeypatch.setattr(aws, "caller_arn", lambda: OWN_SESSION)


def test_an_sse_c_block_s3_reports_is_not_drift(stack, sse_c):
    # Buckets made since April 2026 report BlockedEncryptionTypes: SSE-C; the stack declares it too.
    seen = writes_of(aws.client("s3", REGION))
    assert call("PutBucketEncryption")["decision"] == "in-sync"
    assert "PutBucketEncryption" not in seen and sse_c.puts == [["SSE-C"], ["SSE-C"]]  # the fixture's two


@pytest.mark.parametrize("omitted", ["keep", "unblock"])
def test_a_rendering_that_does_not_declare_the_block_never_unblocks_sse_c(stack, sse_c, tmp_path, monkeypatch, omitted):
    # An older rendering, from before the stack declared the block: S3's block is not its to drop.
    sse_c.omitted = omitted
    old = {k: v for k, v in stack.items() if k in (PRIMARY, REPLICA)}
    for want in old.values():
        want["encryption"]["Rules"][0].pop("BlockedEncryptionTypes")
    desired = tmp_path / "old-desired.json"
    desired.write_text(render(old, association()))
    configure(monkeypatch, Config(stack=STACK, run_id=RUN, desired_file=str(desired)))
    assert call("PutBucketEncryption")["decision"] == "in-sync"
    s3_of(PRIMARY, stack).put_bucket_encryption(
        Bucket=PRIMARY,
        ServerSideEncryptionConfiguration={
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
                    "BlockedEncryptionTypes": {"EncryptionType": ["SSE-C"]},
                }
            ]
        },
    )
    assert call("PutBucketEncryption")["restored"] == ["encryption"]
    assert sse_c.blocked[PRIMARY] == ["SSE-C"] and sse_c.puts[-1] == ["SSE-C"]
    assert call("PutBucketEncryption")["decision"] == "in-sync"


def test_unblocking_sse_c_is_restored(stack, sse_c):
    rules = copy.deepcopy(stack[PRIMARY]["encryption"]["Rules"])
    rules[0]["BlockedEncryptionTypes"] = {"EncryptionType": ["NONE"]}
    s3_of(PRIMARY, stack).put_bucket_encryption(Bucket=PRIMARY, ServerSideEncryptionConfiguration={"Rules": rules})
    assert sse_c.blocked[PRIMARY] == []
    assert call("PutBucketEncryption")["restored"] == ["encryption"]
    assert sse_c.blocked[PRIMARY] == ["SSE-C"]


def test_the_event_of_its_own_repair_is_dropped(stack, sse_c, as_function_role):
    s3_of(PRIMARY, stack).delete_bucket_encryption(Bucket=PRIMARY)
    assert call("DeleteBucketEncryption")["restored"] == ["encryption"]
    seen = writes_of(aws.client("s3", REGION))
    result = own_call("PutBucketEncryption")
    assert result["decision"] == "dropped" and result["reason"] == "the call was this function's own repair"
    assert seen == []  # not even read


def test_another_session_of_another_role_is_not_its_own(stack, as_function_role):
    s3_of(PRIMARY, stack).delete_bucket_policy(Bucket=PRIMARY)
    event = cloudtrail_call("aws.s3", "DeleteBucketPolicy", {"bucketName": PRIMARY})
    event["detail"]["userIdentity"]["sessionContext"] = {
        "sessionIssuer": {"arn": f"arn:aws:iam::{ACCOUNT}:role/ftfleet-aws-test-remediation-storage-drift-role-other"}
    }
    assert drift.handler(event, None)["restored"] == ["policy"]


def test_without_sts_the_comparison_still_finds_its_own_repair_in_sync(stack, monkeypatch):
    monkeypatch.setattr(aws, "caller_arn", lambda: None)
    s3_of(PRIMARY, stack).delete_bucket_policy(Bucket=PRIMARY)
    assert call("DeleteBucketPolicy")["restored"] == ["policy"]
    assert own_call("PutBucketPolicy")["decision"] == "in-sync"


def test_a_denial_someone_added_to_the_policy_is_kept_and_an_allow_removed(stack):
    policy = copy.deepcopy(stack[PRIMARY]["policy"])
    deny = {"Sid": "NoDeletes", "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": "*"}
    allow = {"Sid": "Open", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "*"}
    s3 = s3_of(PRIMARY, stack)
    s3.put_bucket_policy(Bucket=PRIMARY, Policy=json.dumps({**policy, "Statement": [*policy["Statement"], deny]}))
    assert call("PutBucketPolicy")["decision"] == "in-sync"  # stricter than the stack's: not drift
    s3.put_bucket_policy(Bucket=PRIMARY, Policy=json.dumps({**policy, "Statement": [allow, deny]}))
    assert call("PutBucketPolicy")["restored"] == ["policy"]
    sids = [st.get("Sid") for st in json.loads(s3.get_bucket_policy(Bucket=PRIMARY)["Policy"])["Statement"]]
    assert sids == ["DenyInsecureTransport", "NoDeletes"]


class Stale:
    """S3 bucket configuration is eventually consistent: the next ``reads`` reads of
    ``operation`` after a write answer what was there before it."""

    def __init__(self, client, operation, write, reads):
        self.reads, self.before, self.served = reads, None, 0
        events = client.meta.events
        events.register(f"after-call.s3.{write}", self._written)
        events.register(f"after-call.s3.{operation}", self._read)

    def _written(self, **kwargs):
        self.armed = True

    def _read(self, parsed, **kwargs):
        if getattr(self, "armed", False) and self.served < self.reads:
            self.served += 1
            parsed.clear()
            parsed.update(copy.deepcopy(self.before))
        else:
            self.before = copy.deepcopy(parsed)


def test_a_repair_read_back_stale_is_read_again_before_it_counts_as_failed(stack):
    s3_of(PRIMARY, stack).put_bucket_versioning(Bucket=PRIMARY, VersioningConfiguration={"Status": "Suspended"})
    stale = Stale(aws.client("s3", REGION), "GetBucketVersioning", "PutBucketVersioning", reads=2)
    result = drift.handler(
        cloudtrail_call("aws.s3", "PutBucketVersioning", {"bucketName": PRIMARY}), Context(remaining_s=600)
    )
    assert result["restored"] == ["versioning"] and stale.served == 2
    assert drift.clock.slept == [1.0, 2.0]


def test_a_repair_that_never_reads_back_fails_within_the_invocation(stack):
    s3_of(PRIMARY, stack).put_bucket_versioning(Bucket=PRIMARY, VersioningConfiguration={"Status": "Suspended"})
    Stale(aws.client("s3", REGION), "GetBucketVersioning", "PutBucketVersioning", reads=100)
    with pytest.raises(drift.RepairNotVerified, match="versioning"):
        drift.handler(cloudtrail_call("aws.s3", "PutBucketVersioning", {"bucketName": PRIMARY}), Context(40))
    assert sum(drift.clock.slept) <= 40 - 30


def test_throttled_calls_are_retried(stack):
    s3_of(PRIMARY, stack).put_bucket_versioning(Bucket=PRIMARY, VersioningConfiguration={"Status": "Suspended"})
    hits = throttle(aws.client("s3", REGION), "GetBucketVersioning", times=2)
    assert call("PutBucketVersioning")["restored"] == ["versioning"] and len(hits) == 2


@pytest.mark.parametrize(
    "event",
    malformed_variants(
        cloudtrail_call("aws.s3", "PutBucketPolicy", {"bucketName": PRIMARY}), ["eventName", "requestParameters"]
    ),
)
def test_a_malformed_event_is_logged_and_dropped(no_aws, monkeypatch, tmp_path, capsys, event):
    # No AWS at all: a handler that went past validation would fail.
    desired = tmp_path / "desired.json"
    desired.write_text(render({PRIMARY: {"region": REGION}}, association()))
    configure(monkeypatch, Config(stack=STACK, run_id=RUN, desired_file=str(desired)))
    result = drift.handler(event, None)
    assert result["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


# --- the FSx data repository association (moto 5.2.5 has none of these calls) --------


class Fsx(MissingOps):
    def __init__(self, associations):
        super().__init__(
            {
                "DescribeDataRepositoryAssociations": self._describe,
                "UpdateDataRepositoryAssociation": self._update,
                "CreateDataRepositoryAssociation": self._create,
            }
        )
        self.associations = {a["AssociationId"]: a for a in associations}
        self.deleting_polls = 0

    def _describe(self, params):
        for a in list(self.associations.values()):
            if a["Lifecycle"] == "DELETING":
                if self.deleting_polls == 0:
                    del self.associations[a["AssociationId"]]
                else:
                    self.deleting_polls -= 1
        if "AssociationIds" in params:
            found = [self.associations[i] for i in params["AssociationIds"] if i in self.associations]
            if not found:
                raise client_error(
                    "DataRepositoryAssociationNotFound", "not found", "DescribeDataRepositoryAssociations"
                )
        else:
            fs = params["Filters"][0]["Values"]
            found = [a for a in self.associations.values() if a["FileSystemId"] in fs]
        return {"Associations": copy.deepcopy(found)}

    def _update(self, params):
        self.associations[params["AssociationId"]]["S3"] = copy.deepcopy(params["S3"])
        return {"Association": copy.deepcopy(self.associations[params["AssociationId"]])}

    def _create(self, params):
        new = {
            "AssociationId": "dra-0fedcba9876543210",
            "FileSystemId": params["FileSystemId"],
            "FileSystemPath": params["FileSystemPath"],
            "DataRepositoryPath": params["DataRepositoryPath"],
            "S3": copy.deepcopy(params["S3"]),
            "Lifecycle": "CREATING",
            "Tags": params.get("Tags", []),
        }
        self.associations[new["AssociationId"]] = new
        return {"Association": copy.deepcopy(new)}


def ours(**changes):
    a = {
        "AssociationId": DRA,
        "FileSystemId": FS,
        "FileSystemPath": "/checkpoints",
        "DataRepositoryPath": f"s3://{PRIMARY}/checkpoints/",
        "Lifecycle": "AVAILABLE",
        "S3": copy.deepcopy(association()["s3"]),
    }
    a.update(changes)
    return a


def fsx_call(fake, event_name, association_id=DRA):
    with mock.patch.object(botocore.client.BaseClient, "_make_api_call", lambda c, op, p: fake(c, op, p)):
        return drift.handler(cloudtrail_call("aws.fsx", event_name, {"associationId": association_id}), Context())


def test_a_changed_association_is_restored(stack):
    fake = Fsx([ours(S3={"AutoExportPolicy": {"Events": ["NEW"]}})])
    result = fsx_call(fake, "UpdateDataRepositoryAssociation")
    assert result["decision"] == "restored" and result["verified"]
    assert fake.associations[DRA]["S3"] == association()["s3"]
    assert fsx_call(fake, "UpdateDataRepositoryAssociation")["decision"] == "in-sync"


def test_a_deleted_association_is_recreated_once_the_old_one_is_gone(stack):
    fake = Fsx([ours(Lifecycle="DELETING")])
    fake.deleting_polls = 2
    result = fsx_call(fake, "DeleteDataRepositoryAssociation")
    assert result["decision"] == "recreated" and result["replaces"] == DRA and result["verified"]
    (new,) = fake.associations.values()
    assert new["FileSystemPath"] == "/checkpoints" and new["DataRepositoryPath"] == f"s3://{PRIMARY}/checkpoints/"
    assert {"Key": "ftfleet:restored-by", "Value": "storage_drift"} in new["Tags"]
    assert "pulumi import" in result["next_step"]
    assert drift.clock.slept  # it waited for the deletion to finish


def test_an_association_of_another_file_system_is_dropped(stack):
    fake = Fsx([ours(), ours(AssociationId="dra-0999999999999999", FileSystemId="fs-0999999999999999")])
    result = fsx_call(fake, "UpdateDataRepositoryAssociation", association_id="dra-0999999999999999")
    assert result["decision"] == "dropped" and "another file system" in result["reason"]
    assert fake.names() == ["DescribeDataRepositoryAssociations"]


# --- the rendered settings travel in the package -----------------------------------------


def test_a_missing_or_malformed_settings_file_fails_the_cold_start_naming_it(monkeypatch, tmp_path):
    from ftfleet.lambdas.common.config import FunctionConfigError

    monkeypatch.setenv("FTFLEET_STACK", STACK)
    monkeypatch.setenv("FTFLEET_RUN_ID", RUN)
    for name, text in (("absent.json", None), ("broken.json", "{"), ("empty.json", '{"buckets": {}}')):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        monkeypatch.setenv("FTFLEET_DESIRED_FILE", str(path))
        with pytest.raises(FunctionConfigError, match=f"FTFLEET_DESIRED_FILE='{path}'"):
            Config.from_env()
