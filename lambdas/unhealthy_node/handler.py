"""Scheduled sweep: a node whose trainer stopped making progress is marked Unhealthy in
its group, which replaces it.

Per node it reads the trainer's own metrics (contract.PROGRESS_METRIC and
contract.GPU_ERRORS_METRIC, dimensions RunId and NodeId) over the last
FTFLEET_GRACE_S seconds. A node is judged only when it is InService and Healthy and was
launched more than the grace period ago (booting, pulling the image and restoring are
not a stall), and only once some node of the run has ever published progress (a trainer
that does not publish is not a fleet of dead nodes). Then:

* GPU errors in the window: replace (broken hardware, whatever the others do);
* no progress (no data, or a sum of 0): replace, unless more than half of the judged
  nodes (and at least two) are stalled at once: that is the job (rendezvous, data, a
  restore) and not the nodes, and replacing them would only churn the fleet;
* no data at all from a node that has never published (CloudWatch lists no metric of
  it): withheld (``never-published``), never replaced. A trainer that cannot publish
  (its heartbeat turned off, a denied or unreachable ``PutMetricData``) may well be
  training; only a node that published and then went silent, or that reports 0 steps,
  has shown that it stopped. It still counts towards a fleet-wide stall. (A new
  metric can take minutes to be listed: in doubt, the node is withheld.)
* never more than FTFLEET_MAX_REPLACEMENTS_PER_HOUR per group in any hour: each
  replacement is first reserved in ``<root>/fleet/replacements.json`` with a conditional
  write, so concurrent sweeps cannot exceed the limit; a node over the limit is withheld
  and counted (``ReplacementsWithheld``), for a human to look at.

Instances that are already terminating, pending or in standby are ignored. Marking an
already marked node again is harmless and does not use the budget. It never terminates
an instance itself, never changes a group's size, never touches another stack's group.

Why a sweep and not one CloudWatch alarm per node: nodes come and go with the spot
market, so such alarms would be created and deleted at runtime, outside the program
(and left behind when the function is switched off); and an alarm on missing data fires
on a node that is still booting, which the sweep knows from its launch time.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from ftfleet import contract
from ftfleet.lambdas.common import aws, eventbridge, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.unhealthy_node.config import REPLACEMENTS_KEY, Config

NAME = "unhealthy_node"
HOUR_S = 3600.0

clock = runtime.Clock()


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    eventbridge.parse(event, (eventbridge.SCHEDULED,))
    now = clock.now()
    nodes = _in_service(cfg, now)
    if not nodes:
        return log.decision("swept", judged=0, reason="no InService node launched more than the grace period ago")
    published = _published_nodes(cfg)
    if not published:
        return log.decision(
            "not-judged",
            judged=0,
            reason=f"no node of run {cfg.run_id} has ever published {contract.PROGRESS_METRIC.name}",
        )
    steps, gpu_errors = _node_sums(cfg, [n["instance_id"] for n in nodes], now)
    stalled = [n for n in nodes if not steps.get(n["instance_id"])]
    faulty = [n for n in nodes if gpu_errors.get(n["instance_id"])]
    fleet_stalled = len(stalled) >= 2 and 2 * len(stalled) > len(nodes)
    aws.put_metrics(
        [{"MetricName": "NodesWithoutProgress", "Dimensions": aws.dims(Stack=cfg.stack), "Value": float(len(stalled))}]
    )
    replaced, withheld = [], []
    for node in faulty:
        (replaced if _replace(cfg, log, node, "gpu-errors", now) else withheld).append(node["instance_id"])
    for node in stalled:
        if node in faulty:
            continue
        if fleet_stalled:
            _withhold(cfg, log, node, "fleet-stalled", stalled=len(stalled), judged=len(nodes))
            withheld.append(node["instance_id"])
        elif node["instance_id"] not in published:
            _withhold(cfg, log, node, "never-published", metric=contract.PROGRESS_METRIC.name)
            withheld.append(node["instance_id"])
        elif _replace(cfg, log, node, "no-progress", now):
            replaced.append(node["instance_id"])
        else:
            withheld.append(node["instance_id"])
    return log.decision(
        "swept",
        judged=len(nodes),
        stalled=[n["instance_id"] for n in stalled],
        gpu_errors=[n["instance_id"] for n in faulty],
        fleet_stalled=fleet_stalled,
        replaced=replaced,
        withheld=withheld,
    )


def _in_service(cfg: Config, now: float) -> list[dict[str, Any]]:
    """InService, Healthy instances of the stack's groups launched before the grace period."""
    asg = aws.client("autoscaling")
    nodes = []
    for page in asg.get_paginator("describe_auto_scaling_groups").paginate(AutoScalingGroupNames=list(cfg.groups)):
        for group in page["AutoScalingGroups"]:
            if group["AutoScalingGroupName"] not in cfg.groups:
                continue
            for inst in group.get("Instances", []):
                if inst.get("LifecycleState") == "InService" and inst.get("HealthStatus") == "Healthy":
                    nodes.append({"instance_id": inst["InstanceId"], "group": group["AutoScalingGroupName"]})
    if not nodes:
        return []
    launched = {}
    ec2 = aws.client("ec2")
    ids = [n["instance_id"] for n in nodes]
    for start in range(0, len(ids), 200):
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": ids[start : start + 200]}]
        )
        for page in pages:
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    launched[inst["InstanceId"]] = inst["LaunchTime"].timestamp()
    return [n for n in nodes if n["instance_id"] in launched and launched[n["instance_id"]] <= now - cfg.grace_s]


