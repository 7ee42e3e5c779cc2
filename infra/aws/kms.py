"""StackKey: the stack's multi-region KMS key and its replica in the replica region.

One key family encrypts the buckets (primary with the key, replica with the replica
key, so replication re-encrypts in-region) and the FSx file system.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from ftfleet.infra.settings import Settings


def key_policy(account_id: str) -> str:
    # The account's IAM policies decide who may use the key; the key policy only
    # delegates to them (the shape of AWS's default key policy, written out so that it
    # is reviewable and identical in both regions).
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DelegateToAccountIam",
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:aws:iam::{account_id}:root"},
                    "Action": "kms:*",
                    "Resource": "*",
                }
            ],
        }
    )


class StackKey(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        account_id: pulumi.Input[str],
        primary: aws.Provider,
        replica: aws.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:StackKey", name, None, opts)
        policy = pulumi.Output.from_input(account_id).apply(key_policy)
        self.key = aws.kms.Key(
            f"{name}-key",
            description=f"{settings.name}: checkpoints (buckets, FSx)",
            multi_region=True,
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=policy,
            opts=pulumi.ResourceOptions(parent=self, provider=primary),
        )
        self.replica = aws.kms.ReplicaKey(
            f"{name}-replica",
            description=f"{settings.name}: checkpoint replica",
            primary_key_arn=self.key.arn,
            deletion_window_in_days=30,
            policy=policy,
            opts=pulumi.ResourceOptions(parent=self, provider=replica),
        )
        for key, provider, suffix in ((self.key, primary, "alias"), (self.replica, replica, "replica-alias")):
            aws.kms.Alias(
                f"{name}-{suffix}",
                name=f"alias/{settings.name}-checkpoints",
                target_key_id=key.key_id,
                opts=pulumi.ResourceOptions(parent=self, provider=provider),
            )
        self.register_outputs({"key_arn": self.key.arn, "replica_key_arn": self.replica.arn})
