"""The GCP part of `ftfleet plan`: the settings worth reading per resource type, and
the cost lines of the table."""

from __future__ import annotations

KEY_INPUTS: dict[str, tuple[str, ...]] = {
    "gcp:compute/network:Network": ("mtu", "routingMode"),
    "gcp:compute/subnetwork:Subnetwork": ("ipCidrRange", "privateIpGoogleAccess"),
    "gcp:compute/firewall:Firewall": ("direction", "sourceRanges", "sourceTags", "allows.*.protocol", "allows.*.ports"),
    "gcp:compute/globalAddress:GlobalAddress": ("purpose", "address", "prefixLength"),
    "gcp:compute/address:Address": ("addressType", "address"),
    "gcp:servicenetworking/connection:Connection": ("service",),
    "gcp:compute/routerNat:RouterNat": ("sourceSubnetworkIpRangesToNat",),
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate": (
        "machineType",
        "scheduling.provisioningModel",
        "scheduling.instanceTerminationAction",
        "scheduling.automaticRestart",
        "scheduling.preemptionNoticeDuration.seconds",
        "networkInterfaces.0.nicType",
        "guestAccelerators.*.type",
    ),
    "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager": (
        "targetSize",
        "distributionPolicyZones",
        "distributionPolicyTargetShape",
        "updatePolicy.minimalAction",
        "updatePolicy.replacementMethod",
        "instanceFlexibilityPolicy.instanceSelections.*.machineTypes",
    ),
    "gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig": ("preservedState.internalIps.*.interfaceName",),
    "gcp:compute/regionHealthCheck:RegionHealthCheck": ("tcpHealthCheck.port",),
    "gcp:lustre/instance:Instance": ("location", "capacityGib", "perUnitStorageThroughput"),
    "gcp:parallelstore/instance:Instance": ("location", "capacityGib", "deploymentType", "fileStripeLevel"),
    "gcp:storage/bucket:Bucket": (
        "location",
        "customPlacementConfig.dataLocations",
        "rpo",
        "versioning.enabled",
        "publicAccessPrevention",
        "uniformBucketLevelAccess",
    ),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("role",),
    "gcp:projects/iAMMember:IAMMember": ("role",),
    "gcp:artifactregistry/repository:Repository": ("format", "dockerConfig.immutableTags"),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": ("role",),
    "gcp:kms/cryptoKey:CryptoKey": ("rotationPeriod",),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": ("role",),
}


def spares_note(nodes: dict, fleet: dict) -> str:
    """The spareNodes part of a plan's fleet line (both clouds); empty without spares."""
    if not nodes.get("workers_spare"):
        return ""
    return f", {nodes['workers_spare']} of them spare (${fleet['spare_nodes']:,.2f}/hour)"


def cost_lines(est: dict) -> list[str]:
    fleet, storage, nodes = est["fleet_usd_per_hour"], est["storage_usd_per_month"], est["nodes"]
    return [
        "",
        f"Cost {est['label']}:",
        f"  fleet at desired size ({1 + nodes['workers_on_demand']} on-demand + {nodes['workers_spot']} Spot "
        f"nodes{spares_note(nodes, fleet)}, {nodes['gpus']} GPUs): ${fleet['with_spot']:,.2f}/hour with Spot vs "
        f"${fleet['all_on_demand']:,.2f}/hour all on-demand ({fleet['savings_percent']}% less)",
        f"  {storage['file_system_label']}: ${storage['file_system']:,.2f}/month; dual-region bucket: "
        f"${storage['buckets_per_tib_stored']:,.2f}/month per TiB of checkpoints (both regions, before "
        f"colder classes); replication ${est['replication_usd_per_tib_written']:,.2f} per TiB written",
    ]
