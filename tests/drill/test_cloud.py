"""The drill's local cloud: replication moto lacks, and the damage the drill does."""

from __future__ import annotations

from drill.cloud import flip_middle
from tests.drill.conftest import client, put_step


def replica_keys(s3, cloud):
    listing = s3.list_objects_v2(Bucket=cloud.replica, Prefix=cloud.prefix + "/")
    return sorted(o["Key"].split("/", 2)[2] for o in listing.get("Contents", []))


def test_replication_copies_new_objects_and_mirrors_deletions(cloud, s3):
    put_step(s3, cloud, 10)
    put_step(s3, cloud, 20)
    assert cloud.replicate() == 4
    assert replica_keys(s3, cloud) == [
        "step-10/__0_0.distcp",
        "step-10/manifest.json",
        "step-20/__0_0.distcp",
        "step-20/manifest.json",
    ]
    assert cloud.replicate() == 0
    s3.delete_object(Bucket=cloud.primary, Key=f"{cloud.prefix}/step-10/manifest.json")
    s3.delete_object(Bucket=cloud.primary, Key=f"{cloud.prefix}/step-10/__0_0.distcp")
    cloud.replicate()
    assert replica_keys(s3, cloud) == ["step-20/__0_0.distcp", "step-20/manifest.json"]


def test_a_corrupted_object_keeps_its_size_and_changes_its_bytes(cloud, s3):
    put_step(s3, cloud, 30)
    key = cloud.corrupt_step(cloud.primary, 30)
    assert key == f"{cloud.prefix}/step-30/__0_0.distcp"
    body = s3.get_object(Bucket=cloud.primary, Key=key)["Body"].read()
    assert len(body) == 1000 and body != b"0123456789" * 100


def test_flipping_bytes_is_an_involution_in_the_middle():
    data = bytearray(b"a" * 64)
    flip_middle(data)
    assert data[:32] == b"a" * 32 and data[32:48] != b"a" * 16
    flip_middle(data)
    assert data == bytearray(b"a" * 64)


def test_losing_the_primary_deletes_the_bucket_and_stops_replication(own_cloud):
    cloud, s3 = own_cloud, client(own_cloud)
    put_step(s3, cloud, 40)
    cloud.replicate()
    cloud.lose_primary()
    assert not cloud.bucket_exists(cloud.primary)
    assert cloud.replicate() == 0
    assert "step-40/manifest.json" in replica_keys(s3, cloud)
