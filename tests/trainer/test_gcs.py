"""The durable tier on GCS, through a fake at the google-cloud-storage client boundary
(the calls GCSStore makes: Client.bucket/list_blobs, Blob.upload_from_filename,
upload_from_string, download_to_filename, download_as_bytes, open, delete)."""

from __future__ import annotations

import io
import logging

import pytest
from google.api_core import exceptions as gexc

from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import read_manifest
from ftfleet.trainer.checkpoint.restore import Identity, find_and_prepare
from ftfleet.trainer.checkpoint.tiers import LocalTier, TierUnavailable
from ftfleet.trainer.checkpoint.tiers.gcs import GCSStore
from ftfleet.trainer.checkpoint.upload import Uploader
from tests.trainer.conftest import copy_steps


class FakeBlob:
    def __init__(self, client, bucket, name):
        self.client, self.bucket_name, self.name = client, bucket, name

    @property
    def _objects(self):
        if self.bucket_name not in self.client.buckets:
            raise gexc.NotFound(f"bucket {self.bucket_name}")
        return self.client.buckets[self.bucket_name]

    @property
    def size(self):
        return len(self._objects[self.name])

    def _put(self, data, checksum, retry):
        assert checksum == "crc32c" and retry is not None
        self._objects[self.name] = bytes(data)
        self.client.writes.append(self.name)

    def upload_from_filename(self, path, checksum=None, retry=None):
        self._put(open(path, "rb").read(), checksum, retry)

    def upload_from_string(self, data, checksum=None, retry=None):
        self._put(data, checksum, retry)

    def download_as_bytes(self, checksum=None, retry=None):
        if self.name not in self._objects:
            raise gexc.NotFound(self.name)
        return self._objects[self.name]

    def download_to_filename(self, path, checksum=None, retry=None):
        data = self.download_as_bytes(checksum, retry)
        with open(path, "wb") as f:
            f.write(data)

    def open(self, mode, retry=None):
        return io.BytesIO(self.download_as_bytes())

    def delete(self, retry=None):
        if self._objects.pop(self.name, None) is None:
            raise gexc.NotFound(self.name)


class FakeBucket:
    def __init__(self, client, name):
        self.client, self.name = client, name

    def blob(self, name, chunk_size=None):
        assert chunk_size is None or chunk_size % (256 * 1024) == 0
        return FakeBlob(self.client, self.name, name)


class FakeClient:
    def __init__(self, *buckets):
        self.buckets = {b: {} for b in buckets}
        self.writes: list[str] = []

    def bucket(self, name):
        return FakeBucket(self, name)

    def list_blobs(self, bucket, prefix="", retry=None):
        if bucket not in self.buckets:
            raise gexc.NotFound(f"bucket {bucket}")
        return [FakeBlob(self, bucket, k) for k in sorted(self.buckets[bucket]) if k.startswith(prefix)]


@pytest.fixture
def local(tmp_path, ref1):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "src", [20, 22, 24])
    return LocalTier(root)


def upload_all(store, local, one_by_one=True):
    """Upload steps 20, 22, 24; all at once, the uploader skips to the newest."""
    import time

    up = Uploader(store, local, LocalComm(), workers=4, keep=5)
    for step in (20, 22, 24):
        up.submit(read_manifest(local.step_dir(step)))
        while one_by_one and not up.idle():
            time.sleep(0.01)
    assert up.close(wait=True, timeout=60)
    return up


def identity(local):
    m = read_manifest(local.step_dir(24))
    return Identity(m.run_id, m.config_hash)


def test_upload_writes_every_file_then_the_manifest(local):
    client = FakeClient("b")
    store = GCSStore("gs://b/run", client=client)
    up = upload_all(store, local)
    assert up.durable_steps == [20, 22, 24]
    assert store.committed_steps() == up.durable_steps
    for step in up.durable_steps:
        ours = [w for w in client.writes if f"run/step-{step}/" in w]
        assert ours[-1] == f"run/step-{step}/manifest.json" and len(ours) == 4


def test_queued_uploads_skip_to_the_newest_commit(local):
    store = GCSStore("gs://b/run", client=FakeClient("b"))
    up = upload_all(store, local, one_by_one=False)
    assert up.durable_steps[-1] == 24 and len(up.durable_steps) < 3


def test_restore_downloads_verifies_and_commits_locally(tmp_path, local):
    store = GCSStore("gs://b/run", client=FakeClient("b"))
    upload_all(store, local)
    fresh = LocalTier(tmp_path / "fresh")
    found = find_and_prepare(LocalComm(), fresh, [("primary", store)], identity(local))
    assert (found.tier, found.step) == ("primary", 24)
    assert fresh.committed_steps() == [24]
    assert read_manifest(fresh.step_dir(24)) == read_manifest(local.step_dir(24))


def test_a_corrupt_or_partial_bucket_copy_falls_back_to_the_previous_step(tmp_path, local, caplog):
    client = FakeClient("b")
    store = GCSStore("gs://b/run", client=client)
    upload_all(store, local)
    objects = client.buckets["b"]
    shard = sorted(k for k in objects if k.startswith("run/step-24/__"))[0]
    objects[shard] = objects[shard][:-1] + bytes([objects[shard][-1] ^ 1])  # bit flip
    del objects[sorted(k for k in objects if k.startswith("run/step-22/__"))[0]]  # exported early
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        found = find_and_prepare(LocalComm(), LocalTier(tmp_path / "fresh"), [("primary", store)], identity(local))
    assert found.step == 20
    text = caplog.text
    assert "step-24" in text and shard.split("/")[-1] in text and "crc32c" in text
    assert "step-22" in text and "download failed" in text


def test_a_missing_gcs_bucket_is_unavailable_and_restore_goes_on(tmp_path, local):
    missing = GCSStore("gs://gone/run", client=FakeClient())
    with pytest.raises(TierUnavailable):
        missing.committed_steps()
    replica = GCSStore("gs://rep/run", client=FakeClient("rep"))
    upload_all(replica, local)
    found = find_and_prepare(
        LocalComm(), LocalTier(tmp_path / "fresh"), [("primary", missing), ("replica", replica)], identity(local)
    )
    assert (found.tier, found.step) == ("replica", 24)
