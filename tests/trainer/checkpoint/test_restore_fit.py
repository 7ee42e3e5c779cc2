"""Restore takes what a checkpoint has: parts another loop or device did not save keep
their state; a checkpoint that cannot fit the model is a one-line exit 2."""

from __future__ import annotations

import logging

import pytest
import torch

from ftfleet.contract import EXIT_CONFIG
from ftfleet.trainer.checkpoint import state as state_module
from ftfleet.trainer.checkpoint.safe_load import CheckpointMismatch
from tests.trainer.conftest import in_process_manager


class Counter:
    """A user's Stateful extra."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, sd: dict) -> None:
        self.value = int(sd["value"])


def saved_at(ckpt_dir, step: int = 3, **parts):
    mgr = in_process_manager(ckpt_dir, **parts)
    mgr.app_state.progress.step = step
    mgr.save(step, blocking=True)
    mgr.close()
    return mgr


def test_a_cpu_checkpoint_loads_where_the_state_also_has_cuda_rng(tmp_path, monkeypatch):
    saved_at(tmp_path)
    real = state_module.capture_rng

    def with_cuda() -> dict:  # what capture_rng returns on a machine with a GPU
        return {**real(), "cuda": torch.zeros(16, dtype=torch.uint8)}

    monkeypatch.setattr(state_module, "capture_rng", with_cuda)
    mgr = in_process_manager(tmp_path)
    restored = mgr.restore()
    assert restored is not None and restored.step == mgr.app_state.progress.step == 3
    mgr.close()


def test_extras_and_per_rank_parts_the_checkpoint_lacks_keep_their_state(tmp_path, caplog):
    saved_at(tmp_path)
    ema, loader = Counter(5), Counter(9)
    mgr = in_process_manager(tmp_path, extras={"ema": ema}, per_rank={"loader": loader})
    with caplog.at_level(logging.INFO, logger="ftfleet.ckpt"):
        assert mgr.restore().step == 3
    mgr.close()
    assert (ema.value, loader.value) == (5, 9)
    assert "extras.ema.value" in caplog.text and "loader_rank0.value" in caplog.text


def test_extras_and_per_rank_parts_round_trip(tmp_path):
    saved_at(tmp_path, extras={"ema": Counter(5)}, per_rank={"loader": Counter(9)})
    ema, loader = Counter(0), Counter(0)
    mgr = in_process_manager(tmp_path, extras={"ema": ema}, per_rank={"loader": loader})
    assert mgr.restore().step == 3
    mgr.close()
    assert (ema.value, loader.value) == (5, 9)


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.d_model=48", ["model.", "shape [", "in the checkpoint and shape ["]),
        ("model.n_layers=3", ["model.blocks.2.", "is not in the checkpoint"]),
        ("model.n_layers=1", ["the checkpoint has model.blocks.1.", "which this model does not"]),
    ],
)
def test_a_checkpoint_that_does_not_fit_the_model_is_exit_2_in_one_line(tmp_path, override, words):
    saved_at(tmp_path)
    mgr = in_process_manager(tmp_path, override, "checkpoint.force_load=true")
    with pytest.raises(CheckpointMismatch) as err:
        mgr.restore()
    mgr.close()
    message = str(err.value)
    assert err.value.exit_code == EXIT_CONFIG and "\n" not in message
    assert message.startswith("checkpoint step-3 in ") and "checkpoint.load=false" in message
    for word in words:
        assert word in message, message
