"""The in-memory snapshot tier in one process: what is taken for a complete snapshot and
what is skipped (torn, corrupt, foreign), and the ring of copies."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from ftfleet.contract import RESERVE_DIR, reserved_name
from ftfleet.errors import ConfigError
from ftfleet.trainer.checkpoint import memory
from ftfleet.trainer.checkpoint.manifest import Crc32c
from ftfleet.trainer.checkpoint.memory import (
    Ring,
    SnapshotMismatch,
    buffer_reader,
    copy_into,
    decode,
    encode,
    prepare,
    views,
)
from ftfleet.trainer.checkpoint.state import state_sha256
from tests.trainer.conftest import in_process_manager


def _manager(tmp_path, *overrides):
    return in_process_manager(
        tmp_path / "ckpt", "checkpoint.memory=true", f"checkpoint.memory_root={tmp_path / 'shm'}", *overrides
    )


def _config(tmp_path, *overrides):
    """The config _manager's manager is made from."""
    from ftfleet.trainer.config import load_config
    from tests.trainer.conftest import BASE, CONFIG

    memory = ("checkpoint.memory=true", f"checkpoint.memory_root={tmp_path / 'shm'}")
    return load_config(CONFIG, [*BASE, f"checkpoint.dir={tmp_path / 'ckpt'}", *memory, *overrides], environ={})


def _model_hash(manager) -> str:
    return state_sha256(manager.app_state.model.state_dict())


def _stall_snapshot_threads(monkeypatch):
    """Snapshot threads stop at the CRC until ``release`` is set; ``entered`` says one
    got there (the copy is taken, the rest waits)."""
    import threading

    from ftfleet.trainer.checkpoint import memory

    release, entered = threading.Event(), threading.Event()
    crc = memory.Staged.crc

    def stalled_crc(self):
        entered.set()
        release.wait(60)
        return crc(self)

    monkeypatch.setattr(memory.Staged, "crc", stalled_crc)
    return release, entered


def _two_snapshots(tmp_path):
    """Snapshots of step 2 and step 4 (different weights); returns the hash of step 2's."""
    m = _manager(tmp_path)
    m.app_state.progress.step = 2
    m.snapshot(blocking=True, step=2)
    at_2 = _model_hash(m)
    with torch.no_grad():
        for p in m.app_state.model.parameters():
            p.add_(1.0)
    m.app_state.progress.step = 4
    m.snapshot(blocking=True, step=4)
    assert _model_hash(m) != at_2
    return m.snapshots.tier.own_dir, at_2


def test_the_newest_snapshot_restores_the_state_it_was_taken_from(tmp_path):
    m = _manager(tmp_path)
    m.app_state.progress.step = 3
    m.snapshot(blocking=True, step=3)
    taken = _model_hash(m)
    fresh = _manager(tmp_path)
    with torch.no_grad():
        for p in fresh.app_state.model.parameters():
            p.mul_(0.5)
    assert _model_hash(fresh) != taken
    found = fresh.restore()
    assert (found.step, found.tier) == (3, "memory")
    assert _model_hash(fresh) == taken and fresh.app_state.progress.step == 3


def test_a_snapshot_without_its_manifest_is_not_listed(tmp_path):
    own, at_2 = _two_snapshots(tmp_path)
    (own / "step-4" / "manifest.json").unlink()  # killed before the manifest's rename
    fresh = _manager(tmp_path)
    assert fresh.restore().step == 2
    assert _model_hash(fresh) == at_2


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_torn_or_corrupt_snapshot_is_skipped_with_a_warning(tmp_path, caplog, damage):
    own, at_2 = _two_snapshots(tmp_path)
    path = own / "step-4" / "__0.snap"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = _manager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        found = fresh.restore()
    assert found.step == 2 and _model_hash(fresh) == at_2
    expected = "(torn)" if damage == "truncate" else "(corrupt)"
    assert any("step 4 of rank 0 (own) skipped" in r.message and expected in r.message for r in caplog.records)


def _stepped(manager):
    """One AdamW update with unit gradients: the optimizer has state to snapshot."""
    for p in manager.app_state.model.parameters():
        p.grad = torch.ones_like(p)
    manager.app_state.optimizer.step()
    manager.app_state.optimizer.zero_grad(set_to_none=True)


def _counting_steps(optimizer, monkeypatch) -> list[int]:
    calls: list[int] = []
    step = optimizer.step
    monkeypatch.setattr(optimizer, "step", lambda *a, **k: calls.append(1) or step(*a, **k))
    return calls


