"""Moving a run between a home stack and its standby, one step at a time
(docs/FAILOVER.md, "Moving the job"), on either cloud.

Two callers drive the same :class:`Move`: `ftfleet failover` advances it until it is
done, printing each step; a standby's capacity watch advances it once per scheduled
invocation after a region has lacked capacity for ``capacityLossMinutes``
(:func:`drive`). Where a move stands is read from the cloud each time, never from the
caller's memory, so either can finish a move the other began, and a rerun after an
error picks up where it stopped. The move's own record (:class:`Record`: the target
stack, the job's worker nodes, when the source was stopped) is kept by the cloud's
:class:`Fleet`: on AWS three tags on the source's worker group (:data:`MOVE_TO_TAG`,
:data:`JOB_WORKERS_TAG`, :data:`MOVE_SINCE_TAG`), on GCP an object in the run's bucket
written with generation preconditions (lambdas/common/gcp_fleet.py).

Each call of :meth:`Move.advance` takes the first step not yet done:

1. **begin** (no record yet): the checks, each refusing with one line and nothing
   changed (:class:`Refused`): the target's primary holds a checkpoint that verifies (its
   manifest and every file it lists, at the listed size); the run lease is held neither
   by the target nor by a third holder whose lease is current; the target's worker
   groups take the job's size. Then the record, and the source's groups go to 0 (each
   node's termination hook or shutdown script takes an emergency checkpoint first).
2. **source leaving**: the source's groups at 0 (a resize refused after the record was
   written is taken again), until the cloud lists none of their instances (those still
   writing their emergency checkpoint included).
3. **replication**: until the target's primary holds the source's newest verified step,
   at most ``replication_wait_s`` after that checkpoint was written; past that, the
   move goes on from the newest step the target holds, and says which steps it gives up.
   (On GCP both sides read one dual-region bucket: nothing to wait for.)
4. **start**: the target's groups take one coordinator and the job's workers; the record
   goes. The move is done. The target's nodes take the run lease once the source's has
   run out (``ttl_s`` plus the skew after its last renewal): the move never releases
   it for the source, as an instance the cloud no longer lists (detached, abandoned, or
   still shutting down) may still hold it, and only its running out proves that it
   commits no more.

Every step is idempotent: two movers at once (the function and a person's command)
take the same steps.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftfleet.errors import UserError
from ftfleet.lambdas.common import checkpoints
from ftfleet.lambdas.common.pair import REPLICATION_WAIT_S, LeaseRef, Pair, Side

__all__ = [
    "JOB_WORKERS_TAG",
    "MOVE_SINCE_TAG",
    "MOVE_TO_TAG",
    "Fleet",
    "LeaseRef",
    "Move",
    "Pair",
    "Record",
    "Refused",
    "Side",
    "Stuck",
    "drive",
    "outcome",
]

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


class Stuck(UserError):
    """A move under way (its record written, the source told to stop) that cannot take
    its next step; a rerun once the cause is fixed goes on from there."""

    exit_code = 1


@dataclass(frozen=True)
class Record:
    """A move under way, as its :class:`Fleet` keeps it."""

    to: str
    """The target stack."""
    workers: tuple[int, ...]
    """The job's nodes in each worker group (``Side.worker_groups``, by position)."""
    since: float
    """When the source's groups were set to 0 (epoch seconds)."""

    def fields(self) -> dict[str, str]:
        return {"to": self.to, "workers": ",".join(map(str, self.workers)), "since": str(math.floor(self.since))}

    @classmethod
    def of(cls, fields: dict[str, str]) -> Record:
        """From :meth:`fields`' mapping; raises ValueError."""
        workers = tuple(int(n) for n in fields["workers"].split(","))
        since = float(fields["since"])
        if not fields["to"] or any(n < 0 for n in workers) or not math.isfinite(since):
            raise ValueError("out of range")
        return cls(fields["to"], workers, since)


class Fleet(abc.ABC):
    """What a move reads and changes in one cloud: the sides' groups, the record of the
    move under way, the checkpoints in a side's primary bucket and the run lease. A
    group that does not exist is :class:`Refused`, naming the `pulumi up` that makes it."""

    #: Where a record that does not read is, and how to clear it (a Refused names both).
    record_place = "the move's record"

    @abc.abstractmethod
    def sizes(self, side: Side, group: str) -> tuple[int, int, int | None]:
        """(nodes asked for, the group's floor, its most or None where it has none)."""

    @abc.abstractmethod
    def resize(self, side: Side, group: str, size: int) -> str:
        """Floor and nodes asked for to ``size``; what was set, in the cloud's words."""

    @abc.abstractmethod
    def listed(self, side: Side, group: str) -> int:
        """The group's instances the cloud lists, running or still leaving."""

    @abc.abstractmethod
    def record(self, source: Side) -> dict[str, str]:
        """The record of a move out of ``source`` as stored (:meth:`Record.fields`'
        keys, any of them missing); empty when none is under way."""

    @abc.abstractmethod
    def write_record(self, source: Side, record: Record) -> None:
        """Store the record; a concurrent mover's record, already there, is kept."""

    @abc.abstractmethod
    def clear_record(self, source: Side) -> None: ...

    @abc.abstractmethod
    def checkpoints(self, side: Side) -> checkpoints.CheckpointListing: ...

    @abc.abstractmethod
    def read_lease(self, lease: LeaseRef) -> tuple[Any, str]:
        """(the lease's document, None when there is none; its URI)."""

    def cannot_start(self, side: Side) -> str | None:
        """Why ``side`` could not take the run (a refusal's line), or None."""
        return None


