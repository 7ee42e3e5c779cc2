"""A standby environment: what it shares with its home stack, and the two links it adds.

A stack with ``standbyOf: <home>`` runs in the home's replica region. It creates no
bucket and no key: the home's replica bucket, where replication already carries every
checkpoint, is its primary store, and the home's primary bucket is its replica. It
adds what a region of its own needs to train (network, registry, file system, node
groups at 0 nodes) and two links between the regions:

* **replication back**: the home's replica bucket replicates what is written to it
  directly to the home's primary bucket (S3 does not replicate a replica again, so
  the two rules never loop; only the region that holds the run lease writes);
* **the image**: the home region's registry replicates the trainer repository to this
  region (``standbyImageReplication: create``), so a failover pulls from its own region.

The home stack publishes what a standby needs as one output, :data:`OUTPUT`
(:func:`source_of`); the standby reads it through a StackReference and refuses, with
one line, a home whose regions, run or checkpoint prefix do not match its own
(infra/standby_source.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from ftfleet.infra import standby_source
from ftfleet.infra.aws import names
from ftfleet.infra.aws.bucket import replication_policy
from ftfleet.infra.settings import Settings

s3 = aws.s3
OUTPUT = standby_source.OUTPUT
#: What :data:`OUTPUT` holds on AWS, each a string.
FIELDS = (
    *standby_source.COMMON,
    "primary_bucket",
    "replica_bucket",
    "key_arn",
    "replica_key_arn",
    "repository_name",
)


def source_of(s: Settings, checkpoint_root: str, **outputs: pulumi.Input[str]) -> pulumi.Output[dict[str, str]]:
    """The home stack's :data:`OUTPUT`: its regions, run and checkpoint root, and the
    names and ARNs of ``outputs`` (primary_bucket, replica_bucket, key_arn,
    replica_key_arn, repository_name)."""
    return standby_source.publish(s, checkpoint_root, **outputs)


@dataclass(frozen=True)
class Home:
    """The home stack's :data:`OUTPUT`, checked against this standby's settings
    (:func:`ftfleet.infra.standby_source.checked`)."""

    stack: str
    region: str
    replica_region: str
    run_id: str
    checkpoint_root: str
    primary_bucket: str
    replica_bucket: str
    key_arn: str
    replica_key_arn: str
    repository_name: str

    @property
    def primary_bucket_arn(self) -> str:
        return f"arn:aws:s3:::{self.primary_bucket}"

    @property
    def replica_bucket_arn(self) -> str:
        return f"arn:aws:s3:::{self.replica_bucket}"


@dataclass(frozen=True)
class BucketRef:
    """A bucket another stack owns, by name: what the components read of a bucket."""

    bucket: pulumi.Output[str]
    arn: pulumi.Output[str]
    id: pulumi.Output[str]

    @classmethod
    def of(cls, name: pulumi.Output[str]) -> BucketRef:
        return cls(bucket=name, arn=name.apply(lambda n: f"arn:aws:s3:::{n}"), id=name)


def home_of(s: Settings, checkpoint_root: str) -> pulumi.Output[Home]:
    """The home stack's :data:`OUTPUT`, read through a StackReference and checked."""
    return standby_source.read(s, checkpoint_root, FIELDS).apply(lambda got: Home(**got))


