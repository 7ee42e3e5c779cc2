"""Notices and their agreement at the step boundary: what every rank acts on, together.

:class:`Interruptions` owns the node's :class:`~ftfleet.trainer.resilience.notices.watcher.NoticeWatcher`
and calls :func:`~ftfleet.trainer.resilience.preemption.agreement.agree` once per boundary, on
every rank, from the training thread: one small ``all_reduce`` tells each rank the most
urgent notice any rank holds, so all of them stop (or take the early checkpoint) at the
same step. What to do about the notice is the caller's:
:class:`~ftfleet.trainer.resilience.preemption.sequence.Preemption` turns a terminal one into the
emergency sequence and an advisory one into an early save.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ftfleet.trainer.resilience.notices.notice import Notice
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher, WatcherConfig

if TYPE_CHECKING:
    from ftfleet.trainer.events import EventLog
    from ftfleet.trainer.resilience.observability.metrics import Metrics

log = logging.getLogger("ftfleet.notices")


@dataclasses.dataclass(frozen=True)
class AgreedNotice:
    notice: Notice
    step: int
    """The step boundary at which the ranks agreed (the last completed step)."""
    local: bool
    """This node's own watcher holds a terminal notice: this machine is the one going
    away (and not only agreeing to another node's notice). Never for a notice whose
    node stays (:attr:`~ftfleet.trainer.resilience.notices.notice.Notice.node_stays`)."""


class Interruptions:
    """Notices + agreement. ``group``: the process group to agree over (None: the
    default group, or a gloo group of its own when that one is NCCL only); never a
    checkpoint group, whose collectives a background save may be running at the same
    time. Agreement runs on the training thread."""

    def __init__(
        self,
        watcher: NoticeWatcher | None = None,
        *,
        group: Any = None,
        events: EventLog | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.watcher = watcher if watcher is not None else NoticeWatcher.from_env()
        self.group = group
        self.events = events
        self.metrics = metrics
        #: Every agreed notice, for summary.json.
        self.records: list[dict[str, Any]] = []
        #: The terminal notice the ranks agreed on, once there is one.
        self.terminal: AgreedNotice | None = None

    @classmethod
    def from_env(
        cls, config: WatcherConfig | None = None, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> Interruptions:
        return cls(NoticeWatcher.from_env(config, environ), **kwargs)

    def start(self) -> Interruptions:
        """Start watching. Collective when ``torch.distributed`` runs on NCCL alone: the
        agreement then gets a gloo group of its own, since a table reduced on the GPU
        would make every boundary wait for the device."""
        if self.group is None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and "gloo" not in str(dist.get_backend()):
                self.group = dist.new_group(backend="gloo")
        self.watcher.start()
        return self

    def close(self) -> None:
        self.watcher.stop()

    def agree(self, step: int) -> AgreedNotice | None:
        """Collective (every rank, every boundary). The most urgent notice any rank
        holds, identical on every rank, or None."""
        from ftfleet.trainer.resilience.preemption.agreement import agree

        mine = self.watcher.pending()
        notice = agree(mine, self.group)
        if notice is None:
            return None
        agreed = AgreedNotice(notice, step, local=mine is not None and mine.terminal and not mine.node_stays)
        record = {
            "kind": str(notice.kind),
            "source": str(notice.source),
            "received_at": notice.received_at,
            "deadline": notice.deadline,
            "terminal": notice.terminal,
            "step": step,
            "agreed_at": time.time(),
        }
        self.records.append(record)
        if self.events is not None:
            self.events.emit("notice", **record)
        if self.metrics is not None:
            self.metrics.notice(notice.kind)
        if notice.terminal:
            self.terminal = agreed
        return agreed

    def acknowledge(self, agreed: AgreedNotice) -> None:
        """An advisory notice was handled: drop it (and ignore its kind for the cooldown)."""
        self.watcher.acknowledge(agreed.notice)