@pytest.mark.parametrize(
    "tier, extra, init_steps",
    [("memory", (), 0), ("local", (), 0), ("local", ("checkpoint.force_load=true",), 1)],
    ids=["memory", "local", "local-forced"],
)
def test_a_restore_makes_a_fresh_optimizers_state_at_most_once_and_loads_it_exactly(
    tmp_path, monkeypatch, tier, extra, init_steps
):
    """A fresh optimizer has no state. From memory, the snapshot's own state is the
    load's template (written at this world size: no step); from the disk tier, empty
    tensors laid out as the checkpoint's metadata says (the same config: the same
    optimizer). A checkpoint of another config (force_load) gets the template from a
    zero-lr step, once per restore (not again by set_state_dict). What is loaded is the
    saved state, bit for bit."""
    m = _manager(tmp_path)
    _stepped(m)
    m.app_state.progress.step = 3
    if tier == "memory":
        m.snapshot(blocking=True, step=3)
    else:
        m.save(3, blocking=True)
    saved = state_sha256(m.app_state.optimizer.state_dict())
    fresh = _manager(tmp_path, *(["checkpoint.memory=false"] if tier == "local" else []), *extra)
    calls = _counting_steps(fresh.app_state.optimizer, monkeypatch)
    found = fresh.restore()
    assert (found.step, found.tier) == (3, tier)
    assert len(calls) == init_steps
    assert state_sha256(fresh.app_state.optimizer.state_dict()) == saved


def test_the_optimizer_layout_of_a_checkpoint_is_empty_tensors_shaped_like_the_parameters(tmp_path):
    """What a disk restore adopts as the template: the checkpoint's optimizer entries,
    empty, each of its parameter's shape (scalars as scalars); None for a model the
    checkpoint does not fit, so that the load refuses it as before."""
    from ftfleet.trainer.checkpoint.safe_load import read_metadata_file
    from ftfleet.trainer.checkpoint.state import optimizer_layout

    m = _manager(tmp_path, "checkpoint.memory=false")
    _stepped(m)
    m.save(1, blocking=True)
    metadata = read_metadata_file(m.local.step_dir(1) / ".metadata")
    app = m.app_state
    layout = optimizer_layout(metadata, app.model, app.optimizer, ("app", "optim"))
    params = dict(app.model.named_parameters())
    assert set(layout["state"]) == set(params)
    assert [len(g["params"]) for g in layout["param_groups"]] == [len(g["params"]) for g in app.optimizer.param_groups]
    for name, entry in layout["state"].items():
        assert set(entry) == {"step", "exp_avg", "exp_avg_sq"} and entry["step"].dim() == 0
        assert entry["exp_avg"].shape == entry["exp_avg_sq"].shape == params[name].shape
    other = _manager(tmp_path / "other", "checkpoint.memory=false", "model.d_model=16")
    assert optimizer_layout(metadata, other.app_state.model, other.app_state.optimizer, ("app", "optim")) is None


def test_a_failed_restore_leaves_a_fresh_optimizer_without_state(tmp_path):
    """The state a template made for a load that did not complete goes: a run that then
    starts from scratch finds its optimizer as new (AdamW's step count at 0)."""
    m = _manager(tmp_path)
    _stepped(m)
    m.app_state.progress.step = 3
    m.snapshot(blocking=True, step=3)
    path = m.snapshots.tier.own_dir / "step-3" / "__0.snap"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = _manager(tmp_path)
    assert fresh.restore() is None
    assert not fresh.app_state.optimizer.state and not fresh.app_state.loading


def test_a_snapshot_whose_optimizer_state_does_not_fit_falls_back_to_the_init_step(tmp_path, monkeypatch):
    """A saved optimizer entry of another shape is not adopted as the template: the
    template comes from the init step, and the mismatch is refused in one line."""
    m = _manager(tmp_path)
    _stepped(m)
    saved = m.app_state.state_dict()
    name = next(iter(saved["optim"]["state"]))
    saved["optim"]["state"][name]["exp_avg"] = torch.zeros(3)
    fresh = _manager(tmp_path / "fresh")
    calls = _counting_steps(fresh.app_state.optimizer, monkeypatch)
    fresh.app_state.loading = True
    try:
        assert not fresh.app_state.adopt_optimizer_state(saved["optim"])
        with pytest.raises(SnapshotMismatch, match=rf"^/optim/state/{name}/exp_avg: torch.float32 \(3,\) in the"):
            prepare(fresh.app_state, saved)
        assert len(calls) == 1
    finally:
        fresh.app_state.loading = False
    assert not fresh.app_state.optimizer.state


