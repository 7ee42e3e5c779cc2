"""NodeIdentity: instance roles of the coordinator and the workers, least privilege.

Workers may read and write only this run's checkpoint prefix, read the replica, use the
stack keys, describe FSx, put metrics in the `ftfleet` namespace, pull the trainer
image and talk to SSM. The coordinator may additionally publish its address in the
stack's private zone. No statement grants `*` actions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from ftfleet import contract
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
            {
                "Sid": "ReadReplicaCheckpoints",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{g.replica_bucket_arn}/{prefix}*"],
            },
            {
                "Sid": "UseCheckpointKeys",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"],
                "Resource": [g.key_arn, g.replica_key_arn],
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
        ],
    }


def coordinator_policy(zone_arn: str) -> dict:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "PublishCoordinatorAddress",
                "Effect": "Allow",
                "Action": ["route53:ChangeResourceRecordSets"],
                "Resource": [zone_arn],
            }
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
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:NodeIdentity", name, None, opts)
        policy = grants.apply(lambda g: json.dumps(node_policy(g)))
        self.profiles: dict[str, aws.iam.InstanceProfile] = {}
        self.roles: dict[str, aws.iam.Role] = {}
        for role_name in ("coordinator", "worker"):
            o = pulumi.ResourceOptions(parent=self)
            role = aws.iam.Role(
                f"{name}-{role_name}",
                assume_role_policy=EC2_TRUST,
                description=f"{settings.name} {role_name} nodes",
                opts=o,
            )
            aws.iam.RolePolicy(f"{name}-{role_name}-checkpoints", role=role.id, policy=policy, opts=o)
            aws.iam.RolePolicyAttachment(f"{name}-{role_name}-ssm", role=role.name, policy_arn=SSM_CORE, opts=o)
            if role_name == "coordinator":
                aws.iam.RolePolicy(
                    f"{name}-coordinator-dns",
                    role=role.id,
                    policy=pulumi.Output.from_input(zone_arn).apply(lambda a: json.dumps(coordinator_policy(a))),
                    opts=o,
                )
            self.roles[role_name] = role
            self.profiles[role_name] = aws.iam.InstanceProfile(f"{name}-{role_name}", role=role.name, opts=o)
        self.register_outputs({k: v.arn for k, v in self.profiles.items()})
