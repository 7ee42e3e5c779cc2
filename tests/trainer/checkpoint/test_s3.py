"""The durable tier on S3, against a moto server on 127.0.0.1 behind a fault proxy."""

from __future__ import annotations

import re
import threading

import pytest

from ftfleet.cli import main as ftfleet
from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import read_manifest
from ftfleet.trainer.checkpoint.tiers import LocalTier
from ftfleet.trainer.checkpoint.tiers.s3 import S3Store
from ftfleet.trainer.checkpoint.upload import Uploader
from tests.trainer.conftest import copy_steps, kill9, run_trainer, start_trainer


def manifests(s3, bucket, prefix="run/"):
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return sorted(int(k.split("/")[1][5:]) for k in keys if k.endswith("/manifest.json"))


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_trainer_uploads_commits_with_manifest_last_and_retries_injected_5xx(tmp_path, s3proxy, s3, bucket, capsys):
    s3proxy.fail_every(3, status=503)  # every third write is refused once
    out = run_trainer(
        2,
        tmp_path / "run",
        f"checkpoint.uri=s3://{bucket}/run",
        f"checkpoint.s3_endpoint_url={s3proxy.url}",
        "resilience.interval.fixed_steps=8",
    )
    assert s3proxy.injected > 0
    durable = [d["step"] for d in out["durable"]]
    assert durable[-1] == 24, "the final checkpoint is durable before the trainer exits"
    assert manifests(s3, bucket) == sorted(durable)[-3:]  # retention keeps 3 in the bucket
    # Manifest last: for each step, no file of it was written after its manifest.
    writes = s3proxy.writes()
    for step in durable:
        ours = [i for i, p in enumerate(writes) if f"/run/step-{step}/" in p]
        mani = [i for i in ours if writes[i].endswith("/manifest.json")]
        assert len(mani) == 1 and mani[0] == max(ours), f"step-{step}: manifest not last"
        assert len(ours) == 6  # 4 shards (2 ranks x 2 threads) + .metadata + manifest
    # What is in the bucket verifies, file by file.
    assert ftfleet(["ckpt", "verify", f"s3://{bucket}/run", "--endpoint-url", s3proxy.url]) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.timeout(180)
def test_restore_comes_from_the_replica_when_the_primary_bucket_is_missing(tmp_path, moto_url, bucket, ref1):
    # The replica bucket holds what cross-region replication copied there: step-12 of the
    # reference run, uploaded the way the trainer uploads (the trainer's own upload is
    # tested above).
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "a", [12])
    up = Uploader(S3Store(f"s3://{bucket}/run", endpoint_url=moto_url), LocalTier(root), LocalComm(), workers=2)
    up.submit(read_manifest(root / "step-12"))
    assert up.close(wait=True, timeout=60) and up.durable_steps == [12]
    # A new job in the other region: empty fast tier, primary bucket gone.
    out = run_trainer(
        1,
        tmp_path / "b",
        "checkpoint.uri=s3://gone-primary/run",
        f"checkpoint.replica_uri=s3://{bucket}/run",
        "checkpoint.upload=none",
        f"checkpoint.s3_endpoint_url={moto_url}",
    )
    assert out["resumed_from"]["tier"] == "replica" and out["resumed_from"]["step"] == 12
    assert "gone-primary" in out["_stderr"] and "unavailable" in out["_stderr"]
    assert "restore step-12 from replica" in out["_stderr"]  # the progress bar
    assert out["state_sha256"] == ref1["state_sha256"]
    assert "using step-12 from replica tier" in out["_stderr"]


@pytest.mark.timeout(180)
def test_kill_9_during_upload_leaves_no_manifest_and_restore_uses_an_earlier_durable_step(
    tmp_path, s3proxy, s3, bucket, ref1
):
    # The uploader skips a step a newer commit supersedes, so which step it uploads after
    # step-4 depends on timing: hold the first file of whichever it is, then kill.
    held, caught = threading.Event(), []

    def first_put_after_step_4(method: str, path: str) -> bool:
        match = re.search(r"/run/step-(\d+)/", path)
        if method != "PUT" or not match or int(match[1]) <= 4:
            return False
        caught.append(int(match[1]))
        return True

    s3proxy.hold_first(first_put_after_step_4, held, seconds=20)
    proc = start_trainer(
        1, tmp_path / "a", f"checkpoint.uri=s3://{bucket}/run", f"checkpoint.s3_endpoint_url={s3proxy.url}"
    )
    try:
        assert held.wait(120), "no upload after step-4 ever started"
    finally:
        kill9(proc)
    step = caught[0]
    assert step not in manifests(s3, bucket)
    objects = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not any(f"step-{step}/manifest" in k for k in objects)
    durable = manifests(s3, bucket)
    assert durable and max(durable) < step
    # A fresh node restores from the bucket alone and ends where the reference run ends.
    out = run_trainer(
        1, tmp_path / "b", f"checkpoint.uri=s3://{bucket}/run", f"checkpoint.s3_endpoint_url={s3proxy.url}"
    )
    assert out["resumed_from"]["tier"] == "primary"
    assert out["resumed_from"]["step"] == max(durable)
    assert out["state_sha256"] == ref1["state_sha256"]


