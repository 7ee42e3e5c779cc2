"""`ftfleet plan STACK [--json]`: what a stack would create, offline, and what it costs.

Runs the real Pulumi program under mocks (infra/offline.py) with the stack's config.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ftfleet.infra import estimate, offline, stackfile
from ftfleet.infra.gcp import plan as gcp_plan

# The settings worth reading in a review, per resource type (paths into the inputs).
KEY_INPUTS: dict[str, tuple[str, ...]] = {
    "aws:s3/bucket:Bucket": ("objectLockEnabled", "forceDestroy"),
    "aws:s3/bucketVersioning:BucketVersioning": ("versioningConfiguration.status",),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "rules.0.applyServerSideEncryptionByDefault.sseAlgorithm",
    ),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": (
        "blockPublicAcls",
        "blockPublicPolicy",
        "ignorePublicAcls",
        "restrictPublicBuckets",
    ),
    "aws:s3/bucketReplicationConfig:BucketReplicationConfig": (
        "rules.0.destination.replicationTime.status",
        "rules.0.deleteMarkerReplication.status",
    ),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": ("rules.*.id",),
    "aws:fsx/lustreFileSystem:LustreFileSystem": (
        "deploymentType",
        "storageCapacity",
        "perUnitStorageThroughput",
        "dataCompressionType",
    ),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": ("fileSystemPath", "s3.autoExportPolicy.events"),
    "aws:ec2/launchTemplate:LaunchTemplate": (
        "instanceType",
        "metadataOptions.httpTokens",
        "networkInterfaces.0.interfaceType",
    ),
    "aws:autoscaling/group:Group": (
        "minSize",
        "maxSize",
        "desiredCapacity",
        "mixedInstancesPolicy.instancesDistribution.onDemandBaseCapacity",
        "mixedInstancesPolicy.instancesDistribution.onDemandPercentageAboveBaseCapacity",
        "mixedInstancesPolicy.instancesDistribution.spotAllocationStrategy",
        "mixedInstancesPolicy.launchTemplate.overrides.*.instanceType",
        "capacityRebalance",
    ),
    "aws:autoscaling/lifecycleHook:LifecycleHook": ("lifecycleTransition", "heartbeatTimeout"),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": ("ipProtocol", "fromPort", "toPort"),
    "aws:ec2/vpc:Vpc": ("cidrBlock",),
    "aws:ec2/subnet:Subnet": ("cidrBlock", "availabilityZone"),
    "aws:ecr/repository:Repository": ("imageTagMutability", "imageScanningConfiguration.scanOnPush"),
    "aws:kms/key:Key": ("multiRegion", "enableKeyRotation"),
    "aws:ec2/placementGroup:PlacementGroup": ("strategy",),
}

KEY_INPUTS.update(gcp_plan.KEY_INPUTS)


def _lookup(data: Any, path: str) -> Any:
    head, _, rest = path.partition(".")
    if head == "*" and isinstance(data, list):
        return [_lookup(item, rest) if rest else item for item in data]
    if isinstance(data, list) and head.isdigit():
        data = data[int(head)] if int(head) < len(data) else None
    elif isinstance(data, dict):
        data = data.get(head)
    else:
        return None
    return _lookup(data, rest) if rest and data is not None else data


def _short(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_short(v) for v in value if v is not None)
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def summary(r: offline.Resource) -> str:
    parts = []
    for path in KEY_INPUTS.get(r.type, ()):
        value = _lookup(r.inputs, path)
        if value not in (None, [], ""):
            label = [seg for seg in path.split(".") if seg != "*" and not seg.isdigit()][-1]
            parts.append(f"{label}={_short(value)}")
    return " ".join(parts)


def as_json(rec: offline.Recording, est: dict) -> dict:
    names = {r.urn: r.name for r in rec.resources}
    return {
        "stack": rec.stack,
        "resources": [
            {
                "type": r.type,
                "name": r.name,
                "parent": names.get(r.parent) if r.parent else None,
                "provider": names.get(r.provider) if r.provider else None,
                "region": rec.region_of(r),
                "inputs": r.inputs,
            }
            for r in rec.resources
        ],
        "outputs": rec.outputs,
        "estimate": est,
    }


def render_table(rec: offline.Recording, est: dict) -> str:
    custom = [r for r in rec.resources if r.custom and not r.type.startswith("pulumi:providers:")]
    rows = [(r.type.split(":")[-1], r.name, rec.region_of(r) or "global", summary(r)) for r in custom]
    widths = [max(len(row[i]) for row in rows + [("TYPE", "NAME", "REGION", "")]) for i in range(3)]
    lines = [
        f"Stack {rec.stack}: {len(custom)} resources in {len(rec.resources) - len(custom)} "
        "components and providers (offline plan: nothing was created)",
        "",
    ]
    lines.append(f"{'TYPE':<{widths[0]}}  {'NAME':<{widths[1]}}  {'REGION':<{widths[2]}}  SETTINGS")
    lines += [f"{t:<{widths[0]}}  {n:<{widths[1]}}  {g:<{widths[2]}}  {s}" for t, n, g, s in rows]
    if est.get("cloud") == "gcp":
        lines += [*gcp_plan.cost_lines(est), "", "Outputs:"]
        return "\n".join(lines + [f"  {k}: {v}" for k, v in rec.outputs.items()])
    fleet, storage, nodes = est["fleet_usd_per_hour"], est["storage_usd_per_month"], est["nodes"]
    lines += [
        "",
        f"Cost {est['label']}:",
        f"  fleet at desired size ({1 + nodes['workers_on_demand']} on-demand + {nodes['workers_spot']} spot "
        f"nodes, {nodes['gpus']} GPUs): ${fleet['with_spot']:,.2f}/hour with spot vs "
        f"${fleet['all_on_demand']:,.2f}/hour all on-demand ({fleet['savings_percent']}% less)",
        f"  FSx for Lustre: ${storage['fsx']:,.2f}/month; buckets: ${storage['buckets_per_tib_stored']:,.2f}"
        "/month per TiB of checkpoints (primary + replica, before tiering)",
        "",
        "Outputs:",
    ]
    lines += [f"  {k}: {v}" for k, v in rec.outputs.items()]
    return "\n".join(lines)


def plan(target: str) -> tuple[offline.Recording, dict]:
    stack = stackfile.load(target)
    rec = offline.run(stack)
    return rec, estimate.estimate(stack.settings())


def run(args: argparse.Namespace) -> int:
    targets = stackfile.stack_names() if args.all else [args.stack]
    if not targets or targets == [None]:
        raise SystemExit("ftfleet plan: give a STACK or --all")
    for i, target in enumerate(targets):
        rec, est = plan(target)
        if args.json:
            print(json.dumps(as_json(rec, est), indent=None if args.all else 2, sort_keys=False))
        else:
            print(("\n" if i else "") + render_table(rec, est))
    sys.stdout.flush()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="show what a stack would create and cost (offline, no account)", description=__doc__.split("\n")[0]
    )
    p.add_argument("stack", nargs="?", help="stack name in stacks/ (e.g. aws-dev) or a path to a stack file")
    p.add_argument("--all", action="store_true", help="plan every stack in stacks/")
    p.add_argument("--json", action="store_true", help="one JSON object per stack instead of the table")
    p.set_defaults(func=run)
