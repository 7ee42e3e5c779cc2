"""HSDP (``parallel.replicas``): FSDP2 on a (replicate, shard) mesh. Each shard is held by
every replica group and written once; a checkpoint holds the whole state and restores at
another number of replicas and ranks; a stopped run resumes bit-identically at the same
shape."""

from __future__ import annotations

import types

import pytest
import torch

from ftfleet.errors import ConfigError
from ftfleet.trainer import parallel
from ftfleet.trainer.checkpoint.safe_load import read_metadata_file
from ftfleet.trainer.config import ParallelConfig
from tests.trainer.conftest import ckpt_hash, copy_steps, run_trainer

#: 4 ranks: a global batch of 12 (the tests' BASE has 6, for 1, 2 and 3 ranks).
SHAPE = ["train.global_batch_size=12", "checkpoint.keep=100", "train.steps=8", "resilience.interval.fixed_steps=4"]
HSDP = ["parallel.replicas=2", *SHAPE]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 0}, "parallel.replicas=0: use 1"),
        ({"replicas": 2, "mode": "ddp"}, "parallel.replicas=2 needs parallel.mode=fsdp"),
    ],
)
def test_bad_replica_settings_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ParallelConfig(**kwargs)


def test_replicas_that_do_not_divide_the_world_are_refused_before_any_collective():
    env = types.SimpleNamespace(world_size=3, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="parallel.replicas=2 does not divide the world size 3"):
        parallel.device_mesh(ParallelConfig(replicas=2), env)


@pytest.mark.integration
def test_two_replicas_of_two_shards_write_each_shard_once_and_the_checkpoint_holds_the_whole_state(tmp_path):
    run = run_trainer(4, tmp_path / "hsdp", *HSDP)
    assert run["step"] == 8 and run["world_size"] == 4
    step = tmp_path / "hsdp" / "checkpoints" / "step-8"
    assert ckpt_hash(step) == run["state_sha256"]  # every shard there, written by one replica
    meta = read_metadata_file(step / ".metadata")
    weight = next(k for k in meta.state_dict_metadata if k.endswith("blocks.0.attn.qkv.weight") and "optim" not in k)
    chunks = meta.state_dict_metadata[weight].chunks
    assert len(chunks) == 2  # sharded over the 2 ranks of a group, not 4 copies


@pytest.mark.chaos
def test_an_hsdp_run_resumes_exactly_and_its_checkpoints_restore_at_another_shape(tmp_path):
    straight = run_trainer(4, tmp_path / "straight", *HSDP)
    stopped = tmp_path / "stopped"
    run_trainer(4, stopped, *HSDP, "train.stop_at_step=5")
    resumed = run_trainer(4, stopped, *HSDP)
    assert resumed["resumed_from"]["step"] == 5 and resumed["state_sha256"] == straight["state_sha256"]
    # R = 2 on 4 ranks -> plain FSDP on 2 ranks: the state loads whole.
    two = copy_steps(stopped / "checkpoints", tmp_path / "two" / "checkpoints", [8])
    again = run_trainer(2, tmp_path / "two", *SHAPE, f"checkpoint.dir={two}")
    assert again["resumed_from"]["step"] == 8 and again["state_sha256"] == straight["state_sha256"]
    # Plain FSDP on 2 ranks -> R = 2 on 4 ranks.
    plain = run_trainer(2, tmp_path / "plain", *SHAPE)
    four = copy_steps(tmp_path / "plain" / "checkpoints", tmp_path / "four" / "checkpoints", [8])
    back = run_trainer(4, tmp_path / "four", *HSDP, f"checkpoint.dir={four}")
    assert back["resumed_from"]["step"] == 8 and back["state_sha256"] == plain["state_sha256"]


def test_a_world_shrunk_by_whole_groups_keeps_the_group_size():
    from ftfleet.errors import ConfigError
    from ftfleet.trainer.parallel import hsdp_shape

    assert hsdp_shape(2, 4, launched=4) == (2, 2)
    assert hsdp_shape(2, 2, launched=4) == (1, 2)  # one replica group left
    assert hsdp_shape(3, 4, launched=6) == (2, 2)
    assert hsdp_shape(1, 3, launched=4) == (1, 3)
    with pytest.raises(ConfigError, match="does not divide the world size 3"):
        hsdp_shape(2, 3, launched=4)


HUNG_REPLICA = """
import time, types, torch, torch.distributed as dist
from ftfleet.trainer import parallel
from ftfleet.trainer.config import ParallelConfig
dist.init_process_group("gloo")
rank = dist.get_rank()
env = types.SimpleNamespace(world_size=4, device=torch.device("cpu"))
mesh = parallel.device_mesh(ParallelConfig(replicas=2, collective_timeout_s=2.0), env)
if rank == 2:  # rank 0, its replica, never joins: the all-reduce must end at the timeout
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=mesh.get_group("replicate"))
    except RuntimeError:
        print(f"timed out after {time.monotonic() - t0:.1f} s", flush=True)
time.sleep(0.5 if rank != 0 else 20)
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_replica_group_waits_for_a_gone_peer_no_longer_than_the_collective_timeout(tmp_path):
    import subprocess

    from tests.trainer.conftest import BIN, REPO, child_env

    script = tmp_path / "hung_replica.py"
    script.write_text(HUNG_REPLICA)
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=4", str(script)]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=100)
    line = next((x for x in done.stdout.splitlines() if x.startswith("timed out after")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
    assert float(line.split()[3]) < 10, line  # torch's default for a new gloo group is 30 minutes
