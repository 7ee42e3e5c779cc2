"""NodeIdentity: instance roles of the coordinator and the workers, least privilege.

Workers may read and write only this run's checkpoint prefix, read the replica, use the
stack keys, describe FSx, put metrics in the `ftfleet` namespace, pull the trainer
image and talk to SSM. A node that cannot boot may record and count its replacement
under this run's replacement prefix and ask a group of this stack to replace it (the
bound is the node's own: infra/aws/boot/ftfleet-node.sh). The coordinator may
additionally UPSERT its own A record in the stack's private zone, and read the change's
status to wait until it is INSYNC. No statement grants `*` actions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.aws import names
from ftfleet.infra.aws.dns import normalized_record_name
from ftfleet.infra.settings import Settings

METRICS_NAMESPACE = contract.METRICS_NAMESPACE
SSM_CORE = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


@dataclass(frozen=True)
class NodeGrants:
    primary_bucket_arn: str
    replica_bucket_arn: str
    key_arn: str
    replica_key_arn: str
    repository_arn: str
    checkpoint_prefix: str
    """Key prefix of the run's checkpoints, e.g. `checkpoints/my-run/`."""
    region: str
    """Region of the primary bucket and key (the key is used only through S3 there)."""
    replica_region: str
    replacements_prefix: str
    """Key prefix of the run's replacement records (contract.REPLACEMENTS_PREFIX + run id + /)."""
    group_arn_pattern: str
    """ARNs of this stack's Auto Scaling groups, e.g.
    `arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/ftfleet-dev-*`."""
    stack: str
    """Value of the groups' `ftfleet:stack` tag."""
    lease_key: str = ""
    """Key of the run's lease (contract.lease_key); empty: none."""
    lease_in_replica: bool = False
    """The lease lives in the replica bucket (a standby: the home stack's primary bucket,
    where both regions contend for it), not in the primary."""

    @property
    def lease_bucket_arn(self) -> str:
        return self.replica_bucket_arn if self.lease_in_replica else self.primary_bucket_arn


def node_policy(g: NodeGrants) -> dict:
    prefix = g.checkpoint_prefix
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ListCheckpoints",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [g.primary_bucket_arn, g.replica_bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
            {
                "Sid": "ReadWriteCheckpoints",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                "Resource": [f"{g.primary_bucket_arn}/{prefix}*"],
            },
            *lease_statements(g),
            {
                "Sid": "ReadReplicaCheckpoints",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{g.replica_bucket_arn}/{prefix}*"],
            },
            # SSE-KMS through S3 only: S3 asks for a data key to write and decrypts to read.
            {
                "Sid": "UseCheckpointKeys",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": [g.key_arn],
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{g.region}.amazonaws.com"}},
            },
            {
                "Sid": "ReadReplicaKey",
                "Effect": "Allow",
                "Action": ["kms:Decrypt"],
                "Resource": [g.replica_key_arn],
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{g.replica_region}.amazonaws.com"}},
            },
            # Describe calls have no resource-level permissions in FSx.
            {
                "Sid": "DescribeFsx",
                "Effect": "Allow",
                "Action": ["fsx:DescribeFileSystems", "fsx:DescribeDataRepositoryAssociations"],
                "Resource": ["*"],
            },
            {
                "Sid": "PutTrainerMetrics",
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricData"],
                "Resource": ["*"],
                "Condition": {"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}},
            },
            {"Sid": "EcrLogin", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": ["*"]},
            {
                "Sid": "PullTrainerImage",
                "Effect": "Allow",
                "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                "Resource": [g.repository_arn],
            },
            *self_replacement_statements(g),
            lifecycle_statement(g),
        ],
    }


def lease_statements(g: NodeGrants) -> list[dict]:
    """Read and conditionally write the run lease, and list its one key: without
    s3:ListBucket, S3 answers a GET of a missing object with 403 instead of 404, and the
    first holder could never tell "no lease yet" from "no access" (S3 user guide,
    GetObject permissions)."""
    if not g.lease_key:
        return []
    statements = [
        {
            "Sid": "HoldRunLease",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject"],
            "Resource": [f"{g.lease_bucket_arn}/{g.lease_key}"],
        },
        {
            "Sid": "FindRunLease",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [g.lease_bucket_arn],
            "Condition": {"StringEquals": {"s3:prefix": [g.lease_key]}},
        },
    ]
    if g.lease_in_replica:
        # The replica bucket is read-only otherwise: writing the lease there needs a data
        # key of that bucket's key, through S3 in its region.
        statements.append(
            {
                "Sid": "WriteRunLeaseKey",
                "Effect": "Allow",
                "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
                "Resource": [g.replica_key_arn],
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{g.replica_region}.amazonaws.com"}},
            }
        )
    return statements


