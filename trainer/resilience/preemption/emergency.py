"""The emergency checkpoint: the state at the agreed step, committed to the fast tier,
then uploaded to the durable tier for as long as the notice leaves time.

:func:`emergency_checkpoint` is collective: every rank calls it with the same step,
after the ranks agreed on a terminal notice (:mod:`.boundary`). The save blocks until
every rank's shard is committed (the manifest is on the fast tier): from then on the
step survives the node. The durable upload goes on until :data:`DEADLINE_MARGIN_S`
before the notice's deadline, which leaves the marker and the exit their time; a
checkpoint that is not uploaded by then stays on the fast tier, and the next start
uploads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftfleet.trainer.checkpoint.manager import CheckpointManager
    from ftfleet.trainer.resilience.preemption.boundary import AgreedNotice

#: The emergency path stops waiting for the durable upload this long before the
#: notice's deadline: the commit marker and the exit must fit in it.
DEADLINE_MARGIN_S = 5.0

#: ``save(step, reason, blocking, **event_fields)``: starts (or with ``blocking``,
#: commits) a save of ``step``.
SaveFn = Callable[..., Any]


def emergency_checkpoint(
    ckpt: CheckpointManager,
    step: int,
    stopping: AgreedNotice | None,
    save: SaveFn,
    *,
    enabled: bool = True,
    reason: str | None = None,
    wait_for_upload: bool = True,
    drain_timeout_s: float | None = None,
) -> bool:
    """Collective. Commit ``step`` (unless it is committed already, or ``enabled`` is
    false) and drain the uploads; returns whether they were drained.

    With a terminal notice (``stopping``) the save is the emergency one and the uploads
    are waited for until :data:`DEADLINE_MARGIN_S` before its deadline (not at all when
    the node stays: the round ends for a resize, and the next one uploads); without one it
    is the final save, and ``wait_for_upload`` says whether to wait. ``drain_timeout_s``
    bounds the wait in both cases. Ends with ``ckpt.close``: no save may follow."""
    started = time.time()
    ckpt.wait()
    if enabled and ckpt.cfg.enabled and step not in ckpt.committed and step != ckpt.restored_step:
        fields = {"deadline": stopping.notice.deadline} if stopping else {}
        save(step, reason or ("emergency" if stopping else "final"), True, **fields)
    deadline = math.inf if drain_timeout_s is None else started + drain_timeout_s
    leaving = stopping is not None and not stopping.notice.node_stays
    if leaving:
        # The checkpoint is safe on the fast tier: keep uploading while the notice
        # leaves time, then tell the fleet the node may go.
        deadline = min(deadline, stopping.notice.deadline)
    elif stopping is not None:  # a resize: every node stays, the next round uploads
        wait_for_upload = False
    upload_deadline = None if math.isinf(deadline) else deadline - DEADLINE_MARGIN_S
    return ckpt.close(wait_for_upload=wait_for_upload or leaving, upload_deadline=upload_deadline)
