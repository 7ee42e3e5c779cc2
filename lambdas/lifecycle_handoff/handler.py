"""EC2 Instance-terminate Lifecycle Action of the stack's groups: hold the node exactly as
long as its emergency checkpoint takes.

The node itself completes the action (CONTINUE) right after it writes its commit marker
(contract.CommitMarker, at ``<root>/markers/<instance id>.json``). This function is the
backstop, for a node that cannot: it sends ``RecordLifecycleActionHeartbeat`` from a
background loop while it polls the bucket for the marker, completes the action as soon
as a marker releases the node (contract.marker_releases: right node and run, not a
rebalance marker, not older than the event), and completes it anyway at the deadline
(the event's time plus FTFLEET_HANDOFF_MAX_WAIT_S, or shortly before the function's own
timeout). The heartbeat loop stops whenever the wait ends, fails or is cancelled.

Idempotent by instance id and token: when the node (or another delivery of the same
event) has completed the action first, AWS answers the heartbeat or the completion with
a ValidationError, and this function stops and reports ``already-complete``. It never
abandons (ABANDON) an action, terminates or replaces anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftfleet import contract
from ftfleet.lambdas.common import aws, eventbridge, events, runtime
from ftfleet.lambdas.common.events import Dropped
from ftfleet.lambdas.common.heartbeat import Gone, Heartbeat
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.lifecycle_handoff.config import LIFECYCLE, TERMINATING, Config

NAME = "lifecycle_handoff"
#: Seconds kept back from the invocation's time limit to complete the action.
MARGIN_S = 15.0


clock = runtime.Clock()


@dataclass(frozen=True)
class Action:
    group: str
    hook: str
    instance_id: str
    token: str

    def params(self) -> dict[str, str]:
        return {
            "AutoScalingGroupName": self.group,
            "LifecycleHookName": self.hook,
            "InstanceId": self.instance_id,
            "LifecycleActionToken": self.token,
        }


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    env = eventbridge.parse(event, (LIFECYCLE,))
    d = env.detail
    action = Action(
        group=events.text(d, "AutoScalingGroupName", "event.detail"),
        hook=events.text(d, "LifecycleHookName", "event.detail"),
        instance_id=events.text(d, "EC2InstanceId", "event.detail", eventbridge.INSTANCE_ID),
        token=events.text(d, "LifecycleActionToken", "event.detail"),
    )
    transition = events.text(d, "LifecycleTransition", "event.detail")
    where = {"instance_id": action.instance_id, "group": action.group}
    if action.group not in cfg.groups:
        raise Dropped("group of another stack", **where)
    if action.hook != contract.TERMINATION_HOOK_NAME:
        raise Dropped(f"hook {action.hook!r} is not {contract.TERMINATION_HOOK_NAME!r}", **where)
    if transition != TERMINATING:
        raise Dropped(f"transition {transition!r} is not {TERMINATING}", **where)

    started = clock.now()
    deadline = min(env.time + cfg.max_wait_s, started + runtime.remaining_s(context) - MARGIN_S)
    beat_errors: list[str] = []
    with Heartbeat(
        lambda: _heartbeat(action), cfg.heartbeat_s, on_error=lambda e: beat_errors.append(f"{type(e).__name__}: {e}")
    ) as beats:
        outcome, marker = _wait(cfg, action, env.time, deadline, beats)
    if outcome != "already-complete" and not _complete(action):
        outcome = "already-complete"
    finished = clock.now()
    waited = max(0.0, finished - env.time)
    aws.put_metrics(
        [
            {
                "MetricName": "HandoffWaitSeconds",
                "Dimensions": aws.dims(Stack=cfg.stack, Outcome=outcome),
                "Value": waited,
                "Unit": "Seconds",
            },
            {
                "MetricName": "HandoffWaitSeconds",
                "Dimensions": aws.dims(Stack=cfg.stack),
                "Value": waited,
                "Unit": "Seconds",
            },
        ]
    )
    return log.decision(
        "completed" if outcome != "already-complete" else "already-complete",
        outcome=outcome,
        waited_s=round(waited, 3),
        notice_at=events.iso(env.time),
        marker_step=marker.step if marker else None,
        heartbeats=beats.beats,
        heartbeat_errors=beat_errors[-3:],
        **where,
    )


def _wait(
    cfg: Config, action: Action, notice_at: float, deadline: float, beats: Heartbeat
) -> tuple[str, contract.CommitMarker | None]:
    key = f"{cfg.root}/{contract.marker_key(action.instance_id)}"
    while True:
        if beats.gone.is_set():
            return "already-complete", None
        marker = _marker(cfg.bucket, key)
        if marker and contract.marker_releases(
            marker, node_id=action.instance_id, run_id=cfg.run_id, notice_at=notice_at
        ):
            return "marker", marker
        now = clock.now()
        if now >= deadline:
            return "deadline", None
        clock.sleep(min(cfg.poll_s, deadline - now))


def _marker(bucket: str, key: str) -> contract.CommitMarker | None:
    body, _ = aws.read_bytes(bucket, key)
    if body is None:
        return None
    try:
        return contract.CommitMarker.from_json(body)
    except contract.ContractError:
        return None  # a half-written or foreign object is no marker; keep waiting


def _heartbeat(action: Action) -> None:
    try:
        aws.client("autoscaling").record_lifecycle_action_heartbeat(**action.params())
    except Exception as exc:
        if aws.error_code(exc) == "ValidationError":
            raise Gone(str(exc)) from None
        raise


def _complete(action: Action) -> bool:
    """Complete the action with CONTINUE; False when it was no longer pending."""
    try:
        aws.client("autoscaling").complete_lifecycle_action(**action.params(), LifecycleActionResult="CONTINUE")
    except Exception as exc:
        if aws.error_code(exc) == "ValidationError":
            return False
        raise
    return True


runtime.prime(Config)