def test_a_snapshot_of_another_config_is_skipped_and_nothing_is_loaded(tmp_path, caplog):
    _two_snapshots(tmp_path)
    other = _manager(tmp_path, "model.d_model=16")
    before = _model_hash(other)
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        assert other.restore() is None
    assert _model_hash(other) == before and other.app_state.progress.step == 0
    assert any("step-4: config hash" in r.message for r in caplog.records)


def test_a_snapshot_that_does_not_fit_the_live_state_is_refused_in_one_line(tmp_path):
    m = _manager(tmp_path)
    payload = encode(m.app_state.state_dict())
    saved = decode(buffer_reader(payload), len(payload))
    other = _manager(tmp_path / "other", "model.d_model=16")
    line = r"^/model/tok_emb.weight: torch.float32 \(64, 32\) in the snapshot, live torch.float32 \(64, 16\)$"
    with pytest.raises(SnapshotMismatch, match=line):
        prepare(other.app_state, saved)
    with pytest.raises(SnapshotMismatch, match="not a snapshot file"):
        decode(buffer_reader(b"not a snapshot at all"), 21)


def test_a_newer_checkpoint_on_disk_wins_over_an_older_snapshot(tmp_path):
    m = _manager(tmp_path)
    m.app_state.progress.step = 2
    m.snapshot(blocking=True, step=2)
    m.app_state.progress.step = 4
    m.save(4, blocking=True)
    found = _manager(tmp_path).restore()
    assert (found.step, found.tier) == (4, "local")


def test_a_save_is_written_from_the_snapshot_of_its_step_and_training_waits_for_no_copy(tmp_path):
    m = _manager(tmp_path)
    m.app_state.progress.step = 3
    m.snapshot(blocking=True, step=3)
    taken = _model_hash(m)
    with torch.no_grad():  # changed after the snapshot: the save must not see it
        for p in m.app_state.model.parameters():
            p.add_(1.0)
    m.save(3)
    assert m._staging is None  # nothing to wait for before the next optimizer step
    assert m.wait(raise_on_error=True).step == 3
    # A save at a step without a snapshot takes one (the copy the save writes); a
    # blocking save (final, emergency) writes the live state, at full priority.
    m.app_state.progress.step = 5
    m.save(5)
    assert m.snapshots.latest_step == 5 and m._staging is None
    assert m.wait(raise_on_error=True).step == 5
    m.app_state.progress.step = 6
    m.save(6, blocking=True)
    assert m.snapshots.latest_step == 5
    m.close()

    fresh = _manager(tmp_path, "checkpoint.memory=false", "checkpoint.load_step=3")
    found = fresh.restore()
    assert (found.step, found.tier) == (3, "local")
    assert _model_hash(fresh) == taken and fresh.app_state.progress.step == 3
    fresh = _manager(tmp_path, "checkpoint.memory=false", "checkpoint.load_step=5")
    assert fresh.restore().step == 5
    assert _model_hash(fresh) == _model_hash(m)


def test_only_the_newest_snapshots_are_kept_and_retired_files_are_reused(tmp_path):
    m = _manager(tmp_path, "checkpoint.memory_keep=1")
    own = m.snapshots.tier.own_dir
    inodes = {}
    for step in (1, 2, 3):
        m.app_state.progress.step = step
        m.snapshot(blocking=True, step=step)
        inodes[step] = (own / f"step-{step}" / "__0.snap").stat().st_ino
    assert m.snapshots.tier.steps(own) == [3]
    # One retired directory is kept, without its manifest, for the next snapshot to
    # overwrite: step 3 was written over step 1's file (no new pages in /dev/shm).
    assert sorted(p.name for p in own.iterdir()) == [".free-2", "step-3"]
    assert not (own / ".free-2" / "manifest.json").exists()
    assert inodes[3] == inodes[1] != inodes[2]
    assert _manager(tmp_path).restore().step == 3


def test_the_ring_gives_each_node_the_next_nodes_copy():
    ring = [Ring(r, 6, 2) for r in range(6)]  # 3 nodes of 2 ranks
    assert [x.peer_of(x.rank) for x in ring] == [2, 3, 4, 5, 0, 1]
    assert [x.holder_of(x.rank) for x in ring] == [4, 5, 0, 1, 2, 3]
    assert all(ring[x.holder_of(x.rank)].peer_of(x.holder_of(x.rank)) == x.rank for x in ring)


