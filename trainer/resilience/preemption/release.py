"""The node's half of the lifecycle handoff (AWS): once this node's commit marker is
written, it completes its own termination lifecycle action (``CompleteLifecycleAction``,
``CONTINUE``, hook ``contract.TERMINATION_HOOK_NAME``), so that the Auto Scaling group
terminates it as soon as the emergency checkpoint is safe and no later. The
lifecycle_handoff function is the backstop: it completes the action when it sees the
marker, or at its deadline, if the node could not.

The group comes from FTFLEET_GROUP_NAME, else from the instance's
``aws:autoscaling:groupName`` tag in IMDS (the launch templates allow tags in
metadata); the instance from FTFLEET_NODE_ID. Bounded: botocore's standard retries
with short timeouts, one log line for the outcome, and nothing is ever raised into
the exit path.
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ftfleet.contract import DEFAULT_METADATA_ENDPOINT, TERMINATION_HOOK_NAME
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.resilience import aws
from ftfleet.trainer.resilience.notices.metadata import (
    AWS_GROUP_TAG_PATH,
    AWS_TOKEN_HEADER,
    AWS_TOKEN_PATH,
    AWS_TOKEN_TTL_HEADER,
)

log = logging.getLogger("ftfleet.lifecycle")

#: How the group answers a completion when no action of this instance waits (a spot
#: notice ahead of the group's own lifecycle event, or lifecycle_handoff was first).
_NO_ACTION = "No active Lifecycle Action"


def imds_get(endpoint: str, path: str, timeout_s: float = 2.0) -> str | None:
    """One IMDSv2 read (a fresh token, then the item); None when absent or unreachable.
    http.client, not urllib: the metadata service must never go through a proxy."""
    url = urllib.parse.urlsplit(endpoint)
    cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection

    def call(method: str, target: str, headers: dict[str, str]) -> tuple[int, str]:
        conn = cls(url.hostname or "", url.port, timeout=timeout_s)
        try:
            conn.request(method, target, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace").strip()
        finally:
            conn.close()

    try:
        status, token = call("PUT", AWS_TOKEN_PATH, {AWS_TOKEN_TTL_HEADER: "60"})
        if status != 200 or not token:
            return None
        status, body = call("GET", path, {AWS_TOKEN_HEADER: token})
    except (OSError, http.client.HTTPException):
        return None
    return body if status == 200 and body else None


@dataclasses.dataclass
class LifecycleRelease:
    """Completes this instance's termination lifecycle action (see the module doc)."""

    region: str
    instance_id: str
    metadata_endpoint: str
    group_name: str | None = None
    client: Any = None
    #: What the last :meth:`complete` did, for the events and summary.json.
    outcome: dict[str, Any] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LifecycleRelease | None:
        """None off AWS (FTFLEET_CLOUD, FTFLEET_REGION) or without FTFLEET_NODE_ID."""
        env = TrainerEnvironment(environ)
        region, instance_id = env.aws_region, env.node_id
        if region is None or not instance_id:
            return None
        endpoint = env.metadata_endpoint or DEFAULT_METADATA_ENDPOINT["aws"]
        return cls(region, instance_id, endpoint, env.group_name)

    def complete(self) -> dict[str, Any]:
        """CompleteLifecycleAction CONTINUE; returns the outcome (``completed``,
        ``no-action``, ``no-group`` or ``failed``) and never raises."""
        started = time.time()
        outcome: dict[str, Any] = {"hook": TERMINATION_HOOK_NAME, "instance_id": self.instance_id}
        try:
            group = self.group_name or imds_get(self.metadata_endpoint, AWS_GROUP_TAG_PATH)
            outcome["group"] = group
            if not group:
                outcome["result"] = "no-group"
                log.warning(
                    "lifecycle: no Auto Scaling group for %s (FTFLEET_GROUP_NAME unset, no %s tag in IMDS); "
                    "lifecycle_handoff completes the action when it sees the marker",
                    self.instance_id,
                    AWS_GROUP_TAG_PATH.rsplit("/", 1)[-1],
                )
                return self._done(outcome, started)
            if self.client is None:
                self.client = aws.client("autoscaling", self.region, read_timeout_s=5.0)
            self.client.complete_lifecycle_action(
                LifecycleHookName=TERMINATION_HOOK_NAME,
                AutoScalingGroupName=group,
                InstanceId=self.instance_id,
                LifecycleActionResult="CONTINUE",
            )
            outcome["result"] = "completed"
            log.warning(
                "lifecycle: completed %s of %s in %s (CONTINUE)", TERMINATION_HOOK_NAME, self.instance_id, group
            )
        except Exception as exc:  # noqa: BLE001 - the exit path must go on whatever happens here
            message = str(exc)
            outcome["result"] = "no-action" if _NO_ACTION in message else "failed"
            outcome["error"] = f"{type(exc).__name__}: {message}"[:300]
            log.warning(
                "lifecycle: %s not completed for %s (%s); lifecycle_handoff completes it when it sees the marker",
                TERMINATION_HOOK_NAME,
                self.instance_id,
                outcome["error"],
            )
        return self._done(outcome, started)

    def _done(self, outcome: dict[str, Any], started: float) -> dict[str, Any]:
        outcome["completed_at"] = time.time()
        outcome["seconds"] = round(outcome["completed_at"] - started, 3)
        self.outcome = outcome
        return outcome
