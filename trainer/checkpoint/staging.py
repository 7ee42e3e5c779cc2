"""The stager of asynchronous saves: DCP's ``DefaultStager``, ordered after the training
stream's work.

On an accelerator, ``DefaultStager`` copies the state to host memory on a stream of its
own, from a background thread, with non-blocking copies. Nothing orders that stream
after the training stream, whose last optimizer step (or FSDP's all-gather) may still be
queued when ``save()`` is called: the copy could read parameters while they are being
written. :class:`OrderedStager` records an event on the caller's current stream when
the save is requested and makes the staging stream wait for it before the first copy.
The host does not wait. On CPU there are no streams and both are no-ops.

torch 2.11's ``DefaultStager`` closes its ``StateDictStager`` at the end of every
stage, which empties the copier table that only its constructor fills: the second save
through a stager kept across saves fails with ``KeyError: <class 'type'>``
(pytorch/pytorch#183413; seen on an H100 with torch 2.11.0+cu130, the CPU build of
2.13 keeps the table). :func:`reopen` gives such a stager a new ``StateDictStager``
before each stage; where the table survives it changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def _accelerator_stream() -> Any:
    return torch.accelerator.current_stream() if torch.accelerator.is_available() else None


def reopen(stager: DefaultStager) -> None:
    """Give ``stager`` a new ``StateDictStager`` when the previous stage closed its own
    (torch 2.11, see the module's docstring); otherwise nothing (its cached buffers are
    kept for the next stage)."""
    inner = stager._state_dict_stager
    if not getattr(inner, "_deepcopy_dispatch", None):
        options = stager._config
        stager._state_dict_stager = StateDictStager(
            pin_memory=options.use_pinned_memory, share_memory=options.use_shared_memory
        )


class OrderedStager(DefaultStager):
    """``current_stream``: returns the caller's stream (None: no streams, on CPU); a seam
    for tests."""

    def __init__(self, options: StagingOptions, *, current_stream: Callable[[], Any] = _accelerator_stream) -> None:
        super().__init__(options)
        self._current_stream = current_stream

    def stage(self, state_dict: Any, **kwargs: Any) -> Any:
        # On the training thread, when the save is requested: everything queued on its
        # stream so far is what the checkpoint must hold.
        stream = self._current_stream()
        ready = stream.record_event() if stream is not None else None
        return super().stage(state_dict, ready=ready, **kwargs)

    def _stage(self, state_dict: Any, ready: Any = None, **kwargs: Any) -> Any:
        reopen(self)
        if ready is not None and self._staging_stream is not None:
            self._staging_stream.wait_event(ready)
        return super()._stage(state_dict, **kwargs)
