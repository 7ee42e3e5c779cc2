"""Each rank's buffers (running statistics) in the checkpoint and in state_sha256.

FSDP2 leaves every rank its own buffers; DCP writes one copy of a key that every rank
saves. The scenario with 2 ranks is tests/trainer/scenarios/test_vision.py; here, one
process plays the ranks (``AppState(rank=...)``) against a DCP checkpoint."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from ftfleet.trainer.checkpoint.safe_load import load_into, load_offline
from ftfleet.trainer.checkpoint.state import (
    AppState,
    borrowed_buffers,
    checkpoint_state,
    hashed_state,
    model_buffers,
    state_sha256,
)


def bn_model(mean: float) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model[1].running_mean.fill_(mean)
    return model


def app(mean: float, rank: int) -> AppState:
    model = bn_model(mean)
    return AppState(model, torch.optim.SGD(model.parameters(), lr=0.1), rank=rank)


def test_the_buffers_are_the_persistent_plain_tensors_by_their_state_dict_key():
    model = bn_model(0.0)
    model.register_buffer("cache", torch.zeros(1), persistent=False)
    assert set(model_buffers(model)) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}


def test_each_rank_saves_its_own_buffers_and_loads_them_back(tmp_path):
    dcp.save({"app": app(3.0, rank=0)}, checkpoint_id=tmp_path / "ck")
    again = app(0.0, rank=0)
    load_into({"app": again}, tmp_path / "ck")
    assert torch.equal(again.model[1].running_mean, torch.full((2,), 3.0))


def test_a_rank_the_writer_did_not_have_loads_rank_0s_buffers(tmp_path):
    """Not the model entry's copy, which may be any writer's (here rank 1's)."""
    written = app(3.0, rank=0).state_dict()
    written["model"] = app(1.0, rank=1).state_dict()["model"]
    dcp.save({"app": written}, checkpoint_id=tmp_path / "ck")
    newcomer = app(0.0, rank=2)
    newcomer.include_rng = False  # as the manager sets it: rank 2 >= the writer's world size
    load_into({"app": newcomer}, tmp_path / "ck")
    assert torch.equal(newcomer.model[1].running_mean, torch.full((2,), 3.0))


def test_a_checkpoint_without_per_rank_buffers_loads_the_model_entrys(tmp_path):
    """As one written before the buffers were kept per rank: the model entry's values,
    not the live ones the load's template held."""
    model = bn_model(3.0)
    dcp.save({"app": {"model": model.state_dict()}}, checkpoint_id=tmp_path / "ck")
    again = AppState(bn_model(0.0), rank=0)
    load_into({"app": again}, tmp_path / "ck")
    assert torch.equal(again.model[1].running_mean, torch.full((2,), 3.0))


def test_the_hash_covers_the_buffers_of_each_rank_that_differ_from_rank_0s():
    model = {"w": torch.ones(2), "bn": torch.zeros(2)}
    same = hashed_state(model, {}, {0: {"bn": torch.zeros(2)}, 1: {"bn": torch.zeros(2)}})
    # Buffers that agree: the hash of the model and optimizer alone.
    assert set(same) == {"model", "optim"} and state_sha256(same) == state_sha256({"model": model, "optim": {}})
    differ = hashed_state(model, {}, {0: {"bn": torch.zeros(2)}, 1: {"bn": torch.ones(2)}})
    assert set(differ["buffers"]) == {"1"} and state_sha256(differ) != state_sha256(same)


def test_a_checkpoints_hash_takes_rank_0s_buffers_whichever_copy_the_model_entry_kept(tmp_path):
    """DCP keeps one rank's copy of the model entry's buffers; the hash is rank 0's view,
    as the live summary's (gathered onto rank 0) is."""
    rank1 = app(1.0, rank=1).state_dict()
    rank0 = app(0.0, rank=0).state_dict()
    kept_rank1s_copy = {**rank0, "model": rank1["model"], "buffers_rank1": rank1["buffers_rank1"]}
    live = hashed_state(
        app(0.0, rank=0).state_dict()["model"],
        rank0["optim"],
        {0: model_buffers(bn_model(0.0)), 1: model_buffers(bn_model(1.0))},
    )
    assert state_sha256(checkpoint_state(kept_rank1s_copy)) == state_sha256(live)
    dcp.save({"app": app(0.0, rank=0)}, checkpoint_id=tmp_path / "ck")
    assert "buffers" not in checkpoint_state(load_offline(tmp_path / "ck")["app"])


def test_an_in_memory_snapshot_restores_each_ranks_buffers():
    from ftfleet.trainer.checkpoint.memory.format import prepare

    saved = app(3.0, rank=1).state_dict()
    live = app(0.0, rank=1)
    live.load_state_dict(prepare(live, saved))
    assert torch.equal(live.model[1].running_mean, torch.full((2,), 3.0))


def test_ranks_a_checkpoint_lacks_are_named_in_one_line_with_the_buffers_they_borrow():
    line = borrowed_buffers(bn_model(0.0), written=2, world=4)
    assert "ranks 2-3 start from rank 0's buffers (1.running_mean, 1.running_var, 1.num_batches_tracked)" in line
    assert "\n" not in line and "world size" in line
    assert borrowed_buffers(bn_model(0.0), written=2, world=2) is None
    assert borrowed_buffers(nn.Linear(2, 2), written=1, world=4) is None  # no buffers