def _planner(replicas: dict[int, list[int]]):
    """A Snapshots whose restore plan can be asked for (4 ranks as 4 nodes)."""
    import types

    from ftfleet.trainer.checkpoint.memory.snapshots import Snapshots

    snaps = object.__new__(Snapshots)
    snaps.tier = types.SimpleNamespace(ring=Ring(0, 4, 1))
    snaps._replicas = replicas
    return snaps


#: HSDP with 2 replica groups of 2 ranks: ranks 0 and 2 hold the same shards, 1 and 3.
HSDP_PAIRS = {0: [2], 2: [0], 1: [3], 3: [1]}


def test_a_lost_rank_is_planned_from_its_live_replica_before_its_holders_copy():
    # Node 1 is gone (no own snapshots of rank 1); rank 0 holds its copy of step 9 only.
    listings = [([10, 9], [9]), ([], []), ([10, 9], []), ([10, 9], [])]
    snaps = _planner(HSDP_PAIRS)
    assert snaps._plan(listings, set(), None) == (10, {0: ("own", 0), 1: ("replica", 3), 2: ("own", 2), 3: ("own", 3)})
    # The replica's snapshot of 10 failed its fetch: step 10 cannot be had, 9 from the copy.
    failed = {(10, 1, ("replica", 3))}
    assert snaps._plan(listings, failed, None) == (9, {0: ("own", 0), 1: ("replica", 3), 2: ("own", 2), 3: ("own", 3)})
    assert snaps._plan(listings, failed | {(9, 1, ("replica", 3))}, None)[1][1] == ("peer", 0)
    # Without replicas (plain FSDP) the copy is the only source: step 9.
    plain = _planner({})._plan(listings, set(), None)
    assert plain == (9, {0: ("own", 0), 1: ("peer", 0), 2: ("own", 2), 3: ("own", 3)})
    # Both replicas of a shard gone, and no copy: nothing in memory.
    assert _planner(HSDP_PAIRS)._plan([([10], []), ([], []), ([10], []), ([], [])], set(), None) is None


def test_a_replicas_snapshot_becomes_this_ranks_state_with_this_ranks_own_entries():
    from ftfleet.trainer.checkpoint.memory.snapshots import REPLICA_ENTRIES, as_rank
    from ftfleet.trainer.checkpoint.state import rank_entries

    mine = {"rng_rank1": "r1", "buffers_rank1": "b1", "data_rank1": "d1"}
    saved = {"model": "m", "rng_rank3": "r3", "data_rank3": "d3", "data_rank31": "x", REPLICA_ENTRIES: {1: mine}}
    assert rank_entries(saved, 3) == {"rng_rank3": "r3", "data_rank3": "d3"}  # not rank 31's
    assert as_rank(saved, 3, 1) == {"model": "m", "data_rank31": "x", **mine}
    assert as_rank(saved, 3, 3) == {"model": "m", "rng_rank3": "r3", "data_rank3": "d3", "data_rank31": "x"}
    with pytest.raises(SnapshotMismatch, match="rank 3's snapshot holds no entries of rank 0"):
        as_rank(saved, 3, 0)


@pytest.mark.parametrize(
    "override, fix",
    [("checkpoint.memory_keep=3", "use 1 or 2"), ("checkpoint.ranks_per_node=-1", "use 0")],
)
def test_bad_memory_settings_name_the_fix(tmp_path, override, fix):
    with pytest.raises(ConfigError, match=fix):
        _manager(tmp_path, override)


def test_a_snapshot_file_round_trips_every_kind_of_tensor_and_value():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {
        "strided": base.t(),  # not contiguous
        "bf16": torch.randn(5, dtype=torch.bfloat16),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "flags": torch.tensor([True, False, True]),
        "ints": torch.arange(7, dtype=torch.int64),
        "plain": {"step": 12, "name": "run", "lr": [0.1, None], "pair": (1, "a")},
    }
    data = encode(state)
    back = decode(buffer_reader(data), len(data))
    assert back["plain"] == state["plain"]
    for key in ("strided", "bf16", "scalar", "empty", "flags", "ints"):
        assert back[key].dtype == state[key].dtype and back[key].shape == state[key].shape
        assert torch.equal(back[key], state[key]), key
    with pytest.raises(SnapshotMismatch, match="torn"):
        decode(buffer_reader(data[: len(data) - 5]), len(data))
    # For a save written from the snapshot: views of its bytes, each tensor's storage
    # exactly its own bytes (DCP's writer would copy a view of a larger storage).
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    seen = views(raw)
    assert seen["plain"] == state["plain"]
    lo, hi = raw.data_ptr(), raw.data_ptr() + raw.numel()
    for key in ("strided", "bf16", "scalar", "flags", "ints"):
        t = seen[key]
        assert torch.equal(t, state[key]) and t.dtype == state[key].dtype, key
        assert t.untyped_storage().nbytes() == t.nbytes and lo <= t.data_ptr() < hi, key
    assert seen["empty"].shape == (0, 3)


