"""`ftfleet ckpt list|verify|inspect TARGET` on directories and buckets."""

from __future__ import annotations

import json

import pytest

from ftfleet.cli import main
from tests.trainer.checkpoint.test_corruption import flip_bit, shard
from tests.trainer.conftest import copy_steps


def run(capsys, *argv):
    rc = main(["ckpt", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_shows_steps_sizes_and_world_size(tmp_path, ref2, capsys):
    root = copy_steps(ref2["run_dir"] / "checkpoints", tmp_path / "ck", [16, 20, 24])
    (root / "step-28").mkdir()  # an interrupted save
    rc, out, _ = run(capsys, "list", root, "--json")
    rows = {r["step"]: r for r in json.loads(out)}
    assert rc == 0
    assert [rows[s]["status"] for s in (16, 20, 24, 28)] == ["ok (sizes)"] * 3 + ["uncommitted"]
    assert rows[24]["world_size"] == 2 and rows[24]["bytes"] > 0 and rows[24]["files"] == 5


@pytest.mark.integration
def test_verify_passes_a_good_tree_and_fails_naming_the_bad_file(tmp_path, ref1, capsys):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [22, 24])
    assert run(capsys, "verify", root)[0] == 0
    bad = shard(root / "step-22")
    flip_bit(bad)
    rc, out, err = run(capsys, "verify", root)
    assert rc == 1
    assert f"{bad.name}: crc32c" in out and "CORRUPT" in out and "1 corrupt" in err
    # A truncation is caught even by the quick size check of `list`.
    bad.write_bytes(bad.read_bytes()[:-1])
    assert run(capsys, "list", root)[0] == 1
    # A single step directory is a valid target too.
    assert run(capsys, "verify", root / "step-24")[0] == 0


def test_inspect_reads_the_state_hash_the_trainer_reported(ref1, capsys):
    rc, out, _ = run(capsys, "inspect", ref1["run_dir"] / "checkpoints", "--tensors", "--json")
    info = json.loads(out)
    assert rc == 0 and info["step"] == 24 and info["verified"]
    assert info["state_sha256"] == ref1["state_sha256"]
    assert info["progress"] == {"step": 24, "samples_seen": 144}
    assert any(k.startswith("rng_rank0.torch") for k in info["entries"])


def test_missing_target_is_a_one_line_user_error(tmp_path, capsys):
    rc, _, err = run(capsys, "list", tmp_path / "nope")
    assert rc == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1


@pytest.mark.integration
def test_ckpt_cli_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys; from ftfleet.cli import main; main(['ckpt', 'list', '.']);print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_malformed_manifest_fails_list_and_inspect_naming_manifest_json(tmp_path, ref1, capsys):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [22, 24])
    (root / "step-24" / "manifest.json").write_text('{"format": "ftfl')
    rc, out, err = run(capsys, "list", root)
    assert rc == 1 and "manifest.json: malformed" in out and "1 corrupt" in err
    rc, _, err = run(capsys, "inspect", root)
    assert rc == 1 and "step-24" in err and "manifest.json" in err
    assert run(capsys, "inspect", root, "--step", 22)[0] == 0


# ---------------------------------------------------------------------------
# Bucket targets: S3 (moto on 127.0.0.1) and GCS (a fake client)
# ---------------------------------------------------------------------------


def upload(store, root, steps):
    """Make ``steps`` durable in ``store``, one at a time (queued ones would be skipped)."""
    from ftfleet.trainer.checkpoint.comm import LocalComm
    from ftfleet.trainer.checkpoint.manifest import read_manifest
    from ftfleet.trainer.checkpoint.tiers import LocalTier
    from ftfleet.trainer.checkpoint.upload import Uploader

    for step in steps:
        up = Uploader(store, LocalTier(root), LocalComm(), workers=2)
        up.submit(read_manifest(root / f"step-{step}"))
        assert up.close(wait=True, timeout=60) and up.durable_steps == [step]


def flip_first_byte(data: bytes) -> bytes:
    return bytes([data[0] ^ 0x01]) + data[1:]


