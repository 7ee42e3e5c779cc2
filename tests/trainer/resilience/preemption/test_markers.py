import json
import os
import time

import boto3
import pytest
from moto import mock_aws

from ftfleet.contract import CommitMarker, marker_key
from ftfleet.trainer.resilience.preemption.marker import publish_marker, read_local_marker, write_local_marker


def marker(step=1200, node="i-0abc", reason="termination"):
    return CommitMarker.now("run-1", node, step, reason, durable=False)


def test_the_marker_lands_at_the_contracts_key_under_the_tier_root(tmp_path):
    written = marker()
    path = write_local_marker(tmp_path, written)
    assert path == tmp_path / marker_key("i-0abc")
    assert CommitMarker.from_json(path.read_text()) == written
    assert read_local_marker(tmp_path, "i-0abc") == written
    assert read_local_marker(tmp_path, "i-0other") is None


def test_a_newer_marker_replaces_the_old_one_and_leaves_no_temporary_file(tmp_path):
    write_local_marker(tmp_path, marker(step=100))
    write_local_marker(tmp_path, marker(step=200))
    assert read_local_marker(tmp_path, "i-0abc").step == 200
    assert os.listdir(tmp_path / "markers") == ["i-0abc.json"]


def test_a_failed_write_leaves_the_old_marker_intact(tmp_path, monkeypatch):
    write_local_marker(tmp_path, marker(step=100))

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_local_marker(tmp_path, marker(step=200))
    monkeypatch.undo()
    assert read_local_marker(tmp_path, "i-0abc").step == 100
    assert os.listdir(tmp_path / "markers") == ["i-0abc.json"]


def test_publishing_uploads_the_same_marker_to_the_durable_prefix(tmp_path):
    uploaded = {}
    written = marker()
    result = publish_marker(written, fast_root=tmp_path, put=uploaded.__setitem__)
    assert result.uploaded and result.error is None
    assert CommitMarker.from_json(uploaded[marker_key("i-0abc")]) == written
    assert result.local_path.exists()


def test_without_an_uploader_only_the_fast_tier_gets_the_marker(tmp_path):
    result = publish_marker(marker(), fast_root=tmp_path)
    assert not result.uploaded and result.local_path.exists()


def test_a_failing_upload_is_retried_until_the_deadline_then_reported(tmp_path):
    attempts = []

    def flaky(key, data):
        attempts.append(key)
        if len(attempts) < 3:
            raise ConnectionError("throttled")

    result = publish_marker(marker(), fast_root=tmp_path, put=flaky, deadline=time.time() + 30, retry_s=0.01)
    assert result.uploaded and len(attempts) == 3

    def down(key, data):
        raise ConnectionError("bucket unreachable")

    result = publish_marker(marker(), fast_root=tmp_path, put=down, deadline=None)
    assert not result.uploaded and "bucket unreachable" in result.error
    assert result.local_path.exists()


@mock_aws
def test_an_s3_uploader_puts_the_marker_where_the_lifecycle_handoff_polls(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ftfleet-ckpt")
    prefix = "checkpoints/run-1"

    def put(key, data):
        s3.put_object(Bucket="ftfleet-ckpt", Key=f"{prefix}/{key}", Body=data)

    publish_marker(marker(step=77), fast_root=tmp_path, put=put)
    body = s3.get_object(Bucket="ftfleet-ckpt", Key=f"{prefix}/markers/i-0abc.json")["Body"].read()
    assert json.loads(body)["step"] == 77
