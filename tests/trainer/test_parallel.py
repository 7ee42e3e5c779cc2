"""FSDP2 units (``parallel.wrap``), bf16 mixed precision and meta-device initialisation,
on CPU with gloo. What a GPU would add (NCCL, DTensor's CUDA RNG for meta init, bf16
kernels) is not exercised here: see docs/DATA.md's "Not verified on GPU"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ftfleet.errors import ConfigError
from ftfleet.trainer.checkpoint.safe_load import load_offline
from ftfleet.trainer.config import ParallelConfig
from ftfleet.trainer.model import GPT
from ftfleet.trainer.parallel import parallelize, shard_units
from ftfleet.trainer.schemas import GPTConfig, HFCausalLMConfig
from tests.trainer.conftest import REPO, ckpt_hash, run_trainer

SMALL = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=3, n_heads=2)
LLAMA = HFCausalLMConfig(
    model_type="llama",
    overrides={
        "vocab_size": 40,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    },
)


def llama() -> nn.Module:
    from ftfleet.trainer.hf import causal_lm

    return causal_lm(LLAMA)


def test_auto_wrap_finds_the_reference_blocks_hugging_face_layers_and_a_users_blocks(monkeypatch):
    gpt = GPT(SMALL)
    assert shard_units(gpt, ["auto"]) == list(gpt.blocks)
    hf = llama()
    assert shard_units(hf, ["auto"]) == list(hf.model.layers)  # from _no_split_modules
    monkeypatch.syspath_prepend(str(REPO / "examples" / "byo"))
    from mypkg.model import TinyLM, TinyLMConfig

    mine = TinyLM(TinyLMConfig())
    assert shard_units(mine, ["auto"]) == list(mine.layers)


def test_wrap_by_class_name_or_by_a_callable():
    gpt = GPT(SMALL)
    assert shard_units(gpt, ["Block"]) == list(gpt.blocks)
    assert shard_units(gpt, ["Block", "LayerNorm"])[:2] == [gpt.blocks[0], gpt.blocks[0].ln1]
    assert shard_units(gpt, ["tests.trainer.userpkg:blocks_of"]) == list(gpt.blocks)


@pytest.mark.parametrize(
    "wrap, message",
    [
        (["Blok"], "parallel.wrap: the model has no module of class Blok: did you mean Block?"),
        (["tests.trainer.userpkg:foreign_modules"], "returned Linear, not a submodule of the model"),
    ],
)
def test_a_wrap_that_names_nothing_in_the_model_is_one_line(wrap, message):
    with pytest.raises(ConfigError, match=message):
        shard_units(GPT(SMALL), wrap)


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_fp32_state(one_rank):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    torch.manual_seed(0)
    model = parallelize(GPT(SMALL), ParallelConfig(mixed_precision="bf16"), one_rank, on_meta=False, seed=0)
    tokens = torch.randint(0, 32, (2, 9))
    logits = model(tokens[:, :-1])
    assert logits.dtype == torch.bfloat16
    nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
    assert {p.dtype for p in model.parameters()} == {p.grad.dtype for p in model.parameters()} == {torch.float32}
    assert {v.dtype for v in get_model_state_dict(model).values()} == {torch.float32}


def test_meta_init_allocates_after_sharding_and_uses_the_models_own_init(one_rank):
    def build(seed: int) -> nn.Module:
        with torch.device("meta"):
            model = GPT(SMALL)
        assert all(p.is_meta for p in model.parameters())
        return parallelize(model, ParallelConfig(), one_rank, on_meta=True, seed=seed)

    a, b, c = build(1), build(1), build(2)
    full = {k: v.full_tensor() for k, v in a.state_dict().items()}
    assert not any(p.is_meta for p in a.parameters())
    assert all(torch.equal(full[k], v.full_tensor()) for k, v in b.state_dict().items())  # seeded
    assert not torch.equal(full["tok_emb.weight"], c.state_dict()["tok_emb.weight"].full_tensor())
    assert torch.equal(full["blocks.0.ln1.weight"], torch.ones(16))  # GPT.reset_parameters ran
    assert 0.01 < full["blocks.0.attn.qkv.weight"].std() < 0.03


def test_meta_init_recomputes_a_hugging_face_models_rotary_table(one_rank):
    reference = llama()
    with torch.device("meta"):
        model = llama()
    model = parallelize(model, ParallelConfig(), one_rank, on_meta=True, seed=0)
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)


def test_a_model_without_an_init_cannot_be_meta_initialised(one_rank):
    class Bare(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(4, 4))

    with torch.device("meta"):
        model = Bare()
    with pytest.raises(ConfigError, match="model.meta_init: Bare has no init_weights.. or reset_parameters"):
        parallelize(model, ParallelConfig(), one_rank, on_meta=True, seed=0)


BASE_GPT = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=2, dropout=0.1)  # tests' BASE


@pytest.mark.integration
def test_meta_init_with_bf16_starts_from_init_from_and_resumes_bit_identically(tmp_path):
    """2 ranks, FSDP2, meta init, bf16 compute, pretrained weights. A run stopped and
    resumed ends where an uninterrupted one ends; init_from counts only at the start."""
    torch.manual_seed(123)
    weights = GPT(BASE_GPT).state_dict()
    torch.save(weights, tmp_path / "w.pt")
    common = ["model.meta_init=true", "parallel.mixed_precision=bf16", "checkpoint.keep=100"]
    start = [*common, f"model.init_from={tmp_path / 'w.pt'}"]

    run = tmp_path / "run"
    first = run_trainer(2, run, *start, "train.stop_at_step=0")
    assert first["step"] == 0 and "initialised from torch.save file" in first["_stderr"]
    saved = load_offline(run / "checkpoints" / "step-0")["app"]["model"]
    assert saved.keys() == weights.keys() and all(torch.equal(saved[k], weights[k]) for k in weights)
    # A checkpoint exists now: init_from is not read (a missing file would stop the run).
    second = run_trainer(2, run, *common, f"model.init_from={tmp_path / 'gone.pt'}")
    assert second["resumed_from"]["step"] == 0 and second["step"] == 24

    straight = tmp_path / "straight"
    whole = run_trainer(2, straight, *start)
    assert whole["step"] == 24 and whole["resumed_from"] is None
    assert ckpt_hash(run / "checkpoints" / "step-24") == ckpt_hash(straight / "checkpoints" / "step-24")


def _config(*overrides: str):
    from ftfleet.trainer.config import load_config

    if "hf" in overrides:  # tiny.yaml's model keys are the GPT's
        rest = [o for o in overrides if o != "hf"]
        return load_config(REPO / "examples" / "hf" / "config.yaml", rest, environ={})
    return load_config(REPO / "trainer" / "configs" / "tiny.yaml", list(overrides), environ={})


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    sd = getattr(model, "module", model).state_dict()
    return {k: v.full_tensor() if isinstance(v, DTensor) else v.clone() for k, v in sd.items()}


TIED = (
    "model.overrides={vocab_size: 64, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, "
    "num_attention_heads: 2, num_key_value_heads: 2, tie_word_embeddings: true}"
)


@pytest.mark.parametrize(
    "overrides",
    [("parallel.mode=fsdp",), ("parallel.mode=ddp",), ("hf",), ("hf", "parallel.mode=ddp", TIED)],
    ids=["gpt-fsdp", "gpt-ddp", "llama-fsdp", "llama-tied-ddp"],
)
def test_a_build_for_a_restore_skips_the_init_and_its_deferred_init_gives_the_usual_weights(one_rank, overrides):
    from ftfleet.trainer.train import build_model

    cfg = _config(*overrides)
    usual, none = build_model(cfg, one_rank, restoring=False)
    assert none is None
    torch.manual_seed(99)  # the training RNG, seeded after the build
    model, deferred = build_model(cfg, one_rank, restoring=True)
    assert deferred is not None and not any(p.is_meta for p in model.parameters())
    rng = torch.get_rng_state()
    if cfg.model.factory == "hf_causal_lm":  # a buffer that is not saved keeps its value
        inner, ref = getattr(model, "module", model), getattr(usual, "module", usual)
        assert torch.equal(inner.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
        tied = inner.lm_head.weight is inner.model.embed_tokens.weight
        assert tied == (ref.lm_head.weight is ref.model.embed_tokens.weight) == (TIED in overrides)
    deferred()
    want, got = _values(usual), _values(model)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert torch.equal(torch.get_rng_state(), rng)  # the init leaves the training RNG alone


def test_a_model_that_needs_its_values_to_be_built_is_built_with_its_init(one_rank, monkeypatch, caplog):
    from ftfleet.trainer import train

    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.register_buffer("norm", self.w.detach().norm().reshape(1))  # computed from a value

    class Special(nn.Parameter):
        pass

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = Special(torch.randn(4, 4))

    cfg = _config()
    for cls, why in ((Reads, "a buffer was computed from a parameter"), (Odd, "parameter w is a Special")):
        monkeypatch.setitem(cfg.model.factories, "factory", lambda job, cls=cls: cls())
        with caplog.at_level("INFO", logger="ftfleet.train"):
            model, deferred = train.build_model(cfg, one_rank, restoring=True)
        assert deferred is None and f"model: built with its init ({why})" in caplog.text
        torch.manual_seed(cfg.seed)
        assert torch.equal(_values(model)["w"], cls().w.detach())
        caplog.clear()


def test_the_parameter_patch_is_undone_when_the_build_fails():
    from ftfleet.trainer.parallel import NeedsValues, parameters_on_meta

    register = nn.Module.register_parameter
    with pytest.raises(NeedsValues, match="RuntimeError"), parameters_on_meta():
        nn.Linear(2, 2).weight.item()
    assert nn.Module.register_parameter is register and not nn.Linear(2, 2).weight.is_meta