class _Marked(torch.Tensor):
    """A tensor subclass: its bytes are not assumed to be its elements."""


@pytest.fixture
def moved(monkeypatch) -> list[int]:
    """The sizes of the copies ``copy_into`` made as ``memmove`` calls."""
    sizes: list[int] = []
    real = memory.format.ctypes.memmove

    def memmove(dst: int, src: int, n: int) -> int:
        sizes.append(n)
        return real(dst, src, n)

    monkeypatch.setattr(memory.format.ctypes, "memmove", memmove)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # as under torchrun
    return sizes


_BASE = torch.randn(6, 8)


@pytest.mark.parametrize(
    "src, as_bytes",
    [
        pytest.param(_BASE, True, id="dense"),
        pytest.param(_BASE[2:5], True, id="slice-at-an-offset"),
        pytest.param(torch.randn(33, dtype=torch.bfloat16), True, id="bf16"),
        pytest.param(torch.tensor(7, dtype=torch.int64), True, id="scalar"),
        pytest.param(_BASE.t(), False, id="transposed"),
        pytest.param(_BASE[:, ::2], False, id="every-other-column"),
        pytest.param(torch.randn(1, 8).expand(4, 8), False, id="expanded"),
        pytest.param(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), False, id="channels-last"),
        pytest.param(torch.randn(5, dtype=torch.complex64).conj(), False, id="conjugate-bit"),
        pytest.param(torch._neg_view(torch.randn(5)), False, id="negative-bit"),  # contiguous, bytes not negated
        pytest.param(torch.randn(4).as_subclass(_Marked), False, id="subclass"),
    ],
)
def test_a_dense_host_tensor_is_copied_as_its_bytes_anything_else_through_torch(moved, src, as_bytes):
    nbytes = src.numel() * src.element_size()
    out = torch.full((nbytes + 128,), 0xAB, dtype=torch.uint8)
    dst = out[64 : 64 + nbytes]  # a slice of a larger buffer, as in a snapshot file
    copy_into(dst, src)
    assert moved == ([nbytes] if as_bytes else [])
    expect = src.resolve_conj().resolve_neg().as_subclass(torch.Tensor)
    assert torch.equal(dst.view(src.dtype).view(src.shape), expect)
    assert bool((out[:64] == 0xAB).all()) and bool((out[64 + nbytes :] == 0xAB).all())  # nothing beyond it


def test_with_several_torch_threads_the_copy_is_torchs(moved, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    src = torch.randn(64)
    dst = torch.empty(src.numel() * 4, dtype=torch.uint8)
    copy_into(dst, src)
    assert moved == [] and torch.equal(dst.view(torch.float32), src)


def test_a_snapshot_copies_its_dense_tensors_as_bytes_and_round_trips(moved):
    state = {"w": torch.randn(16, 4), "m": torch.randn(64).t(), "strided": _BASE.t(), "step": 3}
    data = encode(state)
    assert sorted(moved) == sorted([16 * 4 * 4, 64 * 4])  # the transposed view went through copy_
    back = decode(buffer_reader(data), len(data))
    assert back["step"] == 3 and all(torch.equal(back[k], state[k]) for k in ("w", "m", "strided"))


@pytest.mark.parametrize("most", [None, 1000], ids=["whole-reads", "short-reads"])
def test_a_restore_reads_and_checksums_in_slices(monkeypatch, most):
    monkeypatch.setattr(memory.format, "READ_SLICE", 4096)
    state = {"w": torch.randn(10_000), "b": torch.arange(3), "step": 5}
    data = encode(state)
    inner, asked = buffer_reader(data), []

    def read(view: memoryview) -> int:  # a file may return less than asked
        asked.append(view.nbytes)
        return inner(view[:most] if most else view)

    crc = Crc32c()
    back = decode(read, len(data), crc)
    assert max(asked) <= 4096 and sum(1 for n in asked if n == 4096) >= 9
    whole = Crc32c()
    whole.update(data)
    assert crc.entry() == whole.entry()
    assert back["step"] == 5 and torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])
    with pytest.raises(SnapshotMismatch, match=f"ends after {len(data) - 5000} of {len(data)} bytes"):
        decode(buffer_reader(data[:-5000]), len(data))