def _published_nodes(cfg: Config) -> set[str]:
    """NodeIds of the run that have ever published progress (empty: the run does not)."""
    nodes = set()
    pages = (
        aws.client("cloudwatch")
        .get_paginator("list_metrics")
        .paginate(
            Namespace=contract.METRICS_NAMESPACE,
            MetricName=contract.PROGRESS_METRIC.name,
            Dimensions=[{"Name": "RunId", "Value": cfg.run_id}],
        )
    )
    for page in pages:
        for metric in page.get("Metrics", []):
            nodes.update(d["Value"] for d in metric.get("Dimensions", []) if d.get("Name") == "NodeId")
    return nodes


def _node_sums(cfg: Config, ids: list[str], now: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per node: progress and GPU errors summed over the grace window (absent: no data)."""
    queries, owner = [], {}
    for i, node_id in enumerate(ids):
        for prefix, metric in (("s", contract.PROGRESS_METRIC), ("g", contract.GPU_ERRORS_METRIC)):
            qid = f"{prefix}{i}"
            owner[qid] = (prefix, node_id)
            queries.append(
                {
                    "Id": qid,
                    "MetricStat": {
                        "Metric": {
                            "Namespace": contract.METRICS_NAMESPACE,
                            "MetricName": metric.name,
                            "Dimensions": metric.dimensions(cfg.run_id, node_id),
                        },
                        "Period": contract.NODE_METRIC_PERIOD_S,
                        "Stat": "Sum",
                    },
                    "ReturnData": True,
                }
            )
    sums: dict[str, dict[str, float]] = {"s": {}, "g": {}}
    cw = aws.client("cloudwatch")
    start = datetime.datetime.fromtimestamp(now - cfg.grace_s, datetime.UTC)
    end = datetime.datetime.fromtimestamp(now, datetime.UTC)
    for first in range(0, len(queries), 500):
        for page in cw.get_paginator("get_metric_data").paginate(
            MetricDataQueries=queries[first : first + 500], StartTime=start, EndTime=end
        ):
            for result in page["MetricDataResults"]:
                prefix, node_id = owner[result["Id"]]
                if result.get("Values"):
                    sums[prefix][node_id] = sums[prefix].get(node_id, 0.0) + sum(result["Values"])
    return sums["s"], sums["g"]


def _replace(cfg: Config, log: DecisionLog, node: dict[str, Any], reason: str, now: float) -> bool:
    """Reserve a replacement in the group's hourly budget, then mark the node Unhealthy."""
    group, instance_id = node["group"], node["instance_id"]
    verdict: dict[str, Any] = {}

    def reserve(document: Any) -> tuple[Any, bool]:
        groups, verdict["dropped"] = recent_entries(document, now)
        recent = groups.setdefault(group, [])
        verdict["used"] = len(recent)
        if any(e.get("instance_id") == instance_id for e in recent):
            verdict["outcome"] = "again"
            return {"groups": groups}, False
        if len(recent) >= cfg.max_per_hour:
            verdict["outcome"] = "rate-limited"
            return {"groups": groups}, False
        recent.append({"instance_id": instance_id, "at": now, "reason": reason})
        verdict["outcome"] = "reserved"
        return {"groups": groups}, True

    key = f"{cfg.root}/{REPLACEMENTS_KEY}"
    aws.update_json(cfg.bucket, key, reserve)
    if verdict["dropped"]:
        log.decision("replacement-log-repaired", level="WARNING", key=key, dropped=verdict["dropped"])
    if verdict["outcome"] == "rate-limited":
        _withhold(cfg, log, node, "rate-limited", reason_seen=reason, used=verdict["used"], limit=cfg.max_per_hour)
        return False
    aws.client("autoscaling").set_instance_health(
        InstanceId=instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=True
    )
    _count(cfg, "NodesReplaced", reason)
    log.decision(
        "replaced",
        reason=reason,
        instance_id=instance_id,
        group=group,
        again=verdict["outcome"] == "again",
        used_this_hour=verdict["used"] + (verdict["outcome"] == "reserved"),
        limit=cfg.max_per_hour,
    )
    return True


def recent_entries(document: Any, now: float) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """The replacement log's entries of the last hour by group, and how many entries
    were dropped as malformed. Nodes can write the run's prefix, so the log is
    untrusted: an entry that is not ``{"instance_id": str, "at": finite seconds, ...}``
    (not after ``now``) counts for nothing and is left out of the next write, instead
    of blocking every later sweep."""
    log_doc = document if isinstance(document, dict) and isinstance(document.get("groups"), dict) else {}
    groups: dict[str, list[dict[str, Any]]] = {}
    dropped = 1 if document is not None and not log_doc else 0  # not a log at all
    for name, entries in log_doc["groups"].items() if log_doc else ():
        if not isinstance(entries, list):
            dropped += 1
            continue
        kept = []
        for e in entries:
            at = e.get("at") if isinstance(e, dict) else None
            valid = (
                isinstance(e, dict)
                and isinstance(e.get("instance_id"), str)
                and isinstance(at, (int, float))
                and not isinstance(at, bool)
                and math.isfinite(at)
                and at <= now + 60.0
            )
            if not valid:
                dropped += 1
            elif now - at < HOUR_S:
                kept.append(e)
        groups[name] = kept
    return groups, dropped


def _withhold(cfg: Config, log: DecisionLog, node: dict[str, Any], why: str, **fields: Any) -> None:
    _count(cfg, "ReplacementsWithheld", why)
    log.decision(
        "withheld", level="WARNING", reason=why, instance_id=node["instance_id"], group=node["group"], **fields
    )


def _count(cfg: Config, metric: str, reason: str) -> None:
    """One count with the reason and one without (what the stack's alarm watches)."""
    aws.put_metrics(
        [
            {"MetricName": metric, "Dimensions": dims, "Value": 1.0, "Unit": "Count"}
            for dims in (aws.dims(Stack=cfg.stack, Reason=reason), aws.dims(Stack=cfg.stack))
        ]
    )


runtime.prime(Config)
