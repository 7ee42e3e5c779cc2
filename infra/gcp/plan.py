"""The GCP part of `ftfleet plan`: the settings worth reading per resource type, and
the cost lines of the table."""

from __future__ import annotations

from typing import Any

from ftfleet.infra.estimate import standby_lines

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
        "disks.0.sourceImage",
        "guestAccelerators.*.type",
    ),
    "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager": (
        "targetSize",
        "distributionPolicyZones",
        "distributionPolicyTargetShape",
        "updatePolicy.type",
        "updatePolicy.minimalAction",
        "updatePolicy.replacementMethod",
        "instanceFlexibilityPolicy.instanceSelections.*.machineTypes",
    ),
    "gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig": (
        "name",
        "preservedState.internalIps.*.interfaceName",
    ),
    "gcp:compute/regionHealthCheck:RegionHealthCheck": ("httpHealthCheck.port", "httpHealthCheck.requestPath"),
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
    "gcp:cloudfunctionsv2/function:Function": (
        "buildConfig.runtime",
        "buildConfig.serviceAccount",
        "serviceConfig.timeoutSeconds",
        "serviceConfig.ingressSettings",
    ),
    "gcp:pubsub/subscription:Subscription": ("ackDeadlineSeconds", "deadLetterPolicy.maxDeliveryAttempts"),
    "gcp:logging/projectSink:ProjectSink": ("filter",),
    "gcp:cloudscheduler/job:Job": ("schedule",),
    "gcp:monitoring/alertPolicy:AlertPolicy": (
        "conditions.*.conditionThreshold.thresholdValue",
        "conditions.*.conditionAbsent.duration",
    ),
    "gcp:monitoring/metricDescriptor:MetricDescriptor": ("type", "metricKind", "valueType"),
    "gcp:projects/iAMCustomRole:IAMCustomRole": ("permissions",),
    "gcp:serviceaccount/account:Account": ("accountId",),
    "gcp:projects/serviceIdentity:ServiceIdentity": ("service",),
    "gcp:logging/metric:Metric": ("name", "metricDescriptor.metricKind", "metricDescriptor.labels.*.key"),
}


def functions(rec: Any) -> list[dict[str, Any]]:
    """Each GCP remediation function with its push subscription (retries, dead-letter
    topic) and what feeds its topic (a log sink's filter or a schedule)."""
    urns = rec.by_urn()
    out = []
    for fn in rec.of_type("gcp:cloudfunctionsv2/function:Function"):
        subs = [s for s in rec.of_type("gcp:pubsub/subscription:Subscription") if fn.urn in s.deps("pushConfig")]
        triggers, dead, attempts = [], None, None
        for sub in subs:
            topic_urns = sub.deps("topic")
            policy = sub.inputs.get("deadLetterPolicy") or {}
            attempts = policy.get("maxDeliveryAttempts")
            dead = next((urns[u].inputs.get("name") for u in sub.deps("deadLetterPolicy") if u in urns), None)
            for sink in rec.of_type("gcp:logging/projectSink:ProjectSink"):
                if set(sink.deps("destination")) & set(topic_urns):
                    triggers.append({"log_sink": sink.inputs.get("name"), "filter": sink.inputs.get("filter")})
            for job in rec.of_type("gcp:cloudscheduler/job:Job"):
                if set(job.deps("pubsubTarget")) & set(topic_urns):
                    triggers.append({"schedule": job.inputs.get("schedule")})
        service = fn.inputs.get("serviceConfig") or {}
        out.append(
            {
                "function": str(fn.inputs.get("description", "")).split()[1]
                if fn.inputs.get("description")
                else fn.name,
                "name": fn.inputs.get("name"),
                "runtime": (fn.inputs.get("buildConfig") or {}).get("runtime"),
                "timeout": service.get("timeoutSeconds"),
                "dead_letter_queue": dead,
                "retries": attempts - 1 if isinstance(attempts, int) else None,
                "triggers": triggers,
            }
        )
    return out


def spares_note(nodes: dict, fleet: dict) -> str:
    """The spareNodes part of a plan's fleet line (both clouds); empty without spares."""
    if not nodes.get("workers_spare"):
        return ""
    return f", {nodes['workers_spare']} of them spare (${fleet['spare_nodes']:,.2f}/hour)"


def cost_lines(est: dict) -> list[str]:
    fleet, storage, nodes = est["fleet_usd_per_hour"], est["storage_usd_per_month"], est["nodes"]
    return [*_cost_lines(est, fleet, storage, nodes), *standby_lines(est.get("standby"), storage["file_system_label"])]


def _cost_lines(est: dict, fleet: dict, storage: dict, nodes: dict) -> list[str]:
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
