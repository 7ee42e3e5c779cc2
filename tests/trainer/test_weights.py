"""``model.init_from``: a DCP directory, a torch.save file, or safetensors (a file or a
Hugging Face directory) fill the model exactly; a mismatch is one line naming the
first key."""

from __future__ import annotations

import pytest
import torch

from ftfleet.errors import ConfigError
from ftfleet.trainer.model import GPT
from ftfleet.trainer.schemas import GPTConfig, HFCausalLMConfig
from ftfleet.trainer.weights import load_pretrained
from tests.trainer.conftest import in_process_manager

SMALL = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2)


def gpt(seed: int, cfg: GPTConfig = SMALL) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("wrapper", [None, "model", "state_dict"])
def test_a_torch_save_file_fills_the_model(tmp_path, wrapper):
    src, dst = gpt(1), gpt(2)
    sd = src.state_dict()
    torch.save(sd if wrapper is None else {wrapper: sd}, tmp_path / "w.pt")
    assert "torch.save file" in load_pretrained(dst, str(tmp_path / "w.pt"), rank=0)
    assert same_weights(src, dst)


def test_a_safetensors_file_fills_the_model_cast_to_its_dtypes(tmp_path):
    from safetensors.torch import save_file

    src, dst = gpt(1), gpt(2)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in src.state_dict().items()}, tmp_path / "w.safetensors")
    load_pretrained(dst, str(tmp_path / "w.safetensors"), rank=0)
    for key, value in dst.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, src.state_dict()[key].to(torch.bfloat16).float())


def test_a_hugging_face_directory_fills_a_hugging_face_model(tmp_path):
    from ftfleet.trainer.hf import causal_lm

    cfg = HFCausalLMConfig(
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
    torch.manual_seed(1)
    src = causal_lm(cfg)
    src.save_pretrained(tmp_path / "hf")  # config.json + model.safetensors
    torch.manual_seed(2)
    dst = causal_lm(HFCausalLMConfig(config=str(tmp_path / "hf")))
    assert not same_weights(src, dst)
    assert "safetensors" in load_pretrained(dst, str(tmp_path / "hf"), rank=0)
    assert same_weights(src, dst)


def test_a_hugging_face_config_that_is_not_there_is_one_line(tmp_path):
    from ftfleet.trainer.hf import causal_lm

    with pytest.raises(ConfigError, match=f"^model.config={tmp_path}: no usable Hugging Face config"):
        causal_lm(HFCausalLMConfig(config=str(tmp_path)))
    with pytest.raises(ConfigError, match="^model.model_type=nosuchmodel: no usable Hugging Face config"):
        causal_lm(HFCausalLMConfig(model_type="nosuchmodel"))


def test_an_ftfleet_checkpoint_step_fills_the_model(tmp_path):
    ckpt = in_process_manager(tmp_path / "ck")
    try:
        ckpt.save(0, blocking=True)
    finally:
        ckpt.close()
    model = ckpt.app_state.model
    torch.manual_seed(99)
    fresh = GPT(model.cfg)
    assert "DCP checkpoint" in load_pretrained(fresh, str(tmp_path / "ck" / "step-0"), rank=0)
    assert same_weights(model, fresh)


def test_tied_weights_stored_once_fill_both_names(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 4)
            self.out = torch.nn.Linear(4, 8, bias=False)
            self.out.weight = self.emb.weight

    src, dst = Tied(), Tied()
    torch.save({"emb.weight": src.emb.weight.detach()}, tmp_path / "w.pt")
    load_pretrained(dst, str(tmp_path / "w.pt"), rank=0)
    assert torch.equal(dst.out.weight, src.emb.weight)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("drop", "head.weight is missing from it"),
        ("extra", "lm_extra.bias is in it but the model has no such parameter"),
        ("reshape", "tok_emb.weight has shape [16, 32] there, the model's is [32, 16]"),
        ("nowhere", "no such file or directory"),
        ("empty-dir", "a directory without DCP .metadata or .safetensors files"),
        ("not-a-state-dict", "does not hold a state dict"),
        ("garbage", "not a loadable torch.save file"),
    ],
)
def test_weights_that_do_not_fit_are_one_line_naming_the_first_key(tmp_path, damage, message):
    sd = gpt(1).state_dict()
    path = tmp_path / "w.pt"
    if damage == "drop":
        del sd["head.weight"]
    elif damage == "extra":
        sd["lm_extra.bias"] = torch.zeros(3)
    elif damage == "reshape":
        sd["tok_emb.weight"] = sd["tok_emb.weight"].t().contiguous()
    if damage in ("drop", "extra", "reshape"):
        torch.save(sd, path)
    elif damage == "nowhere":
        path = tmp_path / "nope.pt"
    elif damage == "empty-dir":
        path = tmp_path / "dir"
        path.mkdir()
    elif damage == "not-a-state-dict":
        torch.save([1, 2, 3], path)
    elif damage == "garbage":
        path.write_bytes(b"not a pickle")
    dst = gpt(2)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(ConfigError) as err:
        load_pretrained(dst, str(path), rank=0)
    assert str(err.value).startswith(f"model.init_from={path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)
    assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items()), "a refused load changed the model"