def test_a_superseded_snapshot_thread_writes_nothing(tmp_path, monkeypatch):
    """After an in-process restart the new iteration's manager supersedes the old one's
    snapshot thread: whatever that thread was doing, it commits no file afterwards."""
    from ftfleet.trainer.checkpoint import memory

    crc = memory.Staged.crc
    old = _manager(tmp_path)
    old.app_state.progress.step = 5
    release, entered = _stall_snapshot_threads(monkeypatch)
    old.snapshot(5)
    assert entered.wait(10) and old.snapshot_in_flight  # the copy is taken, the rest waits
    new = _manager(tmp_path)  # the restarted iteration
    release.set()
    old.snapshots.wait()
    monkeypatch.setattr(memory.Staged, "crc", crc)
    assert old.snapshots.last_complete is None
    assert not (old.snapshots.tier.own_dir / "step-5" / "manifest.json").exists()
    assert new.restore() is None
    # The old thread, and the state it held, are gone once its job ended.
    old.snapshots._worker.join(10)
    assert not old.snapshots._worker.is_alive() and new.snapshots._worker.is_alive()


def test_peer_copies_every_nth_snapshot_keep_the_copied_steps_own_snapshot(tmp_path, monkeypatch):
    """With memory_peer_every=3 only every third snapshot goes to the peer node; the own
    snapshot of the newest copied step outlives memory_keep, so that a lost node's rank
    (restoring from the copy) and the others can still restore one common step."""
    from ftfleet.trainer.checkpoint.memory import Ring
    from ftfleet.trainer.checkpoint.memory.snapshots import Snapshots

    m = _manager(tmp_path, "checkpoint.memory_keep=1", "checkpoint.memory_peer_every=3")
    snaps = m.snapshots
    # Two "nodes" seen from rank 0, with the transfer replaced by a record of what is sent.
    snaps.tier.ring = Ring(0, 2, 1)
    sent = []
    monkeypatch.setattr(
        "ftfleet.trainer.checkpoint.memory.snapshots.exchange", lambda t, r, out, g, into=None: sent.append(1) or {}
    )
    for step in range(1, 6):
        m.app_state.progress.step = step
        m.snapshot(blocking=True, step=step)
    assert isinstance(snaps, Snapshots) and len(sent) == 2  # snapshots 1 and 4
    assert snaps.copied_step == 4
    assert snaps.tier.steps(snaps.tier.own_dir) == [5, 4]


def test_a_header_naming_a_tensor_beyond_the_file_is_refused_before_allocating_it():
    import io

    from ftfleet.trainer.checkpoint.memory import MAGIC, TENSOR

    head = io.BytesIO()
    torch.save({"w": (TENSOR, 0, "float32", (10**12,))}, head)
    data = MAGIC + len(head.getvalue()).to_bytes(8, "little") + head.getvalue() + bytes(64)
    with pytest.raises(SnapshotMismatch, match="lies outside"):
        decode(buffer_reader(data), len(data))


def test_a_snapshot_is_copied_straight_into_its_file_which_stays_mapped(tmp_path, monkeypatch):
    """From the second snapshot on, the training thread copies the state into the
    snapshot's file itself (mapped, prepared by the snapshot thread): the file is not
    written after; the two files of memory_keep=1 take turns, and only files that exist
    stay mapped. The first goes through a buffer and is written by the thread."""
    from ftfleet.trainer.checkpoint import memory

    written = []
    write_to = memory.Staged.write_to

    def counted(self, path):
        written.append(path)
        write_to(self, path)

    monkeypatch.setattr(memory.Staged, "write_to", counted)
    m = _manager(tmp_path, "checkpoint.memory_keep=1")
    tier = m.snapshots.tier
    for step in range(1, 7):
        with torch.no_grad():
            for p in m.app_state.model.parameters():
                p.add_(1.0)
        m.app_state.progress.step = step
        m.snapshot(blocking=True, step=step)
        assert m.snapshots.last_complete[0] == step
    assert [p.parent.name for p in written] == ["step-1"]
    taken = _model_hash(m)
    files = {(d / "__0.snap").stat().st_ino for d in tier.own_dir.iterdir()}
    assert len(files) == 2 and {ino for _, ino in tier._maps} == files
    fresh = _manager(tmp_path)
    assert fresh.restore().step == 6 and _model_hash(fresh) == taken
    # After a restart (a new manager on the same node), the first snapshot goes straight
    # into the file retired before it: no buffer, no write, no new file.
    fresh.app_state.progress.step = 7
    fresh.snapshot(blocking=True, step=7)
    assert [p.parent.name for p in written] == ["step-1"] and fresh.snapshots.last_complete[0] == 7
    assert (fresh.snapshots.tier.own_dir / "step-7" / "__0.snap").stat().st_ino in files
    again = _manager(tmp_path)
    assert again.restore().step == 7 and _model_hash(again) == taken


