"""Preemption accounting: a Spot VM of the stack was preempted.

The stack's log sink routes Compute Engine's ``compute.instances.preempted`` system
events of its instances to the function's topic; each message is a LogEntry. The
function adds the preemption, once per instance, to the interruption prior next to the
checkpoints (``<root>/fleet/interruptions.json``, a generation-conditional write), from
which the trainer's adaptive checkpoint interval takes its MTBF prior, exactly as the
AWS spot_interruption function does. Its ``recorded`` decision line (once per
preemption: a redelivery is a ``duplicate``) carries the zone and machine type, and
the stack's log-based metric counts those lines per interval. Nothing writes a time
series point per preemption: Cloud Monitoring refuses a second point to one series
within its sampling period, so a wave of preemptions in one zone would lose points,
while Cloud Logging counts every line.

It never recreates, deletes or resizes anything: the managed instance group recreates
the VM.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ftfleet import contract
from ftfleet.lambdas.common import events, gcp, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.gcp_preemption.config import COUNTED, PREEMPTED_METHOD, Config

NAME = "gcp_preemption"
RESOURCE = re.compile(r"projects/(?P<project>[^/]+)/zones/(?P<zone>[a-z0-9-]+)/instances/(?P<name>[a-z][a-z0-9-]*)")

clock = runtime.Clock()


def handler(cloud_event: Any, context: Any = None) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, cloud_event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    entry, _ = gcp.message(event)
    entry = events.mapping(entry, "log entry")
    payload = events.mapping(entry.get("protoPayload"), "log entry.protoPayload")
    method = events.text(payload, "methodName", "protoPayload")
    if method != PREEMPTED_METHOD:
        raise events.Dropped(f"not a preemption: methodName {method[:80]!r}")
    resource = events.text(payload, "resourceName", "protoPayload")
    found = RESOURCE.search(resource)
    if not found:
        raise events.Dropped(f"malformed event: protoPayload.resourceName {resource[:120]!r} names no instance")
    zone, name = found["zone"], found["name"]
    if found["project"] != cfg.project:  # the same instance names can exist in any project
        raise events.Dropped("instance of another project", instance=name, project=found["project"][:80])
    prefix = next((p for p in cfg.prefixes if name.startswith(f"{p}-") and "-" not in name[len(p) + 1 :]), None)
    if prefix is None:
        raise events.Dropped("instance of another stack", instance=name, zone=zone)
    resource_of = events.mapping(entry.get("resource") or {}, "log entry.resource")
    labels = events.mapping(resource_of.get("labels") or {}, "log entry.resource.labels")
    instance_id = str(labels.get("instance_id") or name)
    at = events.timestamp(entry, "timestamp", "log entry")
    where = {
        "instance": name,
        "instance_id": instance_id,
        "zone": zone,
        "machine_type": cfg.machine_types.get(prefix, ""),
    }

    key = f"{cfg.root}/{contract.INTERRUPTION_PRIOR_KEY}"
    seen = contract.Interruption(instance_id, at, zone, where["machine_type"])
    outcome: dict[str, Any] = {}

    def add(document: Any) -> tuple[Any, bool]:
        # Called once per attempt of the conditional write; the last call is what was written.
        prior, outcome["malformed"] = contract.InterruptionPrior("gcp", cfg.run_id, clock.now()), None
        if document is not None:
            try:
                prior = contract.InterruptionPrior.from_json(json.dumps(document))
            except contract.ContractError as exc:
                outcome["malformed"] = str(exc)
        new, outcome["added"] = prior.with_interruption(seen, clock.now())
        outcome["prior"] = new
        return json.loads(new.to_json()), outcome["added"] or outcome["malformed"] is not None

    gcp.update_json(cfg.bucket, key, add)
    if outcome["malformed"]:
        log.decision("prior-replaced", level="WARNING", key=key, reason=outcome["malformed"])
    if not outcome["added"]:
        return log.decision("duplicate", **where)
    prior: contract.InterruptionPrior = outcome["prior"]
    # This line is the count: the stack's log-based metric counts COUNTED decisions per
    # zone and machine type (config.COUNT_LABELS).
    return log.decision(
        COUNTED,
        preempted_at=events.iso(at),
        prior_key=key,
        job_mtbf_s=prior.mtbf_s(clock.now()),
        **where,
    )


runtime.prime(Config)
