"""StackKey: the stack's multi-region KMS key and its replica in the replica region.

One key family encrypts the buckets (primary with the key, replica with the replica
key, so replication re-encrypts in-region) and the FSx file system. Both keys' policies
also let FSx's S3-access role use them, through S3 in their region, which a file system
linked to an SSE-KMS bucket needs to import from and export to it: the home's file
system is linked to the primary bucket, a standby's to the replica.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from ftfleet.infra.settings import Settings

# The service-linked role FSx creates for each file system linked to S3 (one per file
# system: AWSServiceRoleForFSxS3Access_fs-...).
FSX_S3_ACCESS_ROLE = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_fs-*"
FSX_S3_KMS_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]


def fsx_export_statement(account_id: str, bucket_region: str) -> dict:
    """Lets FSx's S3-access role use the key for the SSE-KMS bucket it exports to (FSx
    for Lustre guide, "Working with server-side encrypted Amazon S3 buckets",
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/s3-server-side-encryption-support.html).

    The role's name carries the file system id, and the file system is encrypted with
    this key, so naming the role outright would make key -> file system -> key a
    cycle. The statement names every such role of this account by pattern instead.
    Its principal is "*" narrowed by conditions, not the account: a key policy that
    names the account only delegates to IAM policies, and FSx's role has no IAM
    policy for this key. It works only through S3 in the bucket's region."""
    return {
        "Sid": "FsxExportToSseKmsBucket",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": FSX_S3_KMS_ACTIONS,
        "Resource": "*",
        "Condition": {
            "StringEquals": {"kms:CallerAccount": account_id, "kms:ViaService": f"s3.{bucket_region}.amazonaws.com"},
            "ArnLike": {"aws:PrincipalArn": f"arn:aws:iam::{account_id}:{FSX_S3_ACCESS_ROLE}"},
        },
    }


def key_policy(account_id: str, fsx_export_region: str | None = None) -> str:
    """The account's IAM policies decide who may use the key; the key policy delegates
    to them (the shape of AWS's default key policy, written out so that it is
    reviewable), and, for the key of a bucket that FSx exports to, grants FSx."""
    statements = [
        {
            "Sid": "DelegateToAccountIam",
            "Effect": "Allow",
            "Principal": {"AWS": f"arn:aws:iam::{account_id}:root"},
            "Action": "kms:*",
            "Resource": "*",
        }
    ]
    if fsx_export_region:
        statements.append(fsx_export_statement(account_id, fsx_export_region))
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


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
        account = pulumi.Output.from_input(account_id)
        # Deleting a key makes every object encrypted with it unreadable: protected.
        keep = pulumi.ResourceOptions(protect=True)
        self.key = aws.kms.Key(
            f"{name}-key",
            description=f"{settings.name}: checkpoints (buckets, FSx)",
            multi_region=True,
            enable_key_rotation=True,
            deletion_window_in_days=30,
            # The primary bucket is the one the FSx data repository association exports to.
            policy=account.apply(lambda a: key_policy(a, settings.region)),
            opts=pulumi.ResourceOptions.merge(pulumi.ResourceOptions(parent=self, provider=primary), keep),
        )
        self.replica = aws.kms.ReplicaKey(
            f"{name}-replica",
            description=f"{settings.name}: checkpoint replica",
            primary_key_arn=self.key.arn,
            deletion_window_in_days=30,
            # A standby stack's file system exports to the replica bucket after a failover.
            policy=account.apply(lambda a: key_policy(a, settings.replica_region)),
            opts=pulumi.ResourceOptions.merge(pulumi.ResourceOptions(parent=self, provider=replica), keep),
        )
        for key, provider, suffix in ((self.key, primary, "alias"), (self.replica, replica, "replica-alias")):
            aws.kms.Alias(
                f"{name}-{suffix}",
                name=f"alias/{settings.name}-checkpoints",
                target_key_id=key.key_id,
                opts=pulumi.ResourceOptions(parent=self, provider=provider),
            )
        self.register_outputs({"key_arn": self.key.arn, "replica_key_arn": self.replica.arn})