class StandbyLinks(pulumi.ComponentResource):
    """The shared buckets as resources this stack reads (not owns), replication back to
    the home region, and (``create``) the home registry's replication to this region.

    ``here``: a provider in this stack's region (the home's replica region); ``home``:
    one in the home's region. ``image_after``: the repository here, which the registry's
    replication must find rather than create (ECR creates a missing destination
    repository with its own settings)."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        home: pulumi.Output[Home],
        here: aws.Provider,
        there: aws.Provider,
        image_after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:StandbyLinks", name, None, opts)
        assert settings.standby is not None
        o_here = pulumi.ResourceOptions(parent=self, provider=here)
        # Named, neither owned nor read: `pulumi destroy` of the standby leaves both
        # buckets alone, and the home stack's policies judge them.
        self.primary = BucketRef.of(home.apply(lambda h: h.replica_bucket))
        self.replica = BucketRef.of(home.apply(lambda h: h.primary_bucket))
        self.key_arn = home.apply(lambda h: h.replica_key_arn)
        self.replica_key_arn = home.apply(lambda h: h.key_arn)

        role = aws.iam.Role(
            f"{name}-replication",
            **names.generated("aws:iam/role:Role", f"{name}-replication"),
            description=f"{settings.name}: S3 replicates checkpoints back to {settings.replica_region}",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            opts=o_here,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-replication",
            **names.generated("aws:iam/rolePolicy:RolePolicy", f"{name}-replication"),
            role=role.id,
            policy=home.apply(
                lambda h: replication_policy(
                    h.replica_bucket_arn,
                    h.primary_bucket_arn,
                    h.replica_key_arn,
                    h.key_arn,
                    settings.region,
                    settings.replica_region,
                )
            ),
            opts=o_here,
        )
        # The home's rule copies everything, delete markers included, under RTC when the
        # home asks for it; the way back does the same for what the standby writes. The
        # home's storage_drift leaves this configuration alone (it restores the replica
        # bucket's settings but never its replication).
        destination: dict[str, Any] = dict(
            bucket=self.replica.arn,
            storage_class="STANDARD",
            encryption_configuration=s3.BucketReplicationConfigRuleDestinationEncryptionConfigurationArgs(
                replica_kms_key_id=self.replica_key_arn
            ),
            metrics=s3.BucketReplicationConfigRuleDestinationMetricsArgs(
                status="Enabled",
                event_threshold=s3.BucketReplicationConfigRuleDestinationMetricsEventThresholdArgs(minutes=15),
            ),
        )
        if settings.buckets.replication_time_control:
            destination["replication_time"] = s3.BucketReplicationConfigRuleDestinationReplicationTimeArgs(
                status="Enabled", time=s3.BucketReplicationConfigRuleDestinationReplicationTimeTimeArgs(minutes=15)
            )
        self.replication = s3.BucketReplicationConfig(
            f"{name}-replication-back",
            bucket=self.primary.id,
            role=role.arn,
            rules=[
                s3.BucketReplicationConfigRuleArgs(
                    id="back-to-home",
                    status="Enabled",
                    priority=1,
                    filter=s3.BucketReplicationConfigRuleFilterArgs(prefix=""),
                    delete_marker_replication=s3.BucketReplicationConfigRuleDeleteMarkerReplicationArgs(
                        status="Enabled"
                    ),
                    source_selection_criteria=s3.BucketReplicationConfigRuleSourceSelectionCriteriaArgs(
                        sse_kms_encrypted_objects=s3.BucketReplicationConfigRuleSourceSelectionCriteriaSseKmsEncryptedObjectsArgs(
                            status="Enabled"
                        )
                    ),
                    destination=s3.BucketReplicationConfigRuleDestinationArgs(**destination),
                )
            ],
            opts=pulumi.ResourceOptions(parent=self, provider=here, depends_on=[policy]),
        )

        self.image_replication = None
        if settings.standby.image_replication == "create":
            identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=there))
            # One replication configuration per registry and region (ECR API Reference,
            # PutReplicationConfiguration): this one replaces whatever the home region's
            # registry had, which is why `existing` exists.
            self.image_replication = aws.ecr.ReplicationConfiguration(
                f"{name}-image",
                replication_configuration=aws.ecr.ReplicationConfigurationReplicationConfigurationArgs(
                    rules=[
                        aws.ecr.ReplicationConfigurationReplicationConfigurationRuleArgs(
                            destinations=[
                                aws.ecr.ReplicationConfigurationReplicationConfigurationRuleDestinationArgs(
                                    region=settings.region, registry_id=identity.account_id
                                )
                            ],
                            repository_filters=[
                                aws.ecr.ReplicationConfigurationReplicationConfigurationRuleRepositoryFilterArgs(
                                    filter=home.apply(lambda h: h.repository_name), filter_type="PREFIX_MATCH"
                                )
                            ],
                        )
                    ]
                ),
                opts=pulumi.ResourceOptions(parent=self, provider=there, depends_on=list(image_after)),
            )
        self.register_outputs({"primary": self.primary.bucket, "replica": self.replica.bucket})
