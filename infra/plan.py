"""`ftfleet plan STACK [--json]`: what a stack would create, offline, and what it costs.

Runs the real Pulumi program under mocks (infra/offline.py) with the stack's config.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pulumi

from ftfleet import contract
from ftfleet.errors import ConfigError
from ftfleet.infra import estimate, goodput, offline, stackfile
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
    "aws:lambda/function:Function": ("runtime", "timeout", "memorySize"),
    "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig": (
        "maximumRetryAttempts",
        "maximumEventAgeInSeconds",
    ),
    "aws:cloudwatch/eventRule:EventRule": ("description", "scheduleExpression"),
    "aws:cloudwatch/eventTarget:EventTarget": ("retryPolicy.maximumRetryAttempts",),
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("metricName", "comparisonOperator", "threshold"),
    "aws:cloudwatch/logGroup:LogGroup": ("retentionInDays",),
    "aws:sqs/queue:Queue": ("messageRetentionSeconds",),
    "aws:cloudtrail/trail:Trail": ("isMultiRegionTrail", "eventSelectors.0.readWriteType"),
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


def functions(rec: offline.Recording) -> list[dict[str, Any]]:
    """Each remediation function with its triggers, dead-letter queue, timeout and retries."""
    urns = rec.by_urn()
    out = []
    for fn in rec.of_type("aws:lambda/function:Function"):
        triggers = []
        for target in rec.of_type("aws:cloudwatch/eventTarget:EventTarget"):
            if fn.urn in target.deps("arn") and target.deps("rule"):
                rule = urns[target.deps("rule")[0]]
                pattern = rule.inputs.get("eventPattern")
                triggers.append(
                    {
                        "rule": rule.inputs.get("name"),
                        "event_pattern": json.loads(pattern) if isinstance(pattern, str) else None,
                        "schedule": rule.inputs.get("scheduleExpression"),
                    }
                )
        dlqs = [urns[u].inputs.get("name") for u in fn.deps("deadLetterConfig") if u in urns]
        invoke = [
            r.inputs
            for r in rec.of_type("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")
            if fn.urn in r.deps("functionName")
        ]
        out.append(
            {
                "function": str(fn.inputs.get("handler", "")).split(".")[2] if fn.inputs.get("handler") else fn.name,
                "name": fn.inputs.get("name"),
                "runtime": fn.inputs.get("runtime"),
                "timeout": fn.inputs.get("timeout"),
                "dead_letter_queue": dlqs[0] if dlqs else None,
                "retries": invoke[0].get("maximumRetryAttempts") if invoke else None,
                "triggers": triggers,
            }
        )
    return out + gcp_plan.functions(rec)


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
                "protect": r.protect,
                # What it waits for (depends_on and inputs), by name.
                "dependencies": sorted({names[u] for u in r.dependencies if u in names}),
                "inputs": r.inputs,
            }
            for r in rec.resources
        ],
        "outputs": rec.outputs,
        "functions": functions(rec),
        "estimate": est,
    }


def function_lines(fns: list[dict[str, Any]]) -> list[str]:
    """The plan's lines about the remediation functions (none: no lines)."""
    if not fns:
        return []
    lines = ["Remediation functions:"]
    for f in fns:
        on = ", ".join(t.get("schedule") or t.get("rule") or f"log sink {t['log_sink']}" for t in f["triggers"])
        lines.append(
            f"  {f['function']}: {f['runtime']}, timeout {f['timeout']} s, {f['retries']} retries, "
            f"dead letters to {f['dead_letter_queue']}; triggered by {on}"
        )
    return [*lines, ""]


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
    prediction = [*goodput.lines(est["goodput"]), ""] if est.get("goodput") else []
    if est.get("cloud") == "gcp":
        lines += [*gcp_plan.cost_lines(est), "", *prediction, *function_lines(functions(rec)), "Outputs:"]
        return "\n".join(lines + [f"  {k}: {v}" for k, v in rec.outputs.items()])
    fleet, storage, nodes = est["fleet_usd_per_hour"], est["storage_usd_per_month"], est["nodes"]
    spares_note = gcp_plan.spares_note
    repl, net = est["replication_usd_per_tib_written"], est["network_usd_per_month"]
    lines += [
        "",
        f"Cost {est['label']}:",
        f"  fleet at desired size ({1 + nodes['workers_on_demand']} on-demand + {nodes['workers_spot']} spot "
        f"nodes{spares_note(nodes, fleet)}, {nodes['gpus']} GPUs): ${fleet['with_spot']:,.2f}/hour with spot vs "
        f"${fleet['all_on_demand']:,.2f}/hour all on-demand ({fleet['savings_percent']}% less), "
        f"root volumes ${fleet['root_volumes']:,.2f}/hour of that",
        f"  FSx for Lustre: ${storage['fsx']:,.2f}/month; buckets: ${storage['buckets_per_tib_stored']:,.2f}"
        "/month per TiB of checkpoints (primary + replica, before tiering)",
        f"  replication: ${repl['total']:,.2f} per TiB of checkpoints written (inter-region transfer "
        f"${repl['inter_region_transfer']:,.2f} + RTC ${repl['replication_time_control']:,.2f})",
        f"  NAT gateway: ${net['nat_gateway']:,.2f}/month + ${net['nat_per_gib_processed']:,.3f}/GiB processed "
        "(image pulls; checkpoints go through the free S3 endpoint)",
        "  assuming: " + "; ".join(est["assumptions"]),
        "",
    ]
    lines[-1:-1] = estimate.standby_lines(est.get("standby"), "FSx", "NAT gateway")
    lines += prediction
    lines += function_lines(functions(rec))
    lines.append("Outputs:")
    lines += [f"  {k}: {v}" for k, v in rec.outputs.items()]
    return "\n".join(lines)


