"""The one event every kind of interruption notice becomes: a :class:`Notice`.

A notice says *what* is coming (``kind``), *who* said so (``source``), *when* this
process learnt of it (``received_at``) and *by when* the work must be safe
(``deadline``). Times are wall-clock epoch seconds so that notices received on
different nodes can be compared during agreement (the fleet's clocks are NTP-synced;
a monotonic clock is per machine).

``terminal`` separates notices after which the node goes away (checkpoint, write the
commit marker, exit :data:`~ftfleet.contract.EXIT_PREEMPTED`) from advisory ones
(take an early checkpoint and carry on): a rebalance recommendation or a GCP live
migration is not a termination.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable

from ftfleet import contract

#: AWS posts spot/instance-action two minutes before it stops or terminates a Spot
#: Instance.
AWS_TERMINATION_NOTICE_S = 120.0
#: GCE sets instance/preempted 30 s before it stops a preemptible or Spot VM (the
#: contract's value; FTFLEET_PREEMPTION_NOTICE_S when the stack extends the notice).
GCP_PREEMPTION_NOTICE_S = float(contract.GCP_PREEMPTION_NOTICE_S)
#: GCE changes instance/maintenance-event 60 s before a host maintenance event.
GCP_MAINTENANCE_NOTICE_S = 60.0
#: torchrun waits this long after forwarding SIGTERM before it SIGKILLs the workers
#: (its --shutdown-timeout default); Kubernetes' default grace period is the same.
SIGNAL_GRACE_S = 30.0
#: A rebalance recommendation has no deadline of its own. The early checkpoint is
#: budgeted as if the two-minute interruption notice could follow at once.
REBALANCE_BUDGET_S = 120.0
#: An Auto Scaling group holds a terminating instance for its lifecycle hook's heartbeat
#: timeout (the stack's terminationHookSeconds, at least 120 s) before it goes on.
AWS_LIFECYCLE_NOTICE_S = 120.0


class NoticeKind(enum.StrEnum):
    """What is coming. The values are the contract's CommitMarker ``reason`` values,
    except :attr:`RESIZE`, which writes no marker."""

    TERMINATION = "termination"
    REBALANCE = "rebalance"
    MAINTENANCE = "maintenance"
    SIGNAL = "signal"
    #: The in-process job's world changes shape (a node waits to rejoin a world that
    #: shrank): the ranks end the round at the agreed step with a committed checkpoint,
    #: and every node stays (:mod:`ftfleet.trainer.inprocess.resize`).
    RESIZE = "resize"


class NoticeSource(enum.StrEnum):
    """Who said so. A closed set, so that agreement can send it as a number."""

    SIGNAL = "signal"
    AWS_SPOT = "aws-spot-instance-action"
    AWS_REBALANCE = "aws-rebalance-recommendation"
    GCP_PREEMPTED = "gcp-preempted"
    GCP_MAINTENANCE = "gcp-maintenance-event"
    #: Raised by the trainer itself (a drill, an operator request).
    INJECTED = "injected"
    #: IMDS ``autoscaling/target-lifecycle-state`` turned ``Terminated``: the Auto
    #: Scaling group is terminating the instance (scale-in, rebalancing, a replacement).
    AWS_LIFECYCLE = "aws-target-lifecycle-state"
    #: The in-process launcher's round (:mod:`ftfleet.trainer.inprocess.resize`).
    ROUND = "inprocess-round"


#: Kinds that never end the process, whatever the source says.
_ADVISORY_KINDS = frozenset({NoticeKind.REBALANCE})
#: Kinds that end the process but not the node: no commit marker, no lifecycle action,
#: no hand-off to a spare node, no wait for the durable upload.
_NODE_STAYS_KINDS = frozenset({NoticeKind.RESIZE})


@dataclasses.dataclass(frozen=True, slots=True)
class Notice:
    """One interruption notice.

    Invariants (checked): ``deadline >= received_at``; a rebalance is never terminal.
    """

    kind: NoticeKind
    source: NoticeSource
    #: Epoch seconds at which this process (or, after agreement, the first rank)
    #: learnt of the notice.
    received_at: float
    #: Epoch seconds by which the checkpoint must be committed.
    deadline: float
    #: True: the node goes away; False: checkpoint early and carry on.
    terminal: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", NoticeKind(self.kind))
        object.__setattr__(self, "source", NoticeSource(self.source))
        if self.deadline < self.received_at:
            raise ValueError(f"notice deadline {self.deadline} is before its received_at {self.received_at}")
        if self.terminal and self.kind in _ADVISORY_KINDS:
            raise ValueError(f"a {self.kind} notice cannot be terminal")

    @classmethod
    def create(
        cls,
        kind: NoticeKind,
        source: NoticeSource,
        budget_s: float,
        *,
        terminal: bool = True,
        received_at: float | None = None,
        deadline: float | None = None,
    ) -> Notice:
        """A notice received now (or at ``received_at``) with ``budget_s`` to act.

        ``deadline``, when the notice itself names the moment of interruption (AWS's
        instance-action ``time``), wins over the budget if it is earlier: what the
        cloud says is measured, the budget is an assumption.
        """
        now = time.time() if received_at is None else received_at
        limit = now + budget_s
        if deadline is not None:
            limit = min(limit, max(deadline, now))
        return cls(
            kind=kind, source=source, received_at=now, deadline=limit, terminal=terminal and kind not in _ADVISORY_KINDS
        )

    @property
    def node_stays(self) -> bool:
        """The node is not going away: the notice ends the job's round, not the machine."""
        return self.kind in _NODE_STAYS_KINDS

    def remaining(self, now: float | None = None) -> float:
        """Seconds left until the deadline (negative when it has passed)."""
        return self.deadline - (time.time() if now is None else now)

    def describe(self) -> str:
        what = "terminal" if self.terminal else "advisory"
        return f"{self.kind} notice from {self.source} ({what}), {self.remaining():.1f}s left"


def urgency(notice: Notice) -> tuple[int, float, int, int]:
    """Sort key: terminal before advisory, then earliest deadline, then a fixed
    order of kinds and sources so that ties break the same way on every rank."""
    return (
        0 if notice.terminal else 1,
        notice.deadline,
        list(NoticeKind).index(notice.kind),
        list(NoticeSource).index(notice.source),
    )


def most_urgent(notices: Iterable[Notice | None]) -> Notice | None:
    """The notice to act on first, or None when there is none."""
    present = [n for n in notices if n is not None]
    return min(present, key=urgency) if present else None
