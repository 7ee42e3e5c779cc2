"""Which project keys a GCP stack reads, and the one-line refusal of the others.

Pulumi.yaml holds every key of both clouds in one namespace. A key that only one cloud
reads, set on a stack of the other, would be silently ignored; instead it is refused,
naming the key and what to do. GCP-only keys are recognised by their prefix, so a key
added for GCP is GCP-only by its name; the keys GCP shares with AWS are listed here,
so a key added later for AWS is AWS-only unless someone adds it below.
"""

from __future__ import annotations

from collections.abc import Iterable

from ftfleet.errors import ConfigError

PROJECT = "ftfleet"

#: A key with one of these prefixes applies to GCP stacks only.
GCP_PREFIXES = ("gcp", "gcs", "lustre", "parallelstore")

#: Keys both clouds read.
SHARED = frozenset(
    {
        "cloud",
        "replicaRegion",
        "availabilityZones",
        "vpcCidr",
        "coordinatorInstanceType",
        "workerInstanceTypes",
        "workerMinSize",
        "workerMaxSize",
        "workerDesiredSize",
        "onDemandBaseCapacity",
        "spareNodes",
        "rootVolumeGiB",
        "checkpointPrefix",
        "pinnedPrefix",
        "expireCheckpointsDays",
        "noncurrentVersionExpiryDays",
        "remediationSpotInterruption",
        "remediationUnhealthyNodes",
        "remediationStorageDrift",
        "remediationReplicationLag",
        "replicationLagAlarmSeconds",
        "remediationRetentionSweep",
        "remediationCapacityWatch",
        "capacityLossMinutes",
        "checkpointRetention",
        "unhealthyNodeGraceSeconds",
        "trainerImageTag",
        "trainerConfig",
        "trainerLauncher",
        "runId",
        "tags",
        "standbyOf",
        "standbyFastTier",
        "standbyActive",
        "standbyAutoFailover",
    }
)

#: AWS keys with a GCP counterpart, named in the refusal.
GCP_EQUIVALENT = {
    "fsxStorageCapacityGiB": "lustreCapacityGiB or parallelstoreCapacityGiB",
    "fsxThroughputPerTiB": "lustreThroughputPerTiB",
    "fsxMountPoint": "gcpMountPoint",
    "transitionToIaDays": "gcsNearlineDays",
    "transitionToGlacierDays": "gcsColdlineDays",
    "replicationTimeControl": "gcsTurboReplication",
    "imageId": "gcpImage",
    "imageSsmParameter": "gcpImage",
    "onDemandPercentAboveBase": "gcpWorkerProvisioningModel",
}


def is_gcp_only(key: str) -> bool:
    return key.startswith(GCP_PREFIXES)


def refuse_on_gcp(keys: Iterable[str]) -> None:
    """A GCP stack sets only shared and GCP keys."""
    for key in sorted(keys):
        if key not in SHARED and not is_gcp_only(key):
            hint = GCP_EQUIVALENT.get(key)
            fix = f"; the GCP setting is ftfleet:{hint}" if hint else ""
            raise ConfigError(f"{PROJECT}:{key} applies to aws stacks only; remove it from this gcp stack{fix}")


def refuse_on_aws(keys: Iterable[str]) -> None:
    """An AWS stack sets no GCP key."""
    for key in sorted(keys):
        if is_gcp_only(key):
            raise ConfigError(f"{PROJECT}:{key} applies to gcp stacks only; remove it from this aws stack")
