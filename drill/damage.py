"""Damage done while the run is stopped, between two nodes: a corrupted newest
checkpoint (in every tier that holds it), and the loss of the primary bucket with the
local fast tier (a new node in the other region). Each returns the fault's record and
a line saying what was done."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from drill.cloud import LocalCloud, flip_middle
from drill.faults import FaultRecord
from ftfleet.contract import MANIFEST_NAME, parse_step_dir
from ftfleet.trainer.checkpoint.tiers import LocalTier


def committed_steps(cloud: Any, fast_dir: Path) -> dict[str, list[int]]:
    """Committed steps (those with a manifest) of the local tier and of both buckets."""
    out = {"local": LocalTier(fast_dir).committed_steps()}
    for name, bucket in (("primary", cloud.primary), ("replica", cloud.replica)):
        steps = set()
        if cloud.bucket_exists(bucket):
            for key in cloud.keys(bucket):
                parts = key.split("/")
                if parts[-1] == MANIFEST_NAME and (step := parse_step_dir(parts[-2])) is not None:
                    steps.add(step)
        out[name] = sorted(steps)
    return out


def corrupt_newest(cloud: Any, fast_dir: Path) -> tuple[FaultRecord, str]:
    """Flip bytes in the largest shard of the newest checkpoint, locally and in both
    buckets (replication has caught up first). The restore must skip it everywhere and
    use the one before. Call with replication paused."""
    cloud.replicate()
    tiers = committed_steps(cloud, fast_dir)
    every = sorted({s for steps in tiers.values() for s in steps})
    if not every:
        return FaultRecord("corrupt", 0.0, error="no checkpoint to corrupt"), "no checkpoint to corrupt"
    newest = every[-1]
    older = [s for s in every if s < newest]
    damaged = []
    step_dir = LocalTier(fast_dir).step_dir(newest)
    shards = sorted(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size) if step_dir.is_dir() else []
    if shards:
        data = bytearray(shards[-1].read_bytes())
        flip_middle(data)
        shards[-1].write_bytes(bytes(data))
        damaged.append(f"local {shards[-1].name}")
    for name, bucket in (("primary", cloud.primary), ("replica", cloud.replica)):
        if newest in tiers[name] and (key := cloud.corrupt_step(bucket, newest)):
            damaged.append(f"{name} {key.rsplit('/', 1)[-1]}")
    record = FaultRecord(
        "corrupt",
        0.0,
        newest,
        newest_step=newest,
        previous_step=older[-1] if older else None,
        error=None if damaged else f"no copy of step {newest} to corrupt",
    )
    return record, (
        f"corrupted step {newest} while stopped: flipped bytes in {', '.join(damaged) or 'nothing (no copy found)'}"
    )


def lose_primary(cloud: LocalCloud, fast_dir: Path) -> tuple[FaultRecord, str]:
    """Replication catches up, then the primary bucket and the fast tier are gone."""
    cloud.stop_replication()
    cloud.replicate()
    newest = max(committed_steps(cloud, fast_dir)["replica"], default=None)
    deleted = cloud.lose_primary()
    shutil.rmtree(fast_dir, ignore_errors=True)
    record = FaultRecord(
        "bucket_loss",
        0.0,
        newest,
        newest_step=newest,
        error=None if newest is not None else "the replica holds no checkpoint",
    )
    return record, (
        f"primary bucket deleted ({deleted} object versions) and the fast tier wiped: "
        f"the next node is in the other region; the replica's newest step is {newest}"
    )


def lose_location(cloud: Any, fast_dir: Path) -> tuple[FaultRecord, str]:
    """GCP: the zone of the node and its fast tier is gone (Managed Lustre and
    Parallelstore are zonal); the dual-region bucket keeps serving from its other
    region. The next node starts there with an empty fast tier: what it resumes from
    is what the trainer uploaded."""
    newest = max(committed_steps(cloud, fast_dir)["primary"], default=None)
    shutil.rmtree(fast_dir, ignore_errors=True)
    record = FaultRecord(
        "bucket_loss",
        0.0,
        newest,
        newest_step=newest,
        expected_tier="primary",
        error=None if newest is not None else "the bucket holds no checkpoint",
    )
    return record, (
        f"location lost: the fast tier is wiped and the next node starts in the bucket's other region; "
        f"the bucket's newest step is {newest}"
    )