def test_a_full_shared_memory_falls_back_to_writing_the_file(tmp_path, monkeypatch, caplog):
    from ftfleet.trainer.checkpoint import memory

    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(memory.tier.os, "posix_fallocate", full)
    m = _manager(tmp_path)
    for step in (1, 2):  # the second would be mapped
        m.app_state.progress.step = step
        with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
            m.snapshot(blocking=True, step=step)
    assert any("not mapped" in r.message and "No space left" in r.message for r in caplog.records)
    assert m.snapshots.last_complete[0] == 2  # staged in a buffer, then written
    taken = _model_hash(m)
    fresh = _manager(tmp_path)
    assert fresh.restore().step == 2 and _model_hash(fresh) == taken


def test_a_file_of_another_size_is_a_new_file_and_older_mappings_stay_valid(tmp_path):
    """A snapshot whose size changed (its header crossed a padding boundary) gets a new
    file: truncating the old one would turn a store or a read through an older mapping
    (an earlier iteration's thread) into a SIGBUS."""
    from ftfleet.trainer.checkpoint.memory import MemoryTier

    tier = MemoryTier(tmp_path / "shm", Ring(0, 1, 1))
    old = tier.mapped(False, 5, 1 << 20)
    old.fill_(7)
    ino = tier.path(False, 5).stat().st_ino
    new = tier.mapped(False, 5, 1 << 19)
    assert tier.path(False, 5).stat().st_size == 1 << 19 and tier.path(False, 5).stat().st_ino != ino
    old[-1] = 3  # the whole old mapping is still there (its file is orphaned, not shorter)
    assert int(old[: 1 << 19].sum()) == 7 * (1 << 19) and new.numel() == 1 << 19
    assert len(tier._maps) == 1  # the orphan's mapping was forgotten
    tier.close()


def test_a_training_thread_waiting_for_a_snapshot_can_be_interrupted(tmp_path, monkeypatch):
    """The in-process wrapper interrupts the training thread with an exception raised
    between bytecodes: waiting for a snapshot whose thread is stuck (a transfer with a
    dead peer) must not block that for good."""
    import ctypes
    import threading

    m = _manager(tmp_path)
    release, entered = _stall_snapshot_threads(monkeypatch)
    m.snapshot(1)
    assert entered.wait(10)
    outcome = []

    def training_thread():
        try:
            m.snapshots.wait()
            outcome.append("returned")
        except KeyboardInterrupt:
            outcome.append("interrupted")

    t = threading.Thread(target=training_thread)
    t.start()
    time.sleep(0.3)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(KeyboardInterrupt))
    t.join(10)
    alive = t.is_alive()
    release.set()
    t.join(10)
    assert not alive and outcome == ["interrupted"]
    m.snapshots.wait()


def test_the_exit_finalizer_and_a_closing_snapshot_thread_close_each_fd_once(tmp_path):
    """At exit the tier's finalizer and its snapshot thread's close() can run at the same
    time: the finalizer waits for the lock, so no fd is closed twice (an fd closed twice
    can close a file opened since under the same number)."""
    import os
    import threading

    from ftfleet.trainer.checkpoint.memory import MemoryTier

    tier = MemoryTier(tmp_path / "shm", Ring(0, 1, 1))
    tier.mapped(False, 1, 4096)
    with tier._maps_lock:  # the snapshot thread, in close()
        finalizer = threading.Thread(target=tier._finalizer)
        finalizer.start()
        finalizer.join(0.2)
        assert finalizer.is_alive(), "the finalizer did not wait for the lock"
        for key in list(tier._maps):
            tier._drop(key)  # raises if the finalizer closed the fd already
    finalizer.join(10)
    assert not tier._maps
    os.close(os.open(tmp_path / "probe", os.O_CREAT | os.O_RDWR))


