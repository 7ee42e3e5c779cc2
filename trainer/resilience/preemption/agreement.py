"""All ranks agree, at a step boundary, on the most urgent pending notice.

A notice usually reaches one node (its metadata service, its SIGTERM) while every rank
must take part in the emergency checkpoint. At each step boundary every rank calls
:func:`agree` with what its own watcher has pending; one small ``all_reduce(MIN)``
over a ``float64`` tensor of shape ``(len(NoticeKind), 4)`` tells every rank what
every other rank has seen, and every rank decodes the same tensor with the same
:func:`~trainer.resilience.notices.notice.most_urgent`, so the answer is identical
everywhere.

One row per kind holds, each reduced with MIN: the earliest deadline, the earliest
receipt, the lowest source index, and ``-1`` if any rank's notice of that kind is
terminal (``0`` otherwise). A kind nobody has seen keeps ``+inf`` in its deadline.
Sources of one kind coincide on a fleet (one cloud), so the per-column minimum does not
mix unrelated notices; where they differ, the result errs on the urgent side.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource, most_urgent

_KINDS = list(NoticeKind)
_SOURCES = list(NoticeSource)
_DEADLINE, _RECEIVED, _SOURCE, _TERMINAL = range(4)


def encode(notice: Notice | None) -> torch.Tensor:
    """This rank's contribution: +inf everywhere except its notice's row."""
    table = torch.full((len(_KINDS), 4), math.inf, dtype=torch.float64)
    if notice is not None:
        row = table[_KINDS.index(notice.kind)]
        row[_DEADLINE] = notice.deadline
        row[_RECEIVED] = notice.received_at
        row[_SOURCE] = _SOURCES.index(notice.source)
        row[_TERMINAL] = -1.0 if notice.terminal else 0.0
    return table


def decode(table: torch.Tensor) -> Notice | None:
    """The most urgent notice in a (reduced) table."""
    rows = table.detach().to("cpu", torch.float64).tolist()
    notices = []
    for kind, row in zip(_KINDS, rows, strict=True):
        if math.isinf(row[_DEADLINE]):
            continue
        notices.append(
            Notice(
                kind=kind,
                source=_SOURCES[int(row[_SOURCE])],
                received_at=row[_RECEIVED],
                deadline=max(row[_DEADLINE], row[_RECEIVED]),
                terminal=row[_TERMINAL] < 0 and kind != NoticeKind.REBALANCE,
            )
        )
    return most_urgent(notices)


def agree(pending: Notice | None, group: dist.ProcessGroup | None = None) -> Notice | None:
    """The most urgent notice pending on any rank of ``group``; the same on every rank.

    A collective: every rank of ``group`` must call it at the same step boundary. Pass
    a gloo group (e.g. the checkpoint group) to keep it off the accelerator; with NCCL
    the table travels through the current CUDA device. Without an initialised process
    group (a single process) the local notice is the answer.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return decode(encode(pending))
    table = encode(pending)
    if dist.get_backend(group) == "nccl":
        table = table.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(table, op=dist.ReduceOp.MIN, group=group)
    return decode(table)