def self_replacement_statements(g: NodeGrants) -> list[dict]:
    """A node whose boot failed records its replacement, counts its group's recent ones,
    and asks for a replacement (or leaves the group without one, past the bound)."""
    return [
        {
            "Sid": "RecordSelfReplacement",
            "Effect": "Allow",
            "Action": ["s3:PutObject"],
            "Resource": [f"{g.primary_bucket_arn}/{g.replacements_prefix}*"],
        },
        {
            "Sid": "CountSelfReplacements",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [g.primary_bucket_arn],
            "Condition": {"StringLike": {"s3:prefix": [f"{g.replacements_prefix}*"]}},
        },
        {
            "Sid": "ReplaceSelfInStackGroups",
            "Effect": "Allow",
            "Action": ["autoscaling:SetInstanceHealth", "autoscaling:TerminateInstanceInAutoScalingGroup"],
            "Resource": [g.group_arn_pattern],
            "Condition": {"StringEquals": {"aws:ResourceTag/ftfleet:stack": g.stack}},
        },
    ]


def lifecycle_statement(g: NodeGrants) -> dict:
    """A node whose emergency checkpoint is committed completes its own termination
    lifecycle action (contract.TERMINATION_HOOK_NAME), so the group stops waiting for
    the hook's timeout; only in this stack's groups."""
    return {
        "Sid": "CompleteOwnLifecycleAction",
        "Effect": "Allow",
        "Action": ["autoscaling:CompleteLifecycleAction"],
        "Resource": [g.group_arn_pattern],
        "Condition": {"StringEquals": {"aws:ResourceTag/ftfleet:stack": g.stack}},
    }


def coordinator_policy(zone_arn: str, record_name: str) -> dict:
    """UPSERT of the coordinator's own A record, nothing else in the zone; GetChange
    (no resource-level scoping but the change/* ARN) to wait until it is INSYNC."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "PublishCoordinatorAddress",
                "Effect": "Allow",
                "Action": ["route53:ChangeResourceRecordSets"],
                "Resource": [zone_arn],
                "Condition": {
                    "ForAllValues:StringEquals": {
                        "route53:ChangeResourceRecordSetsNormalizedRecordNames": [normalized_record_name(record_name)],
                        "route53:ChangeResourceRecordSetsRecordTypes": ["A"],
                        "route53:ChangeResourceRecordSetsActions": ["UPSERT"],
                    }
                },
            },
            {
                "Sid": "WaitForCoordinatorAddress",
                "Effect": "Allow",
                "Action": ["route53:GetChange"],
                "Resource": ["arn:aws:route53:::change/*"],
            },
        ],
    }


EC2_TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
)


class NodeIdentity(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        grants: pulumi.Output[NodeGrants],
        zone_arn: pulumi.Input[str],
        coordinator_name: pulumi.Input[str],
        provider: aws.Provider | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``provider``: IAM is global; a regional provider only brings its default tags."""
        super().__init__("ftfleet:aws:NodeIdentity", name, None, opts)
        policy = grants.apply(lambda g: json.dumps(node_policy(g)))
        self.profiles: dict[str, aws.iam.InstanceProfile] = {}
        self.roles: dict[str, aws.iam.Role] = {}
        # Everything that grants the roles their permissions: what a booting node needs.
        self.policies: list[pulumi.Resource] = []
        for role_name in ("coordinator", "worker"):
            o = pulumi.ResourceOptions(parent=self, provider=provider)
            role = aws.iam.Role(
                f"{name}-{role_name}",
                **names.generated("aws:iam/role:Role", f"{name}-{role_name}"),
                assume_role_policy=EC2_TRUST,
                description=f"{settings.name} {role_name} nodes",
                opts=o,
            )
            self.policies += [
                aws.iam.RolePolicy(
                    f"{name}-{role_name}-checkpoints",
                    **names.generated("aws:iam/rolePolicy:RolePolicy", f"{name}-{role_name}-checkpoints"),
                    role=role.id,
                    policy=policy,
                    opts=o,
                ),
                aws.iam.RolePolicyAttachment(f"{name}-{role_name}-ssm", role=role.name, policy_arn=SSM_CORE, opts=o),
            ]
            if role_name == "coordinator":
                dns = aws.iam.RolePolicy(
                    f"{name}-coordinator-dns",
                    **names.generated("aws:iam/rolePolicy:RolePolicy", f"{name}-coordinator-dns"),
                    role=role.id,
                    policy=pulumi.Output.all(zone_arn, coordinator_name).apply(
                        lambda a: json.dumps(coordinator_policy(*a))
                    ),
                    opts=o,
                )
                self.policies.append(dns)
            self.roles[role_name] = role
            self.profiles[role_name] = aws.iam.InstanceProfile(
                f"{name}-{role_name}",
                **names.generated("aws:iam/instanceProfile:InstanceProfile", f"{name}-{role_name}"),
                role=role.name,
                opts=o,
            )
        self.register_outputs({k: v.arn for k, v in self.profiles.items()})
