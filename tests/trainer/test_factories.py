"""The config names the user's code: factories resolve when the config loads, their
keys are typed by the factory's own dataclass or passed through, and every mistake is
one line naming the key (exit 2)."""

from __future__ import annotations

import dataclasses

import pytest

from ftfleet.errors import ConfigError
from ftfleet.trainer.config import load_config
from ftfleet.trainer.schemas import AdamWConfig, GPTConfig, SyntheticConfig, WarmupCosineConfig
from tests.trainer.conftest import REPO

TINY = str(REPO / "trainer" / "configs" / "tiny.yaml")
BYO = str(REPO / "examples" / "byo" / "config.yaml")


@pytest.fixture
def byo_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples" / "byo"))


@pytest.fixture
def bare(tmp_path) -> str:
    """A config with no section keys: every factory gets only what the test sets."""
    path = tmp_path / "bare.yaml"
    path.write_text("run_id: bare\n")
    return str(path)


def load(path, *overrides):
    return load_config(path, list(overrides), environ={})


def test_the_defaults_are_the_reference_gpt_on_synthetic_tokens_with_adamw():
    cfg = load(TINY)
    model, data = cfg.model.factories["factory"], cfg.data.factories["factory"]
    assert (cfg.model.factory, cfg.data.factory, cfg.loss.factory) == ("gpt", "synthetic", "next_token")
    assert model.target == "ftfleet.trainer.model:build"
    assert model.args == GPTConfig(vocab_size=128, seq_len=32, d_model=64, n_layers=2, n_heads=4, dropout=0.1)
    assert data.args == SyntheticConfig()
    assert cfg.optim.factories["factory"].args == AdamWConfig(lr=3e-3)
    assert cfg.optim.factories["scheduler"].args == WarmupCosineConfig(warmup_steps=20)


def test_a_factory_annotated_with_a_dataclass_gets_its_keys_typed(byo_path):
    from mypkg.model import TinyLMConfig

    cfg = load(BYO, "model.width=48")
    assert cfg.model.factories["factory"].args == TinyLMConfig(vocab=32, width=48, depth=2, dropout=0.1)
    with pytest.raises(ConfigError, match=r"^model.width='wide': expected an integer$"):
        load(BYO, "model.width=wide")


