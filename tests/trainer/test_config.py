"""The config is validated once, with errors that name the key and the fix."""

from __future__ import annotations

import pytest

from ftfleet.errors import ConfigError
from ftfleet.trainer.config import load_config
from tests.trainer.conftest import REPO

TINY = str(REPO / "trainer" / "configs" / "tiny.yaml")


def test_tiny_config_loads_with_defaults_filled_in():
    cfg = load_config(TINY, environ={})
    assert cfg.run_id == "tiny"
    assert cfg.run_dir == "runs/tiny"
    assert cfg.checkpoint.dir == "runs/tiny/checkpoints"
    assert cfg.parallel.mode == "fsdp"


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        TINY,
        [
            "train.steps=7",
            "optim.lr=1e-3",
            "checkpoint.pinned_steps=[2,4]",
            "model.dropout=0",
            "checkpoint.async_save=false",
        ],
        environ={},
    )
    assert cfg.train.steps == 7 and cfg.optim.factories["factory"].args.lr == pytest.approx(1e-3)
    assert cfg.checkpoint.pinned_steps == [2, 4]
    assert cfg.checkpoint.async_save is False


def test_fleet_environment_overrides_the_file_and_the_command_line_overrides_both():
    env = {
        "FTFLEET_RUN_ID": "prod",
        "FTFLEET_CKPT_DIR": "/fsx/ck",
        "FTFLEET_CKPT_URI": "s3://b/p",
        "FTFLEET_CKPT_REPLICA_URI": "s3://r/p",
        "FTFLEET_CKPT_UPLOAD": "fsx-export",
    }
    cfg = load_config(TINY, ["checkpoint.upload=none"], environ=env)
    assert (cfg.run_id, cfg.checkpoint.dir, cfg.checkpoint.uri, cfg.checkpoint.replica_uri) == (
        "prod",
        "/fsx/ck",
        "s3://b/p",
        "s3://r/p",
    )
    assert cfg.checkpoint.upload == "none"


@pytest.mark.parametrize(
    "override, words",
    [
        ("checkpoint.keep=1", ["checkpoint.keep=1", "at least 2"]),
        ("model.n_heads=3", ["model.d_model", "n_heads"]),
        ("checkpoint.upload=rsync", ["checkpoint.upload", "trainer, fsx-export, none"]),
        ("checkpoint.uri=/tmp/x", ["checkpoint.uri", "s3://"]),
        ("train.steps=abc", ["train.steps", "integer"]),
        ("train.stpes=3", ["train.stpes", "did you mean train.steps"]),
        ("parallel.mode=tp", ["parallel.mode", "fsdp or ddp"]),
        ("checkpoint.multipart_chunk_mb=1", ["multipart_chunk_mb", "5"]),
        ("model.dropout=1.5", ["model.dropout", "[0, 1)"]),
        ("nonsense", ["key.sub=value"]),
    ],
)
def test_bad_values_raise_one_line_naming_key_and_fix(override, words):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [override], environ={})
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_bad_upload_mode_from_the_environment_is_refused():
    with pytest.raises(ConfigError, match="checkpoint.upload"):
        load_config(TINY, environ={"FTFLEET_CKPT_UPLOAD": "sometimes"})


def test_missing_config_file_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_config_hash_ignores_run_length_and_parallelism_but_not_the_model():
    base = load_config(TINY, environ={}).config_hash()
    assert (
        load_config(
            TINY, ["train.steps=999", "parallel.mode=ddp", "resilience.interval.fixed_steps=7"], environ={}
        ).config_hash()
        == base
    )
    assert load_config(TINY, ["model.d_model=128"], environ={}).config_hash() != base
    assert load_config(TINY, ["train.global_batch_size=24"], environ={}).config_hash() != base


def test_trainer_exits_2_with_one_line_on_bad_config(tmp_path):
    import subprocess
    import sys

    from tests.trainer.conftest import child_env

    proc = subprocess.run(
        [sys.executable, "-m", "ftfleet.trainer", "--config", TINY, "checkpoint.keep=1", f"run_dir={tmp_path}"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: checkpoint.keep=1")
