"""Damage the drill does while the run is stopped."""

from __future__ import annotations

from drill.damage import committed_steps, corrupt_newest, lose_primary
from tests.drill.conftest import client, put_step

SHARD = b"0123456789" * 100


def local_step(root, step):
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(SHARD)
    (d / "manifest.json").write_text("{}")


def test_the_newest_checkpoint_is_corrupted_in_every_tier_and_the_one_before_named(own_cloud, tmp_path):
    cloud, s3 = own_cloud, client(own_cloud)
    for step in (110, 120):
        local_step(tmp_path, step)
        put_step(s3, cloud, step, SHARD)
    record, what = corrupt_newest(cloud, tmp_path)
    assert (record.newest_step, record.previous_step, record.error) == (120, 110, None)
    assert "local __0_0.distcp" in what and "primary" in what and "replica" in what
    assert (tmp_path / "step-120" / "__0_0.distcp").read_bytes() != SHARD
    assert (tmp_path / "step-110" / "__0_0.distcp").read_bytes() == SHARD
    for bucket in (cloud.primary, cloud.replica):
        body = s3.get_object(Bucket=bucket, Key=f"{cloud.prefix}/step-120/__0_0.distcp")["Body"].read()
        assert len(body) == len(SHARD) and body != SHARD


def test_losing_the_primary_leaves_the_replica_as_the_only_copy(own_cloud, tmp_path):
    local_step(tmp_path / "fast", 50)
    put_step(client(own_cloud), own_cloud, 50)
    record, _ = lose_primary(own_cloud, tmp_path / "fast")
    assert record.newest_step == 50 and record.error is None
    assert committed_steps(own_cloud, tmp_path / "fast") == {"local": [], "primary": [], "replica": [50]}
