"""EC2 "Spot Instance Interruption Warning" and "Instance Rebalance Recommendation" for
the stack's nodes.

An interruption warning is recorded once per node: added to the interruption-rate
prior next to the checkpoints (contract.InterruptionPrior, a conditional write, so
duplicate and concurrent deliveries count once), counted as a ``SpotInterruptions``
metric per zone and instance type, and tagged on the instance. A rebalance
recommendation is advisory: the trainer already takes an early checkpoint when it
sees one, and acting on it (draining, launching) churns fleets
(aws-node-termination-handler #141, kops #14761), so this function only counts and
tags it. It never terminates, drains, launches or marks anything.

EventBridge cannot match these events by group (their detail holds only the instance
id), so the function looks the instance up and drops nodes of other groups.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ftfleet import contract
from ftfleet.lambdas.common import aws, eventbridge, events, runtime
from ftfleet.lambdas.common.events import Dropped
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.spot_interruption.config import INTERRUPTION, REBALANCE, Config

NAME = "spot_interruption"
ACTIONS = ("terminate", "stop", "hibernate")


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    env = eventbridge.parse(event, (INTERRUPTION, REBALANCE))
    instance_id = events.text(env.detail, "instance-id", "event.detail", eventbridge.INSTANCE_ID)
    action = None
    if (env.source, env.detail_type) == INTERRUPTION:
        action = events.text(env.detail, "instance-action", "event.detail")
        if action not in ACTIONS:
            raise Dropped(f"malformed event: event.detail.instance-action={action!r} is not one of {ACTIONS}")
    instance = aws.describe_instance(instance_id)
    if instance is None:
        raise Dropped("instance unknown to EC2", instance_id=instance_id)
    tags = aws.tags_of(instance)
    group = tags.get(aws.GROUP_TAG)
    if group not in cfg.groups:
        raise Dropped("instance of no group of this stack", instance_id=instance_id, group=group)
    zone = instance.get("Placement", {}).get("AvailabilityZone", "unknown")
    instance_type = instance.get("InstanceType", "unknown")
    where = {"instance_id": instance_id, "group": group, "zone": zone, "instance_type": instance_type}
    if action is None:
        return _rebalance(env, cfg, log, tags, where)
    return _interruption(env, cfg, log, action, where)


def _interruption(env: eventbridge.Envelope, cfg: Config, log: DecisionLog, action: str, where: dict) -> dict:
    key = f"{cfg.root}/{contract.INTERRUPTION_PRIOR_KEY}"
    seen = contract.Interruption(where["instance_id"], env.time, where["zone"], where["instance_type"])
    outcome: dict[str, Any] = {}

    def add(document: Any) -> tuple[Any, bool]:
        # Called once per attempt of the conditional write; the last call is what was written.
        prior, outcome["malformed"] = contract.InterruptionPrior("aws", cfg.run_id, time.time()), None
        if document is not None:
            try:
                prior = contract.InterruptionPrior.from_json(json.dumps(document))
            except contract.ContractError as exc:
                outcome["malformed"] = str(exc)
        new, outcome["added"] = prior.with_interruption(seen, time.time())
        outcome["prior"] = new
        return json.loads(new.to_json()), outcome["added"] or outcome["malformed"] is not None

    aws.update_json(cfg.bucket, key, add)
    if outcome["malformed"]:
        log.decision("prior-replaced", level="WARNING", key=key, reason=outcome["malformed"])
    _tag(where["instance_id"], contract.SPOT_INTERRUPTION_TAG, env.time)
    if not outcome["added"]:
        return log.decision("duplicate", kind="interruption", **where)
    _count("SpotInterruptions", cfg, where)
    prior: contract.InterruptionPrior = outcome["prior"]
    return log.decision(
        "recorded",
        kind="interruption",
        action=action,
        notice_at=events.iso(env.time),
        prior_key=key,
        job_mtbf_s=prior.mtbf_s(time.time()),
        **where,
    )


def _rebalance(env: eventbridge.Envelope, cfg: Config, log: DecisionLog, tags: dict, where: dict) -> dict:
    if contract.REBALANCE_TAG in tags:
        return log.decision("duplicate", kind="rebalance", tagged_at=tags[contract.REBALANCE_TAG], **where)
    _count("RebalanceRecommendations", cfg, where)
    _tag(where["instance_id"], contract.REBALANCE_TAG, env.time)
    return log.decision("recorded", kind="rebalance", notice_at=events.iso(env.time), **where)


def _count(metric: str, cfg: Config, where: dict) -> None:
    aws.put_metrics(
        [
            {
                "MetricName": metric,
                "Dimensions": aws.dims(
                    Stack=cfg.stack, AvailabilityZone=where["zone"], InstanceType=where["instance_type"]
                ),
                "Value": 1.0,
                "Unit": "Count",
            },
            {"MetricName": metric, "Dimensions": aws.dims(Stack=cfg.stack), "Value": 1.0, "Unit": "Count"},
        ]
    )


def _tag(instance_id: str, key: str, at: float) -> None:
    aws.client("ec2").create_tags(Resources=[instance_id], Tags=[{"Key": key, "Value": events.iso(at)}])


runtime.prime(Config)
