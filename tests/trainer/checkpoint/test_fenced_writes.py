"""Writes made after a check of the run lease land soon after it or not at all: the
manifest's upload and retention's deletions go through the store's bounded view, one
attempt per request, the lease checked again before each attempt and each step deleted."""

from __future__ import annotations

import pytest

from ftfleet.trainer.checkpoint import retention, upload
from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import Manifest, checksum_file, write_manifest
from ftfleet.trainer.checkpoint.tiers import LocalTier
from ftfleet.trainer.checkpoint.tiers.gcs import GCSStore
from ftfleet.trainer.checkpoint.tiers.s3 import S3Store
from ftfleet.trainer.resilience import fencing


def committed_step(root, step: int, created_at: float = 1000.0) -> Manifest:
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    for name, data in (("__0_0.distcp", b"shard" * 100), (".metadata", b"meta")):
        (d / name).write_bytes(data)
    files = {n: checksum_file(d / n) for n in ("__0_0.distcp", ".metadata")}
    m = Manifest(
        step=step, run_id="r", config_hash="c", world_size=1, files=files, torch_version="t", created_at=created_at
    )
    write_manifest(d, m)
    return m


def test_the_bounded_views_make_one_attempt_per_request(moto_url, bucket):
    s3 = S3Store(f"s3://{bucket}/run", endpoint_url=moto_url).bounded(6.0)
    config = s3.client.meta.config
    assert config.retries["total_max_attempts"] == 1 and config.read_timeout == 6.0 and config.connect_timeout == 6.0
    gcs = GCSStore("gs://b/run").bounded(6.0)
    assert gcs.timeout_s == 6.0 and gcs.retry_budget_s <= 1.0


class Lease:
    """fencing.problem_of as a lease would answer it: held until ``lost()``."""

    def __init__(self):
        self.checks, self.problem = 0, None

    def __call__(self, fence):
        self.checks += 1
        return self.problem


@pytest.fixture
def lease(monkeypatch):
    state = Lease()
    monkeypatch.setattr(fencing, "problem_of", state)

    def check(fence, what):
        if state(fence) is not None:
            raise fencing.Fenced(f"{what}: {state.problem}")

    monkeypatch.setattr(fencing, "check", check)
    return state


def test_a_manifest_attempt_that_fails_is_made_again_only_after_the_lease_is_checked_again(
    tmp_path, moto_url, bucket, s3, lease, monkeypatch
):
    local = LocalTier(tmp_path / "fast")
    manifest = committed_step(local.root, 5)
    up = upload.Uploader(S3Store(f"s3://{bucket}/run", endpoint_url=moto_url), local, LocalComm(), workers=2)
    real_put, puts = up.fenced_store.put_bytes, []

    def flaky(rel, data):
        puts.append(rel)
        if len(puts) == 1:
            raise TimeoutError("read timed out")  # the bounded attempt gave up
        real_put(rel, data)

    monkeypatch.setattr(up.fenced_store, "put_bytes", flaky)
    up.submit(manifest)
    assert up.close(wait=True, timeout=60) and up.durable_steps == [5]
    assert puts == ["step-5/manifest.json"] * 2 and lease.checks >= 2

    # The lease is lost while the first attempt is out: no second attempt, no manifest.
    manifest = committed_step(local.root, 6)
    up = upload.Uploader(S3Store(f"s3://{bucket}/run", endpoint_url=moto_url), local, LocalComm(), workers=2)
    puts.clear()

    def lost_meanwhile(rel, data):
        puts.append(rel)
        lease.problem = "the run lease of r is held by gcp-prod/us-east4 now"
        raise TimeoutError("read timed out")

    monkeypatch.setattr(up.fenced_store, "put_bytes", lost_meanwhile)
    up.submit(manifest)
    up.close(wait=True, timeout=60)
    assert puts == ["step-6/manifest.json"] and up.durable_steps == []
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/step-6/").get("Contents", [])]
    assert "run/step-6/manifest.json" not in keys


def test_retention_stops_deleting_at_the_step_where_the_lease_is_lost(tmp_path):
    tier = LocalTier(tmp_path)
    for step in range(1, 6):
        committed_step(tmp_path, step, created_at=1000.0 + step * 86400)
    answers = iter([None, "lost"])
    deleted = retention.prune_by_schedule(
        tier, retention.parse_schedule(["all for 1h"]), guard=lambda: next(answers, "lost")
    )
    assert deleted == [1]
    assert tier.committed_steps() == [2, 3, 4, 5]