def test_an_unannotated_factory_receives_its_section_keys_as_a_dict(byo_path):
    cfg = load(BYO, "data.colour=blue")
    assert cfg.data.factories["factory"].args == {"samples": 50, "length": 16, "vocab": 32, "colour": "blue"}
    assert cfg.data.num_workers == 2  # ftfleet's own key is not passed through


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.widht=3", "unknown config key model.widht: did you mean model.width?"),
        ("model.init_frm=x", "unknown config key model.init_frm: did you mean model.init_from?"),
        ("data.num_worker=4", "unknown config key data.num_worker: did you mean data.num_workers?"),
        ("optim.warmup_step=3", "unknown config key optim.warmup_step: did you mean optim.warmup_steps?"),
        ("optim.momentm=0.5", "unknown config key optim.momentm: did you mean optim.momentum?"),
    ],
)
def test_an_unknown_key_gets_a_did_you_mean_whoever_owns_the_section(byo_path, override, message):
    with pytest.raises(ConfigError) as err:
        load(BYO, override)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.factory=gtp", ["model.factory='gtp'", "did you mean gpt?"]),
        (
            "model.factory=nopkg.model:build",
            ["model.factory=nopkg", "cannot import nopkg.model", "PYTHONPATH"],
        ),
        ("model.factory=mypkg.model:biuld", ["model.factory=mypkg.model:biuld", "no attribute 'biuld'", "build?"]),
        ("model.factory=tests.trainer.userpkg:NOT_CALLABLE", ["model.factory=", "is a int, not a callable"]),
        ("model.factory=tests.trainer.userpkg:takes_nothing", ["model.factory=", "calls it as (cfg[, job=...])"]),
        ("optim.factory=tests.trainer.userpkg:returns_a_list", ["optim.factory=", "(cfg, model"]),
        (
            "model.factory=tests.trainer.userpkg:strict_model model.width=3",
            ["model (tests.trainer.userpkg:strict", "width must be even"],
        ),
        ("data.factory=token_shards", ["data.path is empty", "ftfleet data prepare"]),
        ("parallel.wrap=[auto,Block]", ["parallel.wrap", "auto stands alone"]),
        ("parallel.wrap=nopkg:units", ["parallel.wrap=nopkg:units", "cannot import nopkg"]),
        ("parallel.mixed_precision=fp8", ["parallel.mixed_precision='fp8'", "none or bf16"]),
        ("parallel.mode=ddp parallel.mixed_precision=bf16", ["parallel.mixed_precision=bf16 needs parallel.mode=fsdp"]),
        ("model.factory=hf_causal_lm", ["exactly one of model.config", "model.model_type"]),
        ("model.factory=hf_causal_lm model.model_type=llama model.overrides=7", ["model.overrides=7", "mapping"]),
        ("data.num_workers=-1", ["data.num_workers=-1", "0 or more"]),
        ("data.start_method=threads", ["data.start_method='threads'", "auto, forkserver, spawn or fork"]),
        ("data.shuffle=sometimes", ["data.shuffle='sometimes'", "true or false"]),
        ("data.seq_len=-4", ["data.seq_len=-4", "0 for the model's"]),
        ("optim.grad_clip=-1", ["optim.grad_clip=-1.0", "0 (off)"]),
        ("optim.weight_decay=-0.1", ["optim.weight_decay=-0.1", "0 or more"]),
        ("optim.min_lr_ratio=2", ["optim.min_lr_ratio=2.0", "[0, 1]"]),
        ("optim.scheduler=cosine", ["optim.scheduler='cosine'", "warmup_cosine, constant"]),
        ("parallel.wrap=[]", ["parallel.wrap is empty"]),
        ("model.meta_init=maybe", ["model.meta_init='maybe'", "true or false"]),
    ],
)
def test_a_bad_factory_is_one_line_naming_the_key(byo_path, bare, override, words):
    with pytest.raises(ConfigError) as err:
        load(bare, *override.split())
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_the_config_hash_follows_what_the_factories_compute_not_where_things_are(byo_path, bare, tmp_path):
    base = load(BYO).config_hash()
    same = [
        "data.num_workers=0",
        "data.start_method=fork",
        "model.init_from=/elsewhere/w.pt",
        "model.meta_init=true",
        "train.steps=99",
    ]
    assert load(BYO, *same).config_hash() == base
    assert load(BYO, "model.width=48").config_hash() != base  # a typed key
    assert load(BYO, "data.samples=51").config_hash() != base  # a passed-through key
    assert load(BYO, "optim.lr=0.06").config_hash() != base
    shards = [f"data.path={tmp_path}/a", "data.factory=token_shards", "data.seq_len=8"]
    moved = [f"data.path={tmp_path}/b", "data.factory=token_shards", "data.seq_len=8"]
    assert load(bare, *shards).config_hash() == load(bare, *moved).config_hash()


def test_a_factory_key_may_be_a_mapping_passed_as_is(bare):
    cfg = load(bare, "model.factory=hf_causal_lm", "model.model_type=llama", "model.overrides={hidden_size: 16}")
    assert dataclasses.asdict(cfg.model.factories["factory"].args)["overrides"] == {"hidden_size": 16}


@pytest.fixture
def no_group(monkeypatch):
    """build() starts the trainer's process groups in this process (one rank)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    yield
    from ftfleet.trainer import distributed

    distributed.shutdown()


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.factory=tests.trainer.userpkg:returns_a_list", "model.factory returned list, not a torch.nn.Module"),
        ("optim.factory=tests.trainer.userpkg:not_an_optimizer", "optim.factory returned str, not a torch.optim"),
        ("data.factory=tests.trainer.userpkg:not_a_dataset", "data.factory=tests.trainer.userpkg:not_a_dataset"),
    ],
)
def test_what_a_factory_returns_is_checked_when_the_trainer_calls_it(bare, no_group, tmp_path, override, message):
    from ftfleet.trainer.train import build

    cfg = load(bare, override, f"run_dir={tmp_path}", "model.vocab_size=16", "model.seq_len=8")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build(cfg)


def test_shard_ids_beyond_the_models_vocabulary_are_refused_before_training(bare, no_group, tmp_path):
    from ftfleet.trainer.train import build

    cfg = load(bare, f"run_dir={tmp_path}", "model.vocab_size=16", "model.seq_len=8", "data.vocab_size=32")
    with pytest.raises(ConfigError, match="token ids go up to 31 but the model's embedding has 16 rows"):
        build(cfg)


@pytest.mark.integration
def test_the_trainer_exits_2_with_one_line_when_a_factory_returns_the_wrong_type(bare, tmp_path):
    import subprocess
    import sys

    from tests.trainer.conftest import child_env

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ftfleet.trainer",
            "--config",
            bare,
            "model.factory=tests.trainer.userpkg:returns_a_list",
            f"run_dir={tmp_path}",
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model.factory returned list")
