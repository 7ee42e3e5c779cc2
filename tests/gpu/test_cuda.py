"""The GPU paths, on a CUDA device (skipped without one: CI has none; run them where a
GPU is lent, `make test-gpu`).

* The stager of asynchronous saves copies on a stream of its own from a background
  thread: it must wait for the training stream's queued writes (OrderedStager), which
  DCP's DefaultStager alone does not.
* In-memory snapshots copy device tensors into a pinned buffer on the training stream
  (non-blocking), ordered after its writes, and the snapshot's bytes are the tensors'.
* The fast tier's reader loads into device tensors, in two phases and in a restart's
  one pass (each piece copied to the device as its CRC is taken), and refuses a bad
  shard in one pass too.
* The trainer on the GPU (NCCL, FSDP2 over one device): a run stopped and resumed, one
  SIGKILLed and resumed from shared memory, and one whose rank is SIGKILLed under the
  in-process launcher and replaced in place by a warm spare, end bit-identical to an
  uninterrupted GPU run.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.staging import DefaultStager

from ftfleet.trainer.checkpoint.manager import staging_options
from ftfleet.trainer.checkpoint.memory import Stager, buffer_reader, decode
from ftfleet.trainer.checkpoint.staging import OrderedStager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: GPU cycles that keep the training stream busy long enough (tens of milliseconds on
#: any current GPU) for a copy on another stream to run before the queued write.
BUSY_CYCLES = 200_000_000
N = 16 << 20  # 64 MiB of float32


def _queued_write(x: torch.Tensor, value: float) -> None:
    """Queue, on the current stream, a long wait and then a write of ``value`` into ``x``:
    the host returns at once, the write lands later."""
    torch.cuda._sleep(BUSY_CYCLES)
    x.fill_(value)


def _staged_after_a_queued_write(stager) -> torch.Tensor:
    """What ``stager`` stages of a tensor whose write of ones is still queued on the
    training stream."""
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    try:
        _queued_write(x, 1.0)
        staged = stager.stage({"x": x}).result()["x"]
    finally:
        stager.close()
        torch.cuda.synchronize()
    assert staged.is_pinned()
    return staged


def test_the_save_stager_copies_what_the_training_stream_wrote_last():
    staged = _staged_after_a_queued_write(OrderedStager(staging_options(cuda=True)))
    assert torch.equal(staged, torch.ones(N)), "staged before the training stream's write"


def test_without_the_ordering_the_stager_reads_the_old_values():
    """What OrderedStager is for: DCP's stager alone copies while the training stream's
    write is still queued (this test keeps the one above honest)."""
    staged = _staged_after_a_queued_write(DefaultStager(staging_options(cuda=True)))
    assert not torch.equal(staged, torch.ones(N))


def test_a_snapshot_of_device_tensors_holds_their_last_values():
    state = {
        "w": torch.randn(1000, 257, device="cuda"),
        "half": torch.randn(33, device="cuda").to(torch.bfloat16),
        "step": torch.tensor(3),
        "meta": {"lr": 0.5, "names": ["a", "b"]},
    }
    _queued_write(state["w"], 2.0)
    stager = Stager()
    staged = stager.stage(state)
    assert not staged.in_place and staged.data.is_pinned() and staged.ready is not None
    staged.wait()
    out = decode(buffer_reader(staged.data), staged.data.numel())
    assert torch.equal(out["w"], torch.full((1000, 257), 2.0))
    assert torch.equal(out["half"], state["half"].cpu())
    assert int(out["step"]) == 3 and out["meta"] == {"lr": 0.5, "names": ["a", "b"]}
    # The buffer is kept: the next snapshot copies into the same pinned memory.
    again = stager.stage(state)
    assert again.data.data_ptr() == staged.data.data_ptr()


def on_cuda(state: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def test_the_fast_tier_reader_loads_into_device_tensors(tmp_path, monkeypatch):
    """The one-read restore copies each raw record into its device tensor through two
    pinned buffers in turns (a chunk smaller than the tensors: several turns each)."""
    from ftfleet.trainer.checkpoint import reader as reader_module
    from tests.trainer.checkpoint.test_verifying_reader import load, odd_state, save, zeros_like

    monkeypatch.setattr(reader_module, "DEVICE_CHUNK", 1000)
    state = odd_state()
    expected = save(tmp_path, state)
    target = on_cuda(zeros_like(state))
    got = load(tmp_path, target, expected)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert target[key].is_cuda and torch.equal(target[key].cpu(), value), key
    assert got.direct == 5 and got.fallback == 2


@pytest.mark.parametrize("piece", [512 << 10, 100])
def test_a_one_pass_load_into_blank_device_tensors_loads_what_the_two_pass_load_loads(tmp_path, monkeypatch, piece):
    """A restart's restore (``blank``) copies each piece into the device tensors as the
    CRC takes it, gathered in the pinned buffers (a buffer smaller than the tensors, a
    piece smaller than the records: runs break at buffer ends and between tensors)."""
    from ftfleet.trainer.checkpoint import reader as reader_module
    from tests.trainer.checkpoint.test_verifying_reader import load, odd_state, save, zeros_like

    monkeypatch.setattr(reader_module, "DEVICE_CHUNK", 1000)
    monkeypatch.setattr(reader_module, "_PIECE", piece)
    state = odd_state()
    state["big"] = torch.randn(300, 100)
    expected = save(tmp_path, state)
    two, one = on_cuda(zeros_like(state)), on_cuda(zeros_like(state))
    load(tmp_path, two, expected)
    reader = load(tmp_path, one, expected, blank=True)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert one[key].is_cuda and torch.equal(one[key].cpu(), value), key
            assert torch.equal(two[key].cpu(), value), key
    assert reader.fallback == 2 and reader.direct == 6
    assert reader._to_device is None, "a tensor went the two-phase way (only that path sets it)"


def test_a_one_pass_load_into_device_tensors_refuses_a_bad_shard(tmp_path):
    from ftfleet.trainer.checkpoint.reader import CorruptFile
    from ftfleet.trainer.checkpoint.safe_load import load_into
    from tests.trainer.checkpoint.test_verifying_reader import flip, last_shard, odd_state, save, zeros_like

    state = odd_state()
    expected = save(tmp_path, state, threads=2)
    flip(last_shard(tmp_path))
    target = on_cuda(zeros_like(state))
    with pytest.raises(CorruptFile, match=last_shard(tmp_path).name):
        load_into(target, tmp_path, expected=expected, blank=True)
    assert target["extra"] == {"name": "", "steps": []}


# ---------------------------------------------------------------------------
# The trainer on the GPU
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_ref(tmp_path_factory):
    from tests.trainer.conftest import run_trainer

    d = tmp_path_factory.mktemp("gpu") / "ref"
    s = run_trainer(1, d, "checkpoint.keep=100", timeout=300)
    assert s["device"] == "cuda", s
    s["run_dir"] = d
    return s


def test_a_gpu_run_stopped_and_resumed_ends_bit_identical(tmp_path, gpu_ref):
    from tests.trainer.conftest import ckpt_hash, run_trainer

    d = tmp_path / "run"
    first = run_trainer(1, d, "train.stop_at_step=7", timeout=300)
    assert (first["step"], first["status"]) == (7, "stopped")
    final = run_trainer(1, d, timeout=300)
    assert final["resumed_from"]["step"] == 7 and final["step"] == gpu_ref["step"]
    assert final["state_sha256"] == gpu_ref["state_sha256"]
    # The asynchronous saves (pinned staging on the GPU) hold the reference's state.
    for step in (16, 20):  # checkpoint.keep=3: 16, 20 and 24 are left
        assert ckpt_hash(d / "checkpoints" / f"step-{step}") == ckpt_hash(
            gpu_ref["run_dir"] / "checkpoints" / f"step-{step}"
        ), f"step-{step} differs"


def test_a_sigkilled_gpu_run_resumes_from_shared_memory_bit_identical(tmp_path, gpu_ref):
    from tests.trainer.conftest import LOADER_WORKERS, MEMORY, kill9, run_trainer, start_trainer, wait_for

    d, shm = tmp_path / "run", tmp_path / "shm"
    env = {"FTFLEET_SHM_DIR": str(shm)}
    own = shm / "ftfleet-t" / "node-0" / "rank-0"

    def newest() -> int:
        return max((int(p.parent.name.removeprefix("step-")) for p in own.glob("step-*/manifest.json")), default=0)

    proc = start_trainer(1, d, *MEMORY, LOADER_WORKERS, env=env)
    try:
        wait_for(lambda: newest() >= 10, 240, what="snapshot 10")
    finally:
        kill9(proc)
    snapshot = newest()
    out = run_trainer(1, d, *MEMORY, LOADER_WORKERS, env=env, timeout=300)
    assert out["resumed_from"]["tier"] == "memory" and out["resumed_from"]["step"] >= snapshot
    assert out["state_sha256"] == gpu_ref["state_sha256"]


@pytest.mark.timeout(240)
def test_a_sigkilled_gpu_rank_is_replaced_in_place_by_a_warm_spare_bit_identical(tmp_path, gpu_ref):
    """The in-process launcher on the GPU, one rank and one warm spare (NCCL takes one
    rank per GPU: one GPU lent): rank 0 SIGKILLed, the spare takes its place without a
    new process, builds the model on CUDA for a restore, restores the dead rank's
    snapshot from shared memory into device tensors, and ends bit-identical."""
    import json
    import os
    import signal
    import subprocess

    pytest.importorskip("nvidia_resiliency_ext.inprocess", reason="needs nvidia-resiliency-ext")
    from tests.trainer.conftest import BASE, LOADER_WORKERS, MEMORY, REPO, child_env, inprocess_cmd, wait_for

    run_dir, shm, log_path = tmp_path / "run", tmp_path / "shm", tmp_path / "launch.log"

    def events() -> list[dict]:
        path = run_dir / "events.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    cmd = inprocess_cmd(run_dir, *BASE, *MEMORY, LOADER_WORKERS, "train.step_events=true", nproc=1)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env({"FTFLEET_SHM_DIR": str(shm)}), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 10 for e in events()), 120, what="step 10")
        pids = [
            int(x.split()[-1]) for x in log_path.read_text().splitlines() if x.startswith("ftfleet.inprocess: process ")
        ]
        os.kill(pids[0], signal.SIGKILL)
        try:
            assert proc.wait(timeout=120) == 0, log_path.read_text()[-4000:]
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within 120 s of the kill:\n{log_path.read_text()[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["device"] == "cuda", summary
    assert summary["resumed_from"]["tier"] == "memory" and summary["restarts"] == 1, summary
    assert summary["state_sha256"] == gpu_ref["state_sha256"]
    starts = [e for e in events() if e["event"] == "start"]
    assert [e["pid"] for e in starts] == pids, "the spare did not take rank 0 in place"
