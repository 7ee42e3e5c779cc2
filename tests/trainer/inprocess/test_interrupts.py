"""An in-process restart's request (nvidia-resiliency-ext raises ``RankShouldRestart``, a
BaseException, asynchronously in the training thread) must reach the wrapper even when
it lands inside torch.distributed.checkpoint, which wraps whatever its collective steps
raise into a CheckpointException. Found in the goodput bench: a rank SIGKILLed during a
synchronous save; the survivor's request became "the save failed", the wrapper saw only
the collective's error and gave the process up (``InternalError``) instead of restarting
it, and the run stood still until the next failure replaced the node."""

from __future__ import annotations

import traceback

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import ftfleet.trainer.checkpoint.manager as manager_module
from ftfleet.errors import interrupt_in
from tests.trainer.conftest import in_process_manager


class Restart(BaseException):
    """Stands for nvidia-resiliency-ext's RankShouldRestart."""


def _wrapped(error: BaseException, rank: int = 0) -> CheckpointException:
    return CheckpointException("save failed", {rank: (error, traceback.StackSummary())})


def test_an_interrupt_is_found_where_dcp_or_a_handler_hid_it():
    request = Restart()
    assert interrupt_in(_wrapped(request), rank=0) is request
    assert interrupt_in(_wrapped(request), rank=1) is None  # another rank's, for that rank to handle
    assert interrupt_in(_wrapped(RuntimeError("gloo: connection closed")), rank=0) is None
    try:
        try:
            raise request
        except Restart:
            raise ValueError("raised while handling it") from None  # __cause__ cleared, __context__ kept
    except ValueError as exc:
        assert interrupt_in(exc) is request
    assert interrupt_in(KeyboardInterrupt()) is not None
    assert interrupt_in(RuntimeError("plain")) is None


def test_a_synchronous_save_passes_a_restart_request_on(tmp_path, monkeypatch):
    ckpt = in_process_manager(tmp_path, "checkpoint.async_save=false")
    request = Restart()

    def interrupted(*args, **kwargs):
        raise _wrapped(request)

    try:
        monkeypatch.setattr(manager_module.dcp, "save", interrupted)
        with pytest.raises(Restart) as raised:
            ckpt.save(1)
        assert raised.value is request
        # A plain failure is still a failed save, reported by the commit, not raised here.
        monkeypatch.setattr(
            manager_module.dcp, "save", lambda *a, **k: (_ for _ in ()).throw(_wrapped(RuntimeError("disk")))
        )
        ckpt.save(2)
        assert ckpt.wait() is None
    finally:
        monkeypatch.setattr(manager_module.dcp, "save", dcp.save)
        ckpt.close()
