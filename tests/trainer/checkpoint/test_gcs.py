"""The durable tier on GCS, against a real GCS emulator (fake-gcs-server, see
tests/gcs_emulator.py) through the real google-cloud-storage client: the store builds
its own client, which finds the emulator through STORAGE_EMULATOR_HOST as it would find
Google's endpoint on a node."""

from __future__ import annotations

import base64
import logging
import time

import pytest

from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import read_manifest
from ftfleet.trainer.checkpoint.restore import Identity, find_and_prepare
from ftfleet.trainer.checkpoint.tiers import LocalTier, TierUnavailable, open_store
from ftfleet.trainer.checkpoint.tiers.gcs import ConcurrentWrite, GCSStore, retry_budget_s
from ftfleet.trainer.checkpoint.upload import Uploader
from tests.gcs_emulator import gcs_client
from tests.trainer.conftest import copy_steps
from tests.trainer.s3proxy import FaultProxy


@pytest.fixture
def local(tmp_path, ref1):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "src", [20, 22, 24])
    return LocalTier(root)


def upload_all(store, local, one_by_one=True):
    """Upload steps 20, 22, 24; all at once, the uploader skips to the newest."""
    up = Uploader(store, local, LocalComm(), workers=4)
    for step in (20, 22, 24):
        up.submit(read_manifest(local.step_dir(step)))
        while one_by_one and not up.idle():
            time.sleep(0.01)
    assert up.close(wait=True, timeout=60)
    return up


def identity(local):
    m = read_manifest(local.step_dir(24))
    return Identity(m.run_id, m.config_hash)


def blobs(bucket, prefix="run/"):
    return {b.name: b for b in gcs_client().list_blobs(bucket, prefix=prefix)}


def test_the_store_reaches_the_emulator_through_storage_emulator_host_alone(gcs_bucket, gcs_emulator):
    store = open_store(f"gs://{gcs_bucket}/run")
    assert isinstance(store, GCSStore)
    store.put_bytes("probe", b"x")
    assert store.client._connection.API_BASE_URL == gcs_emulator.url
    assert gcs_client().bucket(gcs_bucket).blob("run/probe").download_as_bytes() == b"x"


def test_upload_writes_every_file_with_its_crc32c_then_the_manifest(gcs_bucket, local):
    store = GCSStore(f"gs://{gcs_bucket}/run")
    up = upload_all(store, local)
    assert up.durable_steps == [20, 22, 24]
    assert store.committed_steps() == [20, 22, 24]
    stored = blobs(gcs_bucket)
    for step in up.durable_steps:
        manifest = read_manifest(local.step_dir(step))
        ours = {name: b for name, b in stored.items() if name.startswith(f"run/step-{step}/")}
        files = {name.rsplit("/", 1)[-1]: b for name, b in ours.items()}
        assert set(files) == {*manifest.files, "manifest.json"}
        for name, entry in manifest.files.items():
            # what the bucket computed from the bytes it received equals what the trainer wrote
            assert base64.b64decode(files[name].crc32c).hex() == entry.crc32c
            assert files[name].size == entry.size
        # the manifest is the last object of its step (generations grow with time)
        last = max(ours.values(), key=lambda b: b.generation)
        assert last.name == f"run/step-{step}/manifest.json"


def test_queued_uploads_skip_to_the_newest_commit(gcs_bucket, local):
    store = GCSStore(f"gs://{gcs_bucket}/run")
    up = upload_all(store, local, one_by_one=False)
    assert up.durable_steps[-1] == 24 and len(up.durable_steps) < 3
    assert store.committed_steps() == up.durable_steps


def test_restore_downloads_verifies_and_commits_locally(tmp_path, gcs_bucket, local):
    store = GCSStore(f"gs://{gcs_bucket}/run")
    upload_all(store, local)
    fresh = LocalTier(tmp_path / "fresh")
    found = find_and_prepare(LocalComm(), fresh, [("primary", store)], identity(local))
    assert (found.tier, found.step) == ("primary", 24)
    assert fresh.committed_steps() == [24]
    assert read_manifest(fresh.step_dir(24)) == read_manifest(local.step_dir(24))
    for name in read_manifest(local.step_dir(24)).files:
        assert (fresh.step_dir(24) / name).read_bytes() == (local.step_dir(24) / name).read_bytes()


def test_a_corrupt_or_partial_bucket_copy_falls_back_to_the_previous_step(tmp_path, gcs_bucket, local, caplog):
    store = GCSStore(f"gs://{gcs_bucket}/run")
    upload_all(store, local)
    bucket = gcs_client().bucket(gcs_bucket)
    shard = sorted(n for n in blobs(gcs_bucket) if n.startswith("run/step-24/__"))[0]
    data = bytearray(bucket.blob(shard).download_as_bytes())
    data[-1] ^= 1  # rewritten whole: the bucket's own checksum matches, the manifest's does not
    bucket.blob(shard).upload_from_string(bytes(data))
    bucket.blob(sorted(n for n in blobs(gcs_bucket) if n.startswith("run/step-22/__"))[0]).delete()
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        found = find_and_prepare(LocalComm(), LocalTier(tmp_path / "fresh"), [("primary", store)], identity(local))
    assert found.step == 20
    text = caplog.text
    assert "step-24" in text and shard.split("/")[-1] in text and "crc32c" in text
    assert "step-22" in text and "download failed" in text


