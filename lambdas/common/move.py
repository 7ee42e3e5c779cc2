"""Moving a run between a home stack and its standby (AWS), one step at a time
(docs/FAILOVER.md, "Moving the job").

Two callers drive the same :class:`Move`: `ftfleet failover` advances it until it is
done, printing each step; a standby's capacity_watch advances it once per scheduled
invocation after a region has lacked capacity for ``capacityLossMinutes``. Where a move
stands is read from the cloud each time, never from the caller's memory, so either can
finish a move the other began, and a rerun after an error picks up where it stopped.
The move's own state is three tags on the source's worker group: :data:`MOVE_TO_TAG`
(the target stack), :data:`JOB_WORKERS_TAG` (the job's worker nodes) and
:data:`MOVE_SINCE_TAG` (when the source was stopped, epoch seconds).

Each call of :meth:`Move.advance` takes the first step not yet done:

1. **begin** (no tag yet): the checks, each refusing with one line and nothing changed
   (:class:`Refused`): the target's primary holds a checkpoint that verifies (its
   manifest and every file it lists, at the listed size); the run lease is held neither
   by the target nor by a third holder whose lease is current; the target's worker
   group takes the job's size. Then the tags, and the source's groups go to 0 (each
   node's termination hook takes an emergency checkpoint first).
2. **source leaving**: the source's groups at 0 (a resize refused after the tags were
   written is taken again), until Auto Scaling lists none of their instances (those in
   ``Terminating:Wait``, writing their emergency checkpoint, included).
3. **replication**: until the target's primary holds the source's newest verified step,
   at most ``replication_wait_s`` after that checkpoint was written; past that, the
   move goes on from the newest step the target holds, and says which steps it gives up.
4. **start**: the target's groups take one coordinator and the job's workers; the tags
   go. The move is done. The target's nodes take the run lease once the source's has
   run out (``ttl_s`` plus the skew after its last renewal): the move never releases
   it for the source, as an instance Auto Scaling no longer lists (detached, or still
   shutting down) may still hold it, and only its running out proves that it commits
   no more.

Every step is idempotent: two movers at once (the function and a person's command)
take the same steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ftfleet.errors import UserError
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.common.pair import REPLICATION_WAIT_S, LeaseRef, Pair, Side

__all__ = ["JOB_WORKERS_TAG", "MOVE_SINCE_TAG", "MOVE_TO_TAG", "LeaseRef", "Move", "Pair", "Refused", "Side"]

#: On the source's worker group while a move is under way: the target stack.
MOVE_TO_TAG = "ftfleet:failover-to"
#: The job's worker nodes, kept while the source's groups are at 0.
JOB_WORKERS_TAG = "ftfleet:failover-workers"
#: When the source's groups were set to 0 (epoch seconds).
MOVE_SINCE_TAG = "ftfleet:failover-since"
TAGS = (MOVE_TO_TAG, JOB_WORKERS_TAG, MOVE_SINCE_TAG)


class Refused(UserError):
    """A move that cannot proceed safely; nothing was changed."""

    exit_code = 1


def newest_verified(side: Side) -> int | None:
    """The newest step in ``side``'s primary whose manifest and files are all there."""
    listing = aws.Checkpoints(side.bucket, side.region, side.root)
    return listing.newest_complete(listing.steps())