def test_bucket_target_on_s3_lists_verifies_and_inspects_then_names_the_bad_object(
    tmp_path, ref2, moto_url, s3, bucket, capsys
):
    from ftfleet.trainer.checkpoint.tiers.s3 import S3Store

    root = copy_steps(ref2["run_dir"] / "checkpoints", tmp_path / "ck", [20, 24])
    upload(S3Store(f"s3://{bucket}/run", endpoint_url=moto_url), root, [20, 24])
    uri, endpoint = f"s3://{bucket}/run", ("--endpoint-url", moto_url)

    rc, out, _ = run(capsys, "list", uri, *endpoint, "--json")
    rows = {r["step"]: r for r in json.loads(out)}
    assert rc == 0 and sorted(rows) == [20, 24]
    assert rows[24]["world_size"] == 2 and rows[24]["location"] == f"{uri}/step-24"
    assert run(capsys, "verify", uri, *endpoint)[0] == 0
    rc, out, _ = run(capsys, "inspect", uri, *endpoint, "--tensors", "--json")
    assert rc == 0 and json.loads(out)["state_sha256"] == ref2["state_sha256"]

    # Same size, one bit different: `list` (sizes) passes, `verify` (CRC32C) names it.
    key = f"run/step-24/{shard(root / 'step-24').name}"
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=flip_first_byte(body))
    assert run(capsys, "list", uri, *endpoint)[0] == 0
    rc, out, err = run(capsys, "verify", uri, *endpoint)
    assert rc == 1 and f"{key.split('/')[-1]}: crc32c" in out and "1 corrupt" in err
    # An object missing from a bucket copy is caught by the quick check.
    s3.delete_object(Bucket=bucket, Key="run/step-20/.metadata")
    rc, out, err = run(capsys, "list", uri, *endpoint, "--step", 20)
    assert rc == 1 and ".metadata: missing" in out


def test_bucket_target_on_gcs_names_the_corrupt_object(tmp_path, ref1, gcs_bucket, capsys):
    from ftfleet.trainer.checkpoint.tiers import gcs
    from tests.gcs_emulator import gcs_client

    uri = f"gs://{gcs_bucket}/run"
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [24])
    upload(gcs.GCSStore(uri), root, [24])
    assert run(capsys, "verify", uri)[0] == 0
    key = f"run/step-24/{shard(root / 'step-24').name}"
    blob = gcs_client().bucket(gcs_bucket).blob(key)
    blob.upload_from_string(flip_first_byte(blob.download_as_bytes()))
    rc, out, err = run(capsys, "verify", uri)
    assert rc == 1 and f"{key.split('/')[-1]}: crc32c" in out
    rc, _, err = run(capsys, "inspect", uri)
    assert rc == 1 and f"CORRUPT {key.split('/')[-1]}" in err


def load_gpt(weights: dict):
    """The BASE model, built fresh and loaded strictly from exported weights."""
    from ftfleet.trainer.config import load_config
    from ftfleet.trainer.model import GPT
    from tests.trainer.conftest import BASE, CONFIG

    model = GPT(load_config(CONFIG, BASE, environ={}).model.factories["factory"].args)
    model.load_state_dict(weights, strict=True)
    return model


def test_export_writes_plain_weights_a_fresh_model_loads_and_logs_skipped_steps(tmp_path, ref2, capsys):
    import safetensors
    import safetensors.torch
    import torch

    from ftfleet.trainer.checkpoint.safe_load import load_offline

    root = copy_steps(ref2["run_dir"] / "checkpoints", tmp_path / "ck", [20, 24])
    (root / "step-28").mkdir()  # an interrupted save, newer than the newest commit
    rc, out, err = run(capsys, "export", root, "latest", "--to", "torch", "--out", tmp_path / "w.pt")
    assert rc == 0 and "exported step-24" in out
    assert "step-28: no manifest.json (uncommitted): skipped" in err
    saved = load_offline(root / "step-24")["app"]["model"]
    plain = torch.load(tmp_path / "w.pt", weights_only=True)
    assert plain.keys() == saved.keys() and all(torch.equal(plain[k], saved[k]) for k in saved)
    load_gpt(plain)  # the 2-rank FSDP shards became one plain state dict

    rc, _, _ = run(capsys, "export", root, "20", "--to", "safetensors", "--out", tmp_path / "w.safetensors")
    assert rc == 0
    load_gpt(safetensors.torch.load_file(tmp_path / "w.safetensors"))
    with safetensors.safe_open(str(tmp_path / "w.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "20" and f.metadata()["format"] == "pt"  # Hugging Face's loaders need it
    assert not (tmp_path / "config.json").exists()  # not a Hugging Face model: no config beside

    rc, _, err = run(capsys, "export", root, "28", "--to", "torch")
    assert rc == 2 and "step-28" in err and "not a committed checkpoint" in err


def test_export_reads_a_bucket_and_refuses_a_corrupt_checkpoint(tmp_path, ref1, capsys, s3, bucket, moto_url):
    import safetensors.torch

    src = ref1["run_dir"] / "checkpoints" / "step-24"
    for f in sorted(src.iterdir(), key=lambda p: p.name == "manifest.json"):  # manifest last
        s3.upload_file(str(f), bucket, f"run/step-24/{f.name}")
    out = tmp_path / "w.safetensors"
    argv = ["export", f"s3://{bucket}/run", "24", "--to", "safetensors", "--out", out, "--endpoint-url", moto_url]
    assert run(capsys, *argv)[0] == 0
    load_gpt(safetensors.torch.load_file(out))

    name = shard(src).name
    s3.put_object(Bucket=bucket, Key=f"run/step-24/{name}", Body=b"\0" * (src / name).stat().st_size)
    rc, _, err = run(capsys, *argv)
    assert rc == 1 and f"CORRUPT {name}" in err