def test_large_files_go_multipart_and_5xx_parts_are_retried(tmp_path, s3proxy, s3, bucket):
    s3proxy.fail_every(2, status=500)
    data = bytes(range(256)) * (48 * 1024)  # 12 MiB: three 5 MiB parts
    (tmp_path / "big").write_bytes(data)
    store = S3Store(f"s3://{bucket}/x", endpoint_url=s3proxy.url, chunk_mb=5, retries=5)
    store.upload_file(tmp_path / "big", "big")
    assert s3.get_object(Bucket=bucket, Key="x/big")["Body"].read() == data
    assert any(m == "POST" and "uploads" in p for m, p, _ in s3proxy.log), "multipart upload"
    assert s3proxy.injected >= 2


def test_an_upload_that_keeps_failing_never_writes_a_manifest(tmp_path, s3proxy, s3, bucket, ref1):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [24])
    s3proxy.fail_every(1, status=500, methods=("PUT",))
    store = S3Store(f"s3://{bucket}/run", endpoint_url=s3proxy.url, retries=2)
    up = Uploader(store, LocalTier(root), LocalComm(), workers=2)
    up.submit(read_manifest(root / "step-24"))
    assert up.close(wait=True, timeout=120)
    assert up.durable_steps == []
    assert manifests(s3, bucket) == []


def test_a_missing_bucket_is_reported_as_unavailable(moto_url):
    from ftfleet.trainer.checkpoint.tiers import TierUnavailable

    with pytest.raises(TierUnavailable, match="NoSuchBucket"):
        S3Store("s3://no-such-bucket/p", endpoint_url=moto_url, retries=1).committed_steps()


@pytest.mark.parametrize("failing", ["listing", "manifest read"])
def test_a_primary_answering_only_5xx_is_skipped_for_the_replica(
    tmp_path, moto_url, s3proxy, s3, bucket, ref1, failing
):
    """Retries exhausted on the primary is an error of that tier, not of the restore: rank 0
    raising there would leave the other ranks waiting in a collective until its timeout."""
    from ftfleet.trainer.checkpoint.restore import Identity, find_and_prepare

    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [24])
    manifest = read_manifest(root / "step-24")
    replica_bucket = f"{bucket}-r"
    s3.create_bucket(Bucket=replica_bucket)
    for name in (bucket, replica_bucket):
        up = Uploader(S3Store(f"s3://{name}/run", endpoint_url=moto_url), LocalTier(root), LocalComm(), workers=2)
        up.submit(manifest)
        assert up.close(wait=True, timeout=60) and up.durable_steps == [24]
    if failing == "listing":
        s3proxy.fail_every(1, status=500, methods=("GET",))
    else:
        s3proxy.rules.append(
            lambda m, p: ("error", 500) if p.split("?")[0].endswith("/manifest.json") and bucket + "/" in p else None
        )
    primary = S3Store(f"s3://{bucket}/run", endpoint_url=s3proxy.url, retries=2)
    replica = S3Store(f"s3://{replica_bucket}/run", endpoint_url=moto_url)
    found = find_and_prepare(
        LocalComm(),
        LocalTier(tmp_path / "fresh"),
        [("primary", primary), ("replica", replica)],
        Identity(manifest.run_id, manifest.config_hash),
    )
    assert s3proxy.injected > 0
    assert (found.tier, found.step) == ("replica", 24)


def test_a_local_commit_whose_upload_was_killed_is_uploaded_when_the_run_restarts(tmp_path, moto_url, s3, bucket, ref1):
    """The upload phase of step-24 died with the process: the restarted run restores the
    local copy and makes it durable."""
    from tests.trainer.conftest import in_process_manager

    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [22, 24])
    mgr = in_process_manager(root, f"checkpoint.uri=s3://{bucket}/run", f"checkpoint.s3_endpoint_url={moto_url}")
    restored = mgr.restore()
    mgr.close(wait_for_upload=True)
    assert (restored.tier, restored.step, mgr.app_state.progress.step) == ("local", 24, 24)
    assert manifests(s3, bucket) == [24] and mgr.durable_steps == [24]


def test_an_in_process_restart_reuses_its_processes_s3_clients(monkeypatch):
    from ftfleet.trainer.checkpoint import tiers
    from ftfleet.trainer.checkpoint.tiers import s3 as s3_module

    built = []
    monkeypatch.setattr(s3_module, "make_client", lambda *args: built.append(args) or object())
    try:
        tiers.reuse_clients()
        a = tiers.open_store("s3://b/run", endpoint_url="http://127.0.0.1:1", retries=3)
        b = tiers.open_store("s3://b-replica/run", endpoint_url="http://127.0.0.1:1", retries=3)
        other = tiers.open_store("s3://b/run", endpoint_url="http://127.0.0.1:2", retries=3)
        assert a.client is b.client and other.client is not a.client
        assert built == [("http://127.0.0.1:1", 3), ("http://127.0.0.1:2", 3)]
        tiers.reuse_clients(False)  # the default: each store builds its own
        assert tiers.open_store("s3://b/run", endpoint_url="http://127.0.0.1:1", retries=3).client is not a.client
    finally:
        tiers.reuse_clients(False)