def test_a_spare_nodes_reserve_becomes_its_first_snapshots_files(tmp_path, monkeypatch):
    """A warm spare, while it waits, allocates files sized by the newest durable
    checkpoint (trainer/inprocess/worker.py); once it trains, its first snapshot goes
    straight into one of them (no buffer, no write, no new file), cut to size, and the
    next new file comes from the reserve too."""
    from ftfleet.contract import memory_dir
    from ftfleet.trainer.checkpoint import memory
    from ftfleet.trainer.inprocess.worker import reserve_snapshot_memory, snapshot_bytes_estimate

    written = []
    write_to = memory.Staged.write_to
    monkeypatch.setattr(memory.Staged, "write_to", lambda self, path: (written.append(path), write_to(self, path)))
    m = _manager(tmp_path)
    m.app_state.progress.step = 2
    m.save(2, blocking=True)
    assert snapshot_bytes_estimate(str(tmp_path / "ckpt"), 1) > 0
    cfg = _config(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("FTFLEET_ACTIVE_WORLD_SIZE", raising=False)
    root = Path(memory_dir(cfg.checkpoint.memory_root, cfg.run_id))
    import threading

    assert reserve_snapshot_memory(cfg, threading.Event()) == cfg.checkpoint.memory_keep + 1  # own files only
    reserved = {p.stat().st_ino: p.stat().st_size for p in (root / RESERVE_DIR).iterdir()}
    assert len(reserved) == 3

    spare = _manager(tmp_path)  # the spare's trainer, on the same node's memory
    assert spare.restore().step == 2
    spare.snapshot(blocking=True, step=2)
    snap = spare.snapshots.tier.own_dir / "step-2" / "__0.snap"
    assert snap.stat().st_ino in reserved and snap.stat().st_size < reserved[snap.stat().st_ino]
    assert written == []  # straight into the reserved file: no buffer written after
    # every own file the snapshots take comes from the reserve while it lasts
    for step in (3, 4):
        spare.app_state.progress.step = step
        spare.snapshot(blocking=True, step=step)
    files = {(d / "__0.snap").stat().st_ino for d in spare.snapshots.tier.own_dir.iterdir()}
    assert files <= set(reserved) and len(files) == 3
    again = _manager(tmp_path)
    assert again.restore().step == 4


def test_the_estimate_covers_the_snapshot_and_a_reserve_too_small_is_not_used(tmp_path):
    from ftfleet.trainer.checkpoint import memory
    from ftfleet.trainer.inprocess.worker import snapshot_bytes_estimate

    m = _manager(tmp_path)
    assert snapshot_bytes_estimate(str(tmp_path / "ckpt"), 1) is None  # nothing committed yet
    m.app_state.progress.step = 2
    m.save(2, blocking=True)
    m.snapshot(blocking=True, step=2)
    size = (m.snapshots.tier.own_dir / "step-2" / "__0.snap").stat().st_size
    estimate = snapshot_bytes_estimate(str(tmp_path / "ckpt"), 1)
    assert size <= estimate <= size * 1.1 + (8 << 20)
    fresh = _manager(tmp_path / "other")
    assert memory.reserve_files(fresh.snapshots.tier.root, size - 1, 1, 0) == 1
    fresh.snapshot(blocking=True, step=1)
    reserve = fresh.snapshots.tier.root / RESERVE_DIR / reserved_name(0, 0)
    assert reserve.exists()  # one byte short: left alone, the snapshot made a new file


def test_under_hsdp_the_estimate_is_a_groups_share_of_the_whole_state(tmp_path):
    """R = 2 on 4 ranks: each shard written once, here split evenly over its two holders,
    so no rank wrote what its snapshot holds (half the state)."""
    from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest
    from ftfleet.trainer.checkpoint.tiers import LocalTier
    from ftfleet.trainer.inprocess.worker import snapshot_bytes_estimate

    quarter = 100 << 20
    files = {f"__{r}_0.distcp": FileEntry(quarter, "00000000") for r in range(4)}
    step = LocalTier(tmp_path).step_dir(8)
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(Manifest(8, "run", "", 4, files, torch_version="2").to_json())
    assert snapshot_bytes_estimate(str(tmp_path), 4) == int(quarter * 1.02) + (4 << 20)
    assert snapshot_bytes_estimate(str(tmp_path), 4, replicas=2) == int(2 * quarter * 1.02) + (4 << 20)
