"""A move's view of a GCP pair (lambdas/common/move.py): regional managed instance
groups, one dual-region bucket for both sides, and the move's record in it.

* The groups: a group's size is its ``targetSize`` (a MIG has no separate floor or
  maximum); a resize is ``regionInstanceGroupManagers.resize``, and the group's
  instances are listed until the VMs are gone (``currentAction`` ``DELETING`` while
  each runs its shutdown script, the emergency checkpoint).
* The coordinator: its VM is the one a per-instance config creates, named and holding
  the stack's reserved rendezvous address (infra/gcp/fleet.py); a resize up would add a
  VM of the template's without either. So a move stops the source's coordinator by
  deleting its VM (``deleteInstances``, which lowers the target size; deleting only the
  per-instance config would leave the VM running) but never raises a coordinator group:
  the target's coordinator VM must run before the move begins
  (:meth:`GcpFleet.cannot_start`: a standby with ``standbyActive``, a home after
  `pulumi up --refresh`, which declares its per-instance config again).
* The record of a move out of a stack: ``<root>/fleet/failover-from-<stack>.json``
  beside the checkpoints (:func:`record_key`), created only where none exists
  (``ifGenerationMatch=0``): of two movers beginning at once, one writes it and the
  other finds it.
* Checkpoints and the lease: both sides read the home's bucket, one strongly
  consistent namespace across its two regions, so a move never waits for replication.
"""

from __future__ import annotations

import json
from typing import Any

from ftfleet.lambdas.common import gcp
from ftfleet.lambdas.common.gcp_groups import READ_WRITE, Groups
from ftfleet.lambdas.common.move import Fleet, Record, Refused
from ftfleet.lambdas.common.pair import LeaseRef, Side


def record_key(side: Side) -> str:
    return f"{side.root}/fleet/failover-from-{side.stack}.json"


class GcpFleet(Fleet):
    record_place = "the move's record object (gs://BUCKET/ROOT/fleet/failover-from-STACK.json)"

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], Groups] = {}

    def _of(self, side: Side) -> Groups:
        key = (side.project, side.region)
        if key not in self._groups:
            self._groups[key] = Groups(side.project, side.region, READ_WRITE)
        return self._groups[key]

    def sizes(self, side: Side, group: str) -> tuple[int, int, int | None]:
        size = self._of(side).target_size(group)
        if size is None:
            raise Refused(
                f"{side.stack}'s group {group} is not in {side.project}/{side.region}: run `pulumi up -s {side.stack}`"
            )
        return size, size, None

    def resize(self, side: Side, group: str, size: int) -> str:
        if group == side.coordinator_group:
            if size > 0:
                return f"target size {self.sizes(side, group)[0]}, its per-instance config's VM (never resized up)"
            groups = self._of(side)
            # An instance still being created has no URL yet: nothing to delete by name.
            going = [
                str(i["instance"])
                for i in groups.instances(group)
                if i.get("instance") and i.get("currentAction") != "DELETING"
            ]
            if going:
                groups.delete_instances(group, going)
            return f"its VM deleted ({len(going)} instance(s), deleteInstances)"
        self._of(side).resize(group, size)
        return f"target size {size}"

    def cannot_start(self, side: Side) -> str | None:
        if self.sizes(side, side.coordinator_group)[0] >= 1:
            return None
        return (
            f"{side.stack}'s coordinator VM is not there (its group {side.coordinator_group} is at 0): "
            f"`pulumi config set ftfleet:standbyActive true -s {side.stack}` on a standby, then "
            f"`pulumi up --refresh -s {side.stack}`"
        )

    def listed(self, side: Side, group: str) -> int:
        self.sizes(side, group)  # a group that is gone is refused, not counted as empty
        return len(self._of(side).instances(group))

    def record(self, source: Side) -> dict[str, str]:
        doc, _ = gcp.read_json(source.bucket, record_key(source))
        if doc is None:
            return {}
        if not isinstance(doc, dict) or not isinstance(doc.get("to"), str) or not doc["to"]:
            raise Refused(
                f"gs://{source.bucket}/{record_key(source)} is not a move's record: look at it, delete it, "
                "and start the move again"
            )
        return {k: str(v) for k, v in doc.items() if k in ("to", "workers", "since")}

    def write_record(self, source: Side, record: Record) -> None:
        from google.api_core import exceptions

        blob = gcp.storage().bucket(source.bucket).blob(record_key(source))
        try:
            blob.upload_from_string(
                json.dumps(record.fields(), sort_keys=True),
                content_type="application/json",
                if_generation_match=0,
                checksum="crc32c",
            )
        except exceptions.PreconditionFailed:
            pass  # another mover began the same move: its record stands

    def clear_record(self, source: Side) -> None:
        from google.api_core import exceptions

        try:
            gcp.storage().bucket(source.bucket).blob(record_key(source)).delete()
        except exceptions.NotFound:
            pass

    def checkpoints(self, side: Side) -> gcp.Checkpoints:
        return gcp.Checkpoints(side.bucket, side.root)

    def read_lease(self, lease: LeaseRef) -> tuple[Any, str]:
        doc, _ = gcp.read_json(lease.bucket, lease.key)
        return doc, f"gs://{lease.bucket}/{lease.key}"