def fleet_for(side: Side) -> Fleet:
    """The side's cloud's :class:`Fleet` (imported here: a function packs one cloud's
    client library)."""
    if side.cloud == "gcp":
        from ftfleet.lambdas.common.gcp_fleet import GcpFleet

        return GcpFleet()
    from ftfleet.lambdas.common.aws_fleet import AwsFleet

    return AwsFleet()


def newest_verified(side: Side, fleet: Fleet | None = None) -> int | None:
    """The newest step in ``side``'s primary whose manifest and files are all there."""
    listing = (fleet or fleet_for(side)).checkpoints(side)
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
        fleet: Fleet | None = None,
    ) -> None:
        self.source, self.target, self.lease = source, target, lease
        self.workers, self.replication_wait_s = workers, replication_wait_s
        self.say, self.clock = say, clock
        self.fleet = fleet or fleet_for(source)

    # -- reading the cloud ----------------------------------------------------------

    def under_way(self) -> bool:
        return self.fleet.record(self.source).get("to") == self.target.stack

    def instances(self, side: Side) -> int:
        """The side's instances the cloud lists, in service or still leaving."""
        return sum(self.fleet.listed(side, g) for g in (side.coordinator_group, *side.worker_groups))

    def lease_document(self) -> dict[str, Any] | None:
        """The lease as stored; None when there is none. Raises :class:`Refused` for a
        document that is not this run's lease."""
        doc, where = self.fleet.read_lease(self.lease)
        if doc is None:
            return None
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

    def check(self) -> tuple[int, tuple[int, ...]]:
        """The checks of step 1; (the target's newest verified step, the job's nodes per
        worker group). Raises :class:`Refused`."""
        s, t = self.source, self.target
        if len(t.worker_groups) != len(s.worker_groups):
            raise Refused(
                f"{s.stack} has worker groups {', '.join(s.worker_groups)} and {t.stack} "
                f"{', '.join(t.worker_groups)}: give both stacks the same worker settings"
            )
        blocked = self.fleet.cannot_start(t)
        if blocked:
            raise Refused(blocked)
        step = newest_verified(t, self.fleet)
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
        if self.workers is not None:
            workers = (self.workers, *(max(self.fleet.sizes(s, g)[:2]) for g in s.more_worker_groups))
        else:
            workers = tuple(max(self.fleet.sizes(s, g)[:2]) for g in s.worker_groups)
        if workers[0] < 1:
            raise Refused(f"{s.stack}'s worker group is at 0: the run does not train there (give the job's size)")
        for group, n in zip(t.worker_groups, workers, strict=True):
            most = self.fleet.sizes(t, group)[2]
            if most is not None and n > most:
                raise Refused(f"{t.stack}'s group {group} takes at most {most} nodes, not {n}: raise its maximum")
        return step, workers

    # -- the steps ------------------------------------------------------------------

    def advance(self) -> bool:
        """Take the first step not yet done (module doc); True once the move is done.
        Raises :class:`Refused` (step 1, nothing changed), :class:`Stuck` (a later step
        cannot be taken: a group gone, a record that does not read) or a client error (a
        rerun takes the step again)."""
        s, t = self.source, self.target
        fields = self.fleet.record(s)
        moving_to = fields.get("to")
        if moving_to and moving_to != t.stack:
            raise Refused(f"{s.stack} is being moved to {moving_to}, not {t.stack}: finish that move first")
        if not moving_to:
            self._begin()
            return False
        try:
            return self._go_on(fields, moving_to)
        except Refused as exc:
            # Not "nothing changed": the record is written and the source told to stop.
            raise Stuck(f"{s.stack}'s move to {t.stack} is under way and stuck: {exc}") from None

    def _go_on(self, fields: dict[str, str], moving_to: str) -> bool:
        """Steps 2-4 of the move whose record ``fields`` holds (to ``moving_to``)."""
        s, t = self.source, self.target
        try:
            record = Record.of(fields)
            if len(record.workers) != len(s.worker_groups):
                raise ValueError("one size per worker group")
        except (KeyError, ValueError):
            raise Refused(
                f"{s.stack}'s move to {moving_to} has no readable job size and start time: remove "
                f"{self.fleet.record_place} and start the move again"
            ) from None
        # A resize refused after the record was written (Auto Scaling's
        # ScalingActivityInProgress, a MIG's operation in progress) or cut short is
        # taken again: the step is idempotent.
        for group in (s.coordinator_group, *s.worker_groups):
            if max(self.fleet.sizes(s, group)[:2]):
                self._resize(s, group, 0)
        left = self.instances(s)
        if left:
            self.say(f"waiting: {left} instance(s) of {s.stack} still leaving")
            return False
        source = self.fleet.checkpoints(s)
        wanted, have = source.newest_complete(source.steps()), newest_verified(t, self.fleet)
        if wanted is not None and (have is None or have < wanted):
            # Replication's clock (S3 RTC: 99.99 % within 15 minutes) runs per object
            # from its upload: the newest checkpoint's, which the termination hook may
            # have written long after the source was told to stop.
            written = source.committed_at(wanted) or record.since
            waited = self.clock() - max(written, record.since)
            if have is None or waited < self.replication_wait_s:
                self.say(f"waiting: {t.uri} holds step-{have}, {s.stack}'s newest is step-{wanted} ({waited:.0f} s)")
                return False
            self.say(
                f"replication has not carried step-{wanted} {waited:.0f} s after it was written: going on from "
                f"step-{have} (the steps after it are computed again)"
            )
        self._resize(t, t.coordinator_group, 1)
        for group, n in zip(t.worker_groups, record.workers, strict=True):
            self._resize(t, group, n)
        self.fleet.clear_record(s)
        self.say(
            f"started {t.stack}: 1 coordinator + {sum(record.workers)} workers; it resumes from step-{have} once "
            f"{s.stack}'s run lease has run out"
        )
        return True

    def _begin(self) -> None:
        s, t = self.source, self.target
        step, workers = self.check()
        self.say(f"checked: {t.uri} has step-{step} verified; the lease allows the move; {sum(workers)} workers")
        self.fleet.write_record(s, Record(t.stack, workers, math.floor(self.clock())))
        for group in (s.coordinator_group, *s.worker_groups):
            self._resize(s, group, 0)
        self.say(f"stopping {s.stack}: its groups go to 0; each node takes an emergency checkpoint first")

    def _resize(self, side: Side, group: str, size: int) -> None:
        self.say(f"  {side.region} {group}: {self.fleet.resize(side, group, size)}")


