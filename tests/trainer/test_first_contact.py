"""What a new user meets first: ``--print-config`` (every key as the run has it) and the
exported weights, readable as they are (``torch.load`` or safetensors) or, for a
Hugging Face model, by ``from_pretrained`` with the ``config.json`` written beside."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from ftfleet.cli import main as ftfleet
from ftfleet.trainer.__main__ import main as trainer
from ftfleet.trainer.config import load_config
from tests.trainer.conftest import REPO

TINY = REPO / "trainer" / "configs" / "tiny.yaml"


def test_print_config_shows_every_key_with_its_default_and_reads_back_as_the_same_config(tmp_path, capsys):
    assert trainer(["--config", str(TINY), "--print-config", "train.steps=7", "model.dropout=0"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed["train"]["steps"] == 7 and printed["model"]["dropout"] == 0
    assert printed["checkpoint"]["dir"] == "runs/tiny/checkpoints"  # where checkpoints land
    assert printed["resilience"]["interval"]["fixed_steps"] == 50  # the file's
    assert printed["optim"]["beta2"] == 0.95 and printed["optim"]["min_lr_ratio"] == 0.1  # the factories' defaults
    assert printed["train"]["huge_pages"] is True and printed["parallel"]["collective_timeout_s"] is None
    (tmp_path / "printed.yaml").write_text(out)
    again = load_config(tmp_path / "printed.yaml", environ={})
    assert again.effective() == printed
    assert again.config_hash() == load_config(TINY, ["train.steps=7", "model.dropout=0"], environ={}).config_hash()


def test_print_config_refuses_a_bad_key_in_one_line(capsys):
    assert trainer(["--config", str(TINY), "--print-config", "train.stepz=7"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown config key train.stepz: did you mean train.steps?"


def test_a_hugging_face_checkpoint_exports_to_a_directory_from_pretrained_loads(tmp_path, capsys):
    pytest.importorskip("transformers")
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from ftfleet.trainer.checkpoint.manager import CheckpointManager
    from ftfleet.trainer.checkpoint.state import AppState
    from ftfleet.trainer.hf import CONFIG_EXTRA, causal_lm, config_record
    from ftfleet.trainer.schemas import HFCausalLMConfig

    torch.manual_seed(0)
    sizes = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    model = causal_lm(HFCausalLMConfig(model_type="llama", overrides={**sizes, "num_attention_heads": 2}))
    app = AppState(model, torch.optim.AdamW(model.parameters()), rank=0, extras={CONFIG_EXTRA: config_record(model)})
    app.progress.step = 3
    manager = CheckpointManager(tmp_path / "ck", app, run_id="hf")
    manager.save(3, blocking=True)
    manager.close()

    out = tmp_path / "export" / "model.safetensors"
    assert ftfleet(["ckpt", "export", str(tmp_path / "ck"), "latest", "--to", "safetensors", "-o", str(out)]) == 0
    assert "from_pretrained reads the directory as model.safetensors" in capsys.readouterr().out
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["format"] == "pt" and f.metadata()["step"] == "3"
    assert json.loads((out.parent / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(out.parent)
    mine = model.state_dict()
    assert all(torch.equal(t, mine[k]) for k, t in loaded.state_dict().items())
