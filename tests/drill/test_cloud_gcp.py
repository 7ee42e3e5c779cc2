"""The drill's GCP: a GCS emulator holding the one checkpoint bucket, and the damage the
drill does to it and to the fast tier while the run is stopped."""

from __future__ import annotations

import os

import pytest

from drill import damage
from drill.cloud_gcp import GcpCloud
from tests.gcs_emulator import gcs_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gcp():
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    with GcpCloud(bucket="ftfleet-drill-test") as cloud:
        assert os.environ.get("STORAGE_EMULATOR_HOST") == before  # the caller's environment is left alone
        yield cloud


def put_step(gcp, step, payload=b"0123456789" * 100):
    bucket = gcs_client(gcp.emulator_url).bucket(gcp.primary)
    bucket.blob(f"{gcp.prefix}/step-{step}/__0_0.distcp").upload_from_string(payload)
    bucket.blob(f"{gcp.prefix}/step-{step}/manifest.json").upload_from_string(b"{}")


def test_there_is_one_bucket_and_no_replica_uri(gcp):
    assert gcp.primary_uri == f"gs://ftfleet-drill-test/{gcp.prefix}" and gcp.replica_uri == ""
    assert gcp.bucket_exists(gcp.primary) and not gcp.bucket_exists(gcp.replica)
    assert gcp.node_env() == {"STORAGE_EMULATOR_HOST": gcp.emulator_url}


def test_corrupting_a_step_rewrites_its_largest_shard_with_the_same_size(gcp):
    put_step(gcp, 7)
    key = gcp.corrupt_step(gcp.primary, 7)
    data = gcs_client(gcp.emulator_url).bucket(gcp.primary).blob(key).download_as_bytes()
    assert key.endswith("step-7/__0_0.distcp")
    assert len(data) == 1000 and data != b"0123456789" * 100
    assert gcp.corrupt_step(gcp.primary, 99) is None


def test_losing_a_location_wipes_the_fast_tier_and_keeps_the_bucket(gcp, tmp_path):
    put_step(gcp, 12)
    fast = tmp_path / "fast"
    (fast / "step-12").mkdir(parents=True)
    record, what = damage.lose_location(gcp, fast)
    assert not fast.exists()
    assert record.newest_step == max(damage.committed_steps(gcp, fast)["primary"])
    assert record.expected_tier == "primary" and record.error is None
    assert "fast tier is wiped" in what