class Move:
    """One move from ``source`` to ``target``; ``say`` receives each step's line."""

    def __init__(
        self,
        source: Side,
        target: Side,
        lease: LeaseRef,
        *,
        workers: int | None = None,
        replication_wait_s: float = REPLICATION_WAIT_S,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source, self.target, self.lease = source, target, lease
        self.workers, self.replication_wait_s = workers, replication_wait_s
        self.say, self.clock = say, clock

    # -- reading the cloud ----------------------------------------------------------

    def _asg(self, side: Side) -> Any:
        return aws.client("autoscaling", side.region)

    def _group(self, side: Side, name: str) -> dict[str, Any]:
        got = self._asg(side).describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not got:
            raise Refused(f"{side.stack}'s group {name} is not in {side.region}: run `pulumi up -s {side.stack}`")
        return got[0]

    def tags(self) -> dict[str, str]:
        """The move's tags on the source's worker group."""
        group = self._group(self.source, self.source.worker_group)
        return {t["Key"]: t["Value"] for t in group.get("Tags", []) if t["Key"] in TAGS}

    def under_way(self) -> bool:
        return self.tags().get(MOVE_TO_TAG) == self.target.stack

    def instances(self, side: Side) -> int:
        """The side's instances Auto Scaling lists, in service or still leaving."""
        return sum(len(self._group(side, g).get("Instances", [])) for g in (side.coordinator_group, side.worker_group))

    def lease_document(self) -> dict[str, Any] | None:
        """The lease as stored; None when there is none. Raises :class:`Refused` for a
        document that is not this run's lease."""
        doc, _ = aws.read_json(self.lease.bucket, self.lease.key, self.lease.region)
        if doc is None:
            return None
        where = f"s3://{self.lease.bucket}/{self.lease.key}"
        try:
            holder, expires = str(doc["holder"]), float(doc["expires_at"])
        except (TypeError, KeyError, ValueError):
            holder, expires = "", math.nan
        if not holder or math.isnan(expires):
            raise Refused(f"{where} is not a run lease: look at it first")
        if doc.get("run_id") != self.lease.run_id:
            raise Refused(
                f"{where} is run {doc.get('run_id')!r}'s lease, not {self.lease.run_id!r}'s: "
                "give each run a lease of its own"
            )
        return doc

    # -- the checks -----------------------------------------------------------------

    def check(self) -> tuple[int, int]:
        """The checks of step 1; (the target's newest verified step, the job's worker
        nodes). Raises :class:`Refused`."""
        s, t = self.source, self.target
        step = newest_verified(t)
        if step is None:
            raise Refused(f"{t.uri} holds no checkpoint that verifies: nothing to resume there")
        doc = self.lease_document()
        if doc is not None and float(doc["expires_at"]) > self.clock():
            if doc["holder"] == t.holder:
                raise Refused(f"{t.stack} holds the run lease already: the run trains there")
            if doc["holder"] != s.holder:
                raise Refused(
                    f"the run lease is held by {doc['holder']}, neither {s.stack} nor {t.stack}: stop it first"
                )
        workers = self.workers
        if workers is None:
            group = self._group(s, s.worker_group)
            workers = max(int(group["DesiredCapacity"]), int(group["MinSize"]))
        if workers < 1:
            raise Refused(f"{s.stack}'s worker group is at 0: the run does not train there (give the job's size)")
        most = int(self._group(t, t.worker_group)["MaxSize"])
        if workers > most:
            raise Refused(
                f"{t.stack}'s worker group takes at most {most} nodes, not {workers}: raise its workerMaxSize"
            )
        return step, workers

    # -- the steps ------------------------------------------------------------------

    def advance(self) -> bool:
        """Take the first step not yet done (module doc); True once the move is done.
        Raises :class:`Refused` (step 1, nothing changed) or a client error (a rerun
        takes the step again)."""
        s, t = self.source, self.target
        tags = self.tags()
        moving_to = tags.get(MOVE_TO_TAG)
        if moving_to and moving_to != t.stack:
            raise Refused(f"{s.stack} is being moved to {moving_to}, not {t.stack}: finish that move first")
        if not moving_to:
            self._begin()
            return False
        try:
            workers, since = int(tags[JOB_WORKERS_TAG]), float(tags[MOVE_SINCE_TAG])
        except (KeyError, ValueError):
            raise Refused(
                f"{s.stack}'s worker group has {MOVE_TO_TAG} without a readable {JOB_WORKERS_TAG} and "
                f"{MOVE_SINCE_TAG}: remove the three tags and start the move again"
            ) from None
        # A resize refused after the tags were written (ScalingActivityInProgress,
        # ResourceContention) or cut short is taken again: the step is idempotent.
        for name in (s.coordinator_group, s.worker_group):
            group = self._group(s, name)
            if int(group["DesiredCapacity"]) or int(group["MinSize"]):
                self._resize(s, name, 0)
        left = self.instances(s)
        if left:
            self.say(f"waiting: {left} instance(s) of {s.stack} still leaving")
            return False
        source = aws.Checkpoints(s.bucket, s.region, s.root)
        wanted, have = source.newest_complete(source.steps()), newest_verified(t)
        if wanted is not None and (have is None or have < wanted):
            # Replication's clock (RTC: 99.99 % within 15 minutes) runs per object from
            # its upload: the newest checkpoint's, which the termination hook may have
            # written long after the source was told to stop.
            written = source.committed_at(wanted) or since
            waited = self.clock() - max(written, since)
            if have is None or waited < self.replication_wait_s:
                self.say(f"waiting: {t.uri} holds step-{have}, {s.stack}'s newest is step-{wanted} ({waited:.0f} s)")
                return False
            self.say(
                f"replication has not carried step-{wanted} {waited:.0f} s after it was written: going on from "
                f"step-{have} (the steps after it are computed again)"
            )
        self._resize(t, t.coordinator_group, 1)
        self._resize(t, t.worker_group, workers)
        # DeleteTags with a value deletes only a tag of that value: the keys alone.
        self._asg(s).delete_tags(
            Tags=[{"ResourceId": s.worker_group, "ResourceType": "auto-scaling-group", "Key": k} for k in TAGS]
        )
        self.say(
            f"started {t.stack}: 1 coordinator + {workers} workers; it resumes from step-{have} once "
            f"{s.stack}'s run lease has run out"
        )
        return True

    def _begin(self) -> None:
        s, t = self.source, self.target
        step, workers = self.check()
        self.say(f"checked: {t.uri} has step-{step} verified; the lease allows the move; {workers} workers")
        self._asg(s).create_or_update_tags(
            Tags=[
                self._tag(MOVE_TO_TAG, t.stack),
                self._tag(JOB_WORKERS_TAG, str(workers)),
                self._tag(MOVE_SINCE_TAG, str(math.floor(self.clock()))),
            ]
        )
        self._resize(s, s.coordinator_group, 0)
        self._resize(s, s.worker_group, 0)
        self.say(f"stopping {s.stack}: its groups go to 0; each node takes an emergency checkpoint first")

    def _resize(self, side: Side, name: str, size: int) -> None:
        self._asg(side).update_auto_scaling_group(AutoScalingGroupName=name, MinSize=size, DesiredCapacity=size)
        self.say(f"  {side.region} {name}: min {size}, desired {size}")

    def _tag(self, key: str, value: str) -> dict[str, Any]:
        return {
            "ResourceId": self.source.worker_group,
            "ResourceType": "auto-scaling-group",
            "Key": key,
            "Value": value,
            "PropagateAtLaunch": False,
        }
