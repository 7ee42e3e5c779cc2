"""The preemption sequence, usable in any training loop:

    notice ─▶ agreed at a step boundary ─▶ stop ─▶ emergency save (blocking, committed)
           ─▶ durable upload until shortly before the deadline ─▶ commit marker
           ─▶ (AWS) this node's termination lifecycle action completed
           ─▶ exit 75 ─▶ this node's torchrun agent released

::

    preemption = Preemption(ckpt).start()        # SIGTERM and the cloud's notices
    while step < steps:
        if preemption.should_stop(step):         # collective: every rank, every boundary
            break
        ...train one step, maybe ckpt.save(step)...
    sys.exit(preemption.finish(step))            # 75 after a notice, else 0 (final save)

``finish`` ends with stopping the node's torchrun agent after a notice to this node,
which ends the process: clean-up goes between ``finish(step, release=False)`` and a
last ``release_node()``.

An advisory notice (a rebalance recommendation, a live migration) takes an early
checkpoint and training carries on. The reference loop uses the same object, with its
save schedule's ``save`` so that its saves are logged and rescheduled.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ftfleet.contract import EXIT_OK, EXIT_PREEMPTED, CommitMarker
from ftfleet.trainer.agent import stop_agent
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.resilience.preemption.boundary import AgreedNotice, Interruptions
from ftfleet.trainer.resilience.preemption.emergency import SaveFn, emergency_checkpoint
from ftfleet.trainer.resilience.preemption.marker import publish_marker
from ftfleet.trainer.resilience.preemption.release import LifecycleRelease

if TYPE_CHECKING:
    from ftfleet.trainer.checkpoint.manager import CheckpointManager
    from ftfleet.trainer.events import EventLog

log = logging.getLogger("ftfleet.preemption")


class Preemption:
    """``ckpt``: the run's :class:`~ftfleet.trainer.checkpoint.manager.CheckpointManager`.
    ``interruptions``: where notices come from (default: this process's signals and, on
    local rank 0, the metadata service named by ``FTFLEET_CLOUD``). ``save``: how to save
    (default: ``ckpt.save``). ``lifecycle``: completes this node's termination lifecycle
    action after its marker (default: on AWS, from the environment; None elsewhere)."""

    def __init__(
        self,
        ckpt: CheckpointManager,
        interruptions: Interruptions | None = None,
        *,
        save: SaveFn | None = None,
        node_id: str | None = None,
        local_rank: int | None = None,
        events: EventLog | None = None,
        environ: Mapping[str, str] | None = None,
        lifecycle: LifecycleRelease | None = None,
        handoff: Any = "auto",
    ) -> None:
        environ = os.environ if environ is None else environ
        self.ckpt = ckpt
        self.interruptions = interruptions if interruptions is not None else Interruptions.from_env(environ=environ)
        self._save = save if save is not None else self._plain_save
        self.node_id = node_id or TrainerEnvironment(environ).node_id or socket.gethostname()
        self.local_rank = int(environ.get("LOCAL_RANK") or 0) if local_rank is None else local_rank
        self.events = events
        self.lifecycle = lifecycle if lifecycle is not None else LifecycleRelease.from_env(environ)
        if handoff == "auto":  # the in-process launcher's, when this process runs under it
            from ftfleet.trainer.inprocess.handoff import current

            handoff = current()
        #: Hands a noticed node's ranks to a spare node instead of stopping the job
        #: (:mod:`ftfleet.trainer.inprocess.handoff`); None: every notice stops it.
        self.handoff = handoff
        #: After :meth:`finish`: whether the uploads were drained (an upload still in a
        #: collective would make the process group's teardown hang).
        self.drained = True
        self._commit_times: dict[int, float] = {}
        ckpt.on_commit.append(self._on_commit)

    def _plain_save(self, step: int, reason: str, blocking: bool = False, **_: Any) -> Any:
        return self.ckpt.save(step, blocking=blocking)

    def start(self) -> Preemption:
        self.interruptions.start()
        return self

    def close(self) -> None:
        self.interruptions.close()

    @property
    def stopping(self) -> AgreedNotice | None:
        """The terminal notice the ranks agreed on, once there is one."""
        return self.interruptions.terminal

    # -- at the step boundary ------------------------------------------------------

    def check(self, step: int, *, early_save: bool = True) -> AgreedNotice | None:
        """Collective. The agreed notice at this boundary, if any. A terminal one means
        stop now; an advisory one has been acted on (an early checkpoint of ``step``
        unless ``early_save`` is false or it is already saved) and acknowledged."""
        agreed = self.interruptions.agree(step)
        if agreed is None:
            return None
        notice = agreed.notice
        if notice.terminal:
            if self.handoff is not None and not notice.node_stays and self._hand_off(agreed, step):
                return None  # the job trains on; this node's processes did not get here
            log.warning(
                "%s: emergency checkpoint of step %d, %.1fs before the deadline",
                notice.describe(),
                step,
                notice.remaining(),
            )
            return agreed
        self.interruptions.acknowledge(agreed)
        ckpt = self.ckpt
        if (
            early_save
            and ckpt.cfg.enabled
            and step > 0
            and step not in ckpt.committed
            and step != ckpt.last_saved_step  # a save of it may be in flight
            and step != ckpt.restored_step
        ):
            log.warning("%s: early checkpoint of step %d, then carrying on", notice.describe(), step)
            self._save(step, f"notice:{notice.kind}")
        return agreed

    def _hand_off(self, agreed: AgreedNotice, step: int) -> bool:
        """Collective. Hand the noticed nodes' ranks to spare nodes (see
        :mod:`ftfleet.trainer.inprocess.handoff`): False, on every rank, when it does not
        apply; else a snapshot of ``step`` with its peer copy (or, under HSDP, the
        replicas' own snapshots of it), then a noticed node's processes exit 75 here (its
        lifecycle action completed) and the others return True."""
        import torch.distributed as dist

        cfg = self.ckpt.cfg
        if not (cfg.memory and dist.is_available() and dist.is_initialized()):
            return False
        group = self.interruptions.group
        noticed: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(noticed, bool(agreed.local), group=group)
        leaving = self.handoff.leaving(noticed)
        if not self.handoff.possible(leaving):
            log.warning("%s: no spare node for the node(s) leaving: the job stops", agreed.notice.describe())
            return False
        snapshots = self.ckpt.snapshots
        if cfg.memory_peer_every != 1 and not self.handoff.replicated(leaving, snapshots.replicas):
            log.warning(
                "%s: the leaving ranks' state would not be in the others' memory (checkpoint.memory_peer_every=%d, "
                "no replica off the leaving nodes): the job stops",
                agreed.notice.describe(),
                cfg.memory_peer_every,
            )
            return False
        if snapshots.latest_step == step:  # the schedule took this step's snapshot already
            snapshots.wait()
        else:
            self.ckpt.snapshot(step, blocking=True)
        self._emit("handoff", step=step, nodes=sorted(leaving))
        if self.handoff.node_of(dist.get_rank()) in leaving:
            log.warning(
                "%s: step %d is in the peers' memory; a spare node takes this node's ranks: leaving",
                agreed.notice.describe(),
                step,
            )
            self.complete_lifecycle()
            import sys

            sys.stdout.flush()
            sys.stderr.flush()
            # Not a return: the wrapper would wait here for the others, which wait in
            # their next collective for this process; its exit ends those at once.
            os._exit(EXIT_PREEMPTED)
        log.warning("%s: a spare node takes the ranks of the node going away; training on", agreed.notice.describe())
        self.interruptions.terminal = None
        return True

    def should_stop(self, step: int) -> bool:
        """Collective. True once the ranks agreed on a terminal notice: leave the loop
        and call :meth:`finish`."""
        agreed = self.check(step)
        return agreed is not None and agreed.notice.terminal

    # -- the end -------------------------------------------------------------------

    def finish(
        self,
        step: int,
        *,
        save: bool = True,
        reason: str | None = None,
        wait_for_upload: bool = True,
        release: bool = True,
        drain_timeout_s: float | None = None,
    ) -> int:
        """Collective. The end of the run at ``step``; returns the exit code.

        After a terminal notice: a blocking save of ``step`` (unless it is committed
        already), the durable upload until :data:`DEADLINE_MARGIN_S` before the notice's
        deadline, this node's commit marker (local rank 0), and with ``release`` this
        node's torchrun agent is stopped so that it does not restart the workers on a
        machine that is going away; :data:`~ftfleet.contract.EXIT_PREEMPTED`. A notice
        whose node stays (a resize) takes the blocking save alone: no upload wait, no
        marker, no release.
        Otherwise the final save and (``wait_for_upload``) the wait for the uploads;
        :data:`~ftfleet.contract.EXIT_OK`. ``drain_timeout_s`` bounds the upload wait in
        both cases (a checkpoint not uploaded by then stays on the fast tier, and the
        next start uploads it).

        With ``release``, after a notice to this node, its torchrun agent is stopped
        here, and it ends this process: code after this call may not run there. A loop
        with clean-up to do passes ``release=False`` and calls :meth:`release_node` as
        its very last step (examples/own_loop.py)."""
        stopping = self.stopping
        self.drained = emergency_checkpoint(
            self.ckpt,
            step,
            stopping,
            self._save,
            enabled=save,
            reason=reason,
            wait_for_upload=wait_for_upload,
            drain_timeout_s=drain_timeout_s,
        )
        if stopping is None:
            return EXIT_OK
        if stopping.notice.node_stays:  # the round ends, no node goes: nothing to tell the fleet
            return EXIT_PREEMPTED
        if self.ckpt.cfg.enabled:
            self.write_marker(step)
        self.complete_lifecycle()
        if release:
            self.release_node()
        return EXIT_PREEMPTED

    def write_marker(self, step: int) -> dict[str, Any] | None:
        """After the emergency checkpoint: this node's commit marker (local rank 0; every
        rank has committed its shard when the blocking save returned)."""
        stopping = self.stopping
        if stopping is None or self.local_rank != 0:
            return None
        ckpt, notice = self.ckpt, stopping.notice
        marker = CommitMarker.now(
            ckpt.identity.run_id, self.node_id, step, str(notice.kind), durable=step in ckpt.durable_steps
        )
        primary = ckpt.stores.get("primary")
        written = publish_marker(
            marker,
            fast_root=ckpt.local.root,
            put=primary.put_bytes if primary is not None else None,
            deadline=notice.deadline,
        )
        result = {
            "step": step,
            "reason": str(notice.kind),
            "path": str(written.local_path),
            "uploaded": written.uploaded,
            "durable": marker.durable,
        }
        self._emit("marker", **result)
        return result

    def complete_lifecycle(self) -> dict[str, Any] | None:
        """Right after the marker, on local rank 0 of the node whose own watcher saw the
        termination: complete its lifecycle action, so the group terminates it now rather
        than at the hook's timeout (AWS; never raises)."""
        stopping = self.stopping
        if stopping is None or not stopping.local or self.local_rank != 0 or self.lifecycle is None:
            return None
        outcome = self.lifecycle.complete()
        self._emit("lifecycle", **outcome)
        return outcome

    def release_node(self) -> int | None:
        """The very last thing a preempted node does: on the node whose own watcher saw
        the termination notice, stop its torchrun agent, which would otherwise restart
        the workers (``--max-restarts``) on a machine that is going away
        (:mod:`ftfleet.trainer.agent`). Returns the agent's pid when it was stopped."""
        stopping = self.stopping
        if stopping is None or not stopping.local:
            return None
        pid = stop_agent(EXIT_PREEMPTED, "this node is going away")
        if pid is not None:
            self._emit("agent_stopped", pid=pid, code=EXIT_PREEMPTED)
        return pid

    def _on_commit(self, manifest: Any) -> None:
        """On the commit thread: when each manifest landed (the emergency checkpoint may
        be an interval save of the same step)."""
        self._commit_times[manifest.step] = time.time()
        for old in sorted(self._commit_times)[:-8]:
            del self._commit_times[old]

    def summary(self) -> dict[str, Any] | None:
        """What the emergency path did, for summary.json (None without a terminal notice)."""
        stopping = self.stopping
        if stopping is None:
            return None
        notice, committed_at = stopping.notice, self._commit_times.get(stopping.step)
        return {
            "kind": str(notice.kind),
            "source": str(notice.source),
            "step": stopping.step,
            "received_at": notice.received_at,
            "deadline": notice.deadline,
            "committed_at": committed_at,
            "seconds_to_commit": None
            if committed_at is None
            else max(0.0, round(committed_at - notice.received_at, 3)),
            "within_deadline": committed_at is not None and committed_at <= notice.deadline,
            "lifecycle": self.lifecycle.outcome if self.lifecycle is not None else None,
        }

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)