def drive(
    pair: Pair,
    loss_s: float,
    now: float,
    short_for: Callable[[Side], float],
    fleet: Fleet | None = None,
) -> dict[str, Any]:
    """A standby's capacity watch's part in a move: the next step of the move under way;
    else, when exactly one side's main worker group asks for nodes (the region the run
    trains in) and ``short_for(that side)`` (the longest its groups have been short for
    want of capacity, seconds) has reached ``loss_s`` and the other side is not short for
    capacity itself, the first step of a move to the other side. A target that could not
    take the run (:meth:`Fleet.cannot_start`) is reported at every run
    (``cannot_move``). Returns what was done, for the decision log."""
    steps: list[str] = []
    fleet = fleet or fleet_for(pair.home)
    moves = [
        Move(
            a,
            b,
            pair.lease,
            replication_wait_s=pair.replication_wait_s,
            say=steps.append,
            clock=lambda: now,
            fleet=fleet,
        )
        for a, b in ((pair.home, pair.standby), (pair.standby, pair.home))
    ]
    try:
        for move in moves:
            if move.under_way():
                done = move.advance()
                return {"move": f"{move.source.stack} -> {move.target.stack}", "done": done, "steps": steps}
        training = [m for m in moves if fleet.sizes(m.source, m.source.worker_group)[0] > 0]
        if len(training) != 1:
            where = "both regions" if training else "neither region"
            return {"move": None, "trains_in": where}
        move = training[0]
        longest = short_for(move.source)
        status: dict[str, Any] = {
            "move": None,
            "trains_in": move.source.stack,
            "short_for_capacity_s": round(longest, 1),
        }
        # Checked at every run, so that a target that could not take the run (GCP: its
        # coordinator VM deleted by an earlier move) is reported before capacity runs out.
        blocked = fleet.cannot_start(move.target)
        if blocked:
            return {**status, "cannot_move": blocked}
        if longest < loss_s:
            return status
        target_short = short_for(move.target)
        if target_short > 0:
            # A region short for capacity too: moving would only start the same wait there.
            return {**status, "target_short_for_capacity_s": round(target_short, 1)}
        move.advance()
        return {"move": f"{move.source.stack} -> {move.target.stack}", "done": False, "steps": steps}
    except Refused as exc:
        return {"move": None, "refused": str(exc), "steps": steps}
    except Stuck as exc:
        return {"move": None, "stuck": str(exc), "steps": steps}


def outcome(moved: dict[str, Any], decision: str, level: str) -> tuple[str, str]:
    """The capacity watch's decision and level once :func:`drive` has run: a refused
    move or one stuck under way is an error, a step taken or a target that could not
    take the run a warning; else the measurement's own."""
    if moved.get("refused"):
        return "failover-refused", "ERROR"
    if moved.get("stuck"):
        return "failover-stuck", "ERROR"
    if moved.get("steps"):
        return "failover", "WARNING"
    if moved.get("cannot_move"):
        return "failover-unready", "WARNING"
    return decision, level