def test_a_missing_gcs_bucket_is_unavailable_and_restore_goes_on(tmp_path, gcs_bucket, local):
    missing = GCSStore("gs://ftfleet-no-such-bucket/run")
    with pytest.raises(TierUnavailable, match="does not exist"):
        missing.committed_steps()
    with pytest.raises(TierUnavailable, match="does not exist"):
        missing.put_bytes("step-1/manifest.json", b"{}")
    replica = GCSStore(f"gs://{gcs_bucket}/run")
    upload_all(replica, local)
    found = find_and_prepare(
        LocalComm(), LocalTier(tmp_path / "fresh"), [("primary", missing), ("replica", replica)], identity(local)
    )
    assert (found.tier, found.step) == ("replica", 24)


def test_server_errors_are_retried_until_the_request_succeeds(gcs_emulator, gcs_bucket, local, monkeypatch):
    proxy = FaultProxy(gcs_emulator.url)
    proxy.start()
    try:
        proxy.fail_every(2, status=503, methods=("GET", "POST"))  # every other request, first included
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        store = GCSStore(f"gs://{gcs_bucket}/run", retries=4)
        store.put_bytes("step-1/manifest.json", b"{}")
        assert store.committed_steps() == [1]
        assert store.get_bytes("step-1/manifest.json") == b"{}"
        assert proxy.injected >= 3
    finally:
        proxy.stop()


def test_an_unreachable_endpoint_is_unavailable_after_the_retry_budget(unused_port, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{unused_port}")
    store = GCSStore("gs://ftfleet-somewhere/run", retries=2)
    with pytest.raises(TierUnavailable, match="no answer after retrying"):
        store.committed_steps()
    with pytest.raises(TierUnavailable, match="no answer after retrying"):
        store.put_bytes("step-1/manifest.json", b"{}")


def test_the_retry_budget_follows_the_configured_attempts():
    assert retry_budget_s(1) == 1.0
    assert retry_budget_s(3) == 1.0 + 2.0
    assert retry_budget_s(10) == 1 + 2 + 4 + 8 + 16 + 30 + 30 + 30 + 30
    assert retry_budget_s(10) < 300


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- small objects (manifests, commit markers) are written under a generation precondition


class Stale:
    """A blob whose pre-write read saw no object: what a writer sees when another one
    creates the object between its read and its upload."""

    def __init__(self, blob):
        self._blob = blob

    def __getattr__(self, name):
        return getattr(self._blob, name)

    def reload(self, **kwargs):
        from google.api_core import exceptions

        raise exceptions.NotFound("not there yet")


def test_a_marker_is_created_only_if_absent_and_replaced_only_at_the_generation_read(gcs_bucket):
    store = GCSStore(f"gs://{gcs_bucket}/run")
    store.put_bytes("markers/node-a.json", b'{"step": 100}')
    first = gcs_client().bucket(gcs_bucket).get_blob("run/markers/node-a.json").generation
    store.put_bytes("markers/node-a.json", b'{"step": 200}')  # the node's next marker
    blob = gcs_client().bucket(gcs_bucket).get_blob("run/markers/node-a.json")
    assert blob.download_as_bytes() == b'{"step": 200}' and blob.generation != first


def test_a_writer_that_read_before_another_created_the_object_does_not_overwrite_it(gcs_bucket, monkeypatch):
    store = GCSStore(f"gs://{gcs_bucket}/run")
    gcs_client().bucket(gcs_bucket).blob("run/markers/node-a.json").upload_from_string(b'{"step": 300}')
    real = store._blob
    monkeypatch.setattr(store, "_blob", lambda rel: Stale(real(rel)))
    # ifGenerationMatch=0 reaches the server, which refuses: the newer marker stays.
    with pytest.raises(ConcurrentWrite, match="changed since generation 0"):
        store.put_bytes("markers/node-a.json", b'{"step": 100}')
    assert gcs_client().bucket(gcs_bucket).blob("run/markers/node-a.json").download_as_bytes() == b'{"step": 300}'


def test_a_retried_create_that_finds_its_own_bytes_is_done(gcs_bucket, monkeypatch):
    """The first attempt landed but its answer was lost: the retry's precondition fails
    on the object it wrote itself, which is success."""
    store = GCSStore(f"gs://{gcs_bucket}/run")
    gcs_client().bucket(gcs_bucket).blob("run/markers/node-a.json").upload_from_string(b'{"step": 100}')
    real = store._blob
    monkeypatch.setattr(store, "_blob", lambda rel: Stale(real(rel)))
    store.put_bytes("markers/node-a.json", b'{"step": 100}')