def previous_outputs(path: str | None) -> dict[str, Any] | None:
    """The stack's outputs from its last deployment (`pulumi stack output --json`)."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--previous-outputs {path}: not a JSON file of stack outputs ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--previous-outputs {path}: expected a JSON object, as `pulumi stack output --json` prints")
    return data


def plan(
    target: str,
    previous: dict[str, Any] | None = None,
    job: dict[str, Any] | None = None,
    other_stacks: dict[str, dict[str, Any]] | None = None,
) -> tuple[offline.Recording, dict]:
    """The recording and the estimate; with ``job`` (goodput.predict's keywords, at
    least ``state_gib``) the estimate's ``goodput`` holds the prediction.
    ``other_stacks``: outputs of stacks already planned, by name (a standby's home is
    then not run again)."""
    stack = stackfile.load(target)
    try:
        rec = offline.run(stack, previous_outputs=previous, other_stacks=other_stacks)
    except pulumi.RunError as exc:  # the program refused (e.g. a change that would replace a bucket)
        raise ConfigError(str(exc)) from None
    settings = stack.settings()
    est = estimate.estimate(settings)
    if job:
        est["goodput"] = goodput.predict(settings, est, **job)
    return rec, est


def job_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """What the command line says of the job, for the goodput prediction (None: no
    --state-gib, no prediction)."""
    if args.state_gib is None:
        for flag in ("restart_s", "checkpoint_s", "spot_monthly_share", "spot_advisor", "observed"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} needs --state-gib: the model and optimizer state in GiB")
        return None
    job: dict[str, Any] = {"state_gib": args.state_gib}
    if args.restart_s is not None:
        job["restart_s"] = args.restart_s
    if args.checkpoint_s is not None:
        job["checkpoint_s"] = args.checkpoint_s
    if args.spot_monthly_share is not None:
        job["monthly_share"] = args.spot_monthly_share
    if args.spot_advisor is not None:
        job["advisor"] = Path(args.spot_advisor)
    if args.observed is not None:
        if args.spot_monthly_share is not None or args.spot_advisor is not None:
            raise ConfigError(
                "--observed: the fleet's own rate replaces --spot-monthly-share and --spot-advisor; give one"
            )
        job["observed"] = Path(args.observed)
    return job


def run(args: argparse.Namespace) -> int:
    targets = stackfile.stack_names() if args.all else [args.stack]
    if not targets or targets == [None]:
        raise SystemExit("ftfleet plan: give a STACK or --all")
    previous = previous_outputs(getattr(args, "previous_outputs", None))
    job = job_of(args)
    planned: dict[str, dict[str, Any]] = {}
    for i, target in enumerate(targets):
        rec, est = plan(target, previous, job, planned)
        planned[rec.stack] = rec.outputs
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
    p.add_argument(
        "--previous-outputs",
        metavar="FILE",
        help="the deployed stack's outputs (`pulumi stack output --json`): refuse changes that would replace data",
    )
    g = p.add_argument_group("goodput prediction (infra/goodput.py)")
    g.add_argument("--state-gib", type=float, help="the job's model and optimizer state, in GiB: predict goodput")
    g.add_argument(
        "--restart-s",
        type=float,
        help=f"seconds from a failure to training again (default {goodput.DEFAULT_RESTART_S:g})",
    )
    g.add_argument(
        "--checkpoint-s", type=float, help="a save's cost in seconds, instead of state / fast-tier throughput"
    )
    g.add_argument("--spot-monthly-share", type=float, help="share of spot nodes interrupted in a month (0.05)")
    g.add_argument("--spot-advisor", metavar="FILE", help="the Spot Instance Advisor's JSON (AWS): each type's band")
    g.add_argument(
        "--observed",
        metavar="FILE",
        help=f"the fleet's interruption record (<checkpoint_uri>/{contract.INTERRUPTION_PRIOR_KEY}): its own rate",
    )
    p.set_defaults(func=run)
