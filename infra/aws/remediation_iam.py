"""The identity policy of each remediation function: least privilege, scoped to this
stack's groups, buckets, prefixes, key, queues and log groups.

Pure functions of resolved ARNs and names (the program calls them inside ``apply``).
Describe and list calls that have no resource-level permissions in their service's
authorization reference are the only statements on ``*``; metric writes are limited to
the contract's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftfleet import contract
from ftfleet.lambdas.unhealthy_node.config import REPLACEMENTS_KEY


@dataclass(frozen=True)
class Scope:
    """What a function may touch, resolved."""

    region: str
    replica_region: str
    account: str
    log_group_arn: str
    dlq_arn: str
    groups: tuple[str, ...] = ()
    primary_bucket_arn: str = ""
    replica_bucket_arn: str = ""
    key_arn: str = ""
    replica_key_arn: str = ""
    root: str = ""
    """Key prefix of the run's checkpoints, no trailing slash."""
    replication_role_arn: str = ""
    file_system_arn: str = ""
    file_system_id: str = ""
    home_groups: tuple[str, ...] = ()
    """A standby's home groups, in ``replica_region`` (the home's region)."""
    lease_key: str = ""
    """Key of the run lease (contract.lease_key)."""


def _statement(sid: str, actions: list[str], resources: list[str], condition: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": sorted(actions), "Resource": resources}
    if condition:
        out["Condition"] = condition
    return out


def _document(statements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": statements}


def _base(s: Scope) -> list[dict[str, Any]]:
    """Every function: its own log streams and its own dead-letter queue."""
    return [
        _statement("WriteOwnLogs", ["logs:CreateLogStream", "logs:PutLogEvents"], [f"{s.log_group_arn}:*"]),
        _statement("DeadLetters", ["sqs:SendMessage"], [s.dlq_arn]),
    ]


def _metrics() -> dict[str, Any]:
    return _statement(
        "PutMetrics",
        ["cloudwatch:PutMetricData"],
        ["*"],
        {"StringEquals": {"cloudwatch:namespace": contract.METRICS_NAMESPACE}},
    )


def _group_arns(s: Scope) -> list[str]:
    return [f"arn:aws:autoscaling:{s.region}:{s.account}:autoScalingGroup:*:autoScalingGroupName/{g}" for g in s.groups]


def _object(s: Scope, bucket_arn: str, key: str) -> str:
    return f"{bucket_arn}/{s.root}/{key}"


def _list_prefix(s: Scope, bucket_arn: str, prefix: str, sid: str) -> dict[str, Any]:
    return _statement("List" + sid, ["s3:ListBucket"], [bucket_arn], {"StringLike": {"s3:prefix": [prefix]}})


def _use_key(sid: str, key_arn: str, region: str, actions: list[str]) -> dict[str, Any]:
    return _statement(sid, actions, [key_arn], {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}})


def spot_interruption(s: Scope) -> dict[str, Any]:
    prior = f"{s.root}/{contract.INTERRUPTION_PRIOR_KEY}"
    return _document(
        [
            *_base(s),
            _statement("DescribeInstances", ["ec2:DescribeInstances"], ["*"]),
            _statement(
                "TagStackInstances",
                ["ec2:CreateTags"],
                [f"arn:aws:ec2:{s.region}:{s.account}:instance/*"],
                {
                    "StringEquals": {"aws:ResourceTag/aws:autoscaling:groupName": list(s.groups)},
                    "ForAllValues:StringEquals": {
                        "aws:TagKeys": [contract.SPOT_INTERRUPTION_TAG, contract.REBALANCE_TAG]
                    },
                },
            ),
            _list_prefix(s, s.primary_bucket_arn, prior, "Prior"),
            _statement(
                "ReadWritePrior",
                ["s3:GetObject", "s3:PutObject"],
                [_object(s, s.primary_bucket_arn, contract.INTERRUPTION_PRIOR_KEY)],
            ),
            _use_key("UseBucketKey", s.key_arn, s.region, ["kms:Decrypt", "kms:GenerateDataKey"]),
            _metrics(),
        ]
    )


def lifecycle_handoff(s: Scope) -> dict[str, Any]:
    markers = f"{s.root}/{contract.MARKER_DIR}/"
    return _document(
        [
            *_base(s),
            _statement(
                "HoldAndReleaseStackNodes",
                ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"],
                _group_arns(s),
            ),
            _list_prefix(s, s.primary_bucket_arn, f"{markers}*", "Markers"),
            _statement("ReadMarkers", ["s3:GetObject"], [f"{s.primary_bucket_arn}/{markers}*"]),
            _use_key("DecryptMarkers", s.key_arn, s.region, ["kms:Decrypt"]),
            _metrics(),
        ]
    )


def unhealthy_node(s: Scope) -> dict[str, Any]:
    return _document(
        [
            *_base(s),
            # Describe and list calls without resource-level permissions.
            _statement(
                "ReadFleetAndMetrics",
                [
                    "autoscaling:DescribeAutoScalingGroups",
                    "ec2:DescribeInstances",
                    "cloudwatch:GetMetricData",
                    "cloudwatch:ListMetrics",
                ],
                ["*"],
            ),
            _statement("MarkStackNodesUnhealthy", ["autoscaling:SetInstanceHealth"], _group_arns(s)),
            _list_prefix(s, s.primary_bucket_arn, f"{s.root}/{REPLACEMENTS_KEY}", "ReplacementLog"),
            _statement(
                "ReadWriteReplacementLog",
                ["s3:GetObject", "s3:PutObject"],
                [_object(s, s.primary_bucket_arn, REPLACEMENTS_KEY)],
            ),
            _use_key("UseBucketKey", s.key_arn, s.region, ["kms:Decrypt", "kms:GenerateDataKey"]),
            _metrics(),
        ]
    )


def storage_drift(s: Scope) -> dict[str, Any]:
    buckets = [s.primary_bucket_arn, s.replica_bucket_arn]
    return _document(
        [
            *_base(s),
            _statement(
                "ReadAndRestoreBucketSettings",
                [
                    "s3:GetBucketVersioning",
                    "s3:PutBucketVersioning",
                    "s3:GetBucketPublicAccessBlock",
                    "s3:PutBucketPublicAccessBlock",
                    "s3:GetEncryptionConfiguration",
                    "s3:PutEncryptionConfiguration",
                    "s3:GetBucketPolicy",
                    "s3:PutBucketPolicy",
                    "s3:GetLifecycleConfiguration",
                    "s3:PutLifecycleConfiguration",
                    "s3:GetReplicationConfiguration",
                    "s3:PutReplicationConfiguration",
                ],
                buckets,
            ),
            # PutBucketReplication passes the replication role to S3.
            _statement(
                "PassReplicationRole",
                ["iam:PassRole"],
                [s.replication_role_arn],
                {"StringEquals": {"iam:PassedToService": "s3.amazonaws.com"}},
            ),
            _statement("DescribeAssociations", ["fsx:DescribeDataRepositoryAssociations"], ["*"]),
            _statement(
                "RestoreAssociation",
                ["fsx:CreateDataRepositoryAssociation", "fsx:UpdateDataRepositoryAssociation", "fsx:TagResource"],
                [s.file_system_arn, f"arn:aws:fsx:{s.region}:{s.account}:association/{s.file_system_id}/*"],
            ),
            # CreateDataRepositoryAssociation checks the bucket and FSx's service-linked
            # role for S3 access on the caller's behalf (FSx for Lustre User Guide,
            # "Linking your file system to an Amazon S3 bucket").
            _statement(
                "AssociationPrerequisites",
                ["s3:GetBucketLocation", "s3:GetBucketAcl", "s3:ListBucket"],
                [s.primary_bucket_arn],
            ),
            _statement(
                "FsxS3AccessRole",
                ["iam:CreateServiceLinkedRole", "iam:AttachRolePolicy", "iam:PutRolePolicy"],
                [
                    f"arn:aws:iam::{s.account}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/*",
                ],
            ),
            _metrics(),
        ]
    )


def capacity_watch(s: Scope, moves: bool = False) -> dict[str, Any]:
    """Read the groups and their scaling activities (no resource-level permissions for
    either); publish its metrics. ``moves`` (a standby's with standbyAutoFailover):
    resize and tag both stacks' groups, read the run's checkpoints in both buckets, and
    read the run lease in the home's primary (``replica_bucket_arn`` here)."""
    statements = [
        *_base(s),
        _statement(
            "ReadGroupsAndActivities",
            ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeScalingActivities"],
            ["*"],
        ),
        _metrics(),
    ]
    if not moves:
        return _document(statements)
    home = Scope(**{**s.__dict__, "region": s.replica_region, "groups": s.home_groups})
    lease = s.lease_key
    statements += [
        _statement(
            "MoveTheRun",
            ["autoscaling:UpdateAutoScalingGroup", "autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"],
            [*_group_arns(s), *_group_arns(home)],
        ),
        *_read_checkpoints(s, "Checkpoints", ("Here", "Home")),
        _statement("ListLease", ["s3:ListBucket"], [s.replica_bucket_arn], {"StringEquals": {"s3:prefix": [lease]}}),
        _statement("ReadLease", ["s3:GetObject"], [f"{s.replica_bucket_arn}/{lease}"]),
        _use_key("DecryptLease", s.replica_key_arn, s.replica_region, ["kms:Decrypt"]),
    ]
    return _document(statements)


def _read_checkpoints(s: Scope, what: str, sids: tuple[str, str]) -> list[dict[str, Any]]:
    """List the run's prefix, read its step directories and decrypt them, in the primary
    bucket and in the replica (statement ids ``<verb><what><sid>``)."""
    statements = []
    for sid, bucket, key, region in (
        (sids[0], s.primary_bucket_arn, s.key_arn, s.region),
        (sids[1], s.replica_bucket_arn, s.replica_key_arn, s.replica_region),
    ):
        statements += [
            _list_prefix(s, bucket, f"{s.root}/*", sid),
            _statement(f"Read{what}{sid}", ["s3:GetObject"], [f"{bucket}/{s.root}/{contract.STEP_DIR_PREFIX}*"]),
            _use_key(f"Decrypt{what}{sid}", key, region, ["kms:Decrypt"]),
        ]
    return statements


def replication_watch(s: Scope) -> dict[str, Any]:
    statements = [*_base(s), *_read_checkpoints(s, "Manifests", ("Primary", "Replica"))]
    statements.append(_metrics())
    return _document(statements)


def retention_sweep(s: Scope) -> dict[str, Any]:
    """List and read the run's checkpoints and delete them, in the primary bucket only
    (the replication rule carries delete markers to the replica); no other key."""
    steps = f"{s.primary_bucket_arn}/{s.root}/{contract.STEP_DIR_PREFIX}*"
    return _document(
        [
            *_base(s),
            _list_prefix(s, s.primary_bucket_arn, f"{s.root}/*", "Primary"),
            _statement("ReadAndDeleteCheckpoints", ["s3:GetObject", "s3:DeleteObject"], [steps]),
            _use_key("DecryptManifests", s.key_arn, s.region, ["kms:Decrypt"]),
            _metrics(),
        ]
    )


def lambda_trust(account: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }


def events_trust(account: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }


def forward_events(bus_arn: str) -> dict[str, Any]:
    """The replica region's rule forwards the replica bucket's calls to the primary bus."""
    return _document([_statement("ForwardToPrimaryBus", ["events:PutEvents"], [bus_arn])])


def dead_letter_queue(queue_arn: str, rule_arns: list[str]) -> dict[str, Any]:
    """EventBridge may park undeliverable events of this function's rules in its queue."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "EventBridgeDeadLetters",
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": sorted(rule_arns)}},
            }
        ],
    }
