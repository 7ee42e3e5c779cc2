"""A checkpoint's model weights as one plain file: for inference, or another framework.

The weights are read through the same safe loader as ``ftfleet ckpt inspect``
(:func:`~ftfleet.trainer.checkpoint.safe_load.load_offline`: tensors only, metadata
through an allowlist) and only the ``model`` entries are loaded, unsharded, in this
process. Stock ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` would
unpickle the metadata with plain ``pickle`` and write the optimizer state too.

* ``torch``: ``torch.save`` of the model's state dict, keyed as the model's own
  ``state_dict()`` (FSDP and DDP wrappers add nothing): ``model.load_state_dict(
  torch.load(path, weights_only=True))``;
* ``safetensors``: the same tensors in a safetensors file, read the same way
  (``safetensors.torch.load_file(path)``), with ``format: pt`` (which Hugging Face's
  loaders require), the step, run id and config hash in its metadata.

A checkpoint of a Hugging Face model holds its config (:class:`~ftfleet.trainer.hf.ConfigRecord`):
it is written as ``config.json`` beside the weights, so that a directory holding it and
``model.safetensors`` (or ``pytorch_model.bin``) loads with ``from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FORMATS = ("torch", "safetensors")
SUFFIX = {"torch": ".pt", "safetensors": ".safetensors"}
#: The weight file names Hugging Face's ``from_pretrained`` looks for in a directory.
HF_NAMES = {"torch": "pytorch_model.bin", "safetensors": "model.safetensors"}


def model_weights(step_dir: Path) -> dict[str, Any]:
    """The ``model`` entries of the checkpoint in ``step_dir``, unsharded, with rank 0's
    buffers (each rank's are kept apart: :mod:`~ftfleet.trainer.checkpoint.state`)."""
    from ftfleet.trainer.checkpoint.safe_load import load_offline
    from ftfleet.trainer.checkpoint.state import BUFFERS, rank_key

    own = rank_key(BUFFERS, 0)
    state = load_offline(step_dir, keys={"app.model", f"app.{own}"})["app"]
    return {**state["model"], **(state.get(own) or {}).get("values", {})}


def hf_config(step_dir: Path) -> str | None:
    """The ``config.json`` text of the Hugging Face model a checkpoint holds; None when it
    holds another model."""
    from ftfleet.trainer.checkpoint.safe_load import load_offline
    from ftfleet.trainer.hf import CONFIG_EXTRA

    key = f"app.extras.{CONFIG_EXTRA}"
    extras = load_offline(step_dir, keys={key}).get("app", {}).get("extras", {})
    text = extras.get(CONFIG_EXTRA, {}).get("json")
    return text if isinstance(text, str) else None


def write_weights(
    weights: dict[str, Any], out: Path, fmt: str, metadata: dict[str, str], config: str | None = None
) -> Path | None:
    """Write atomically: a partial file never carries the final name. With ``config`` (a
    Hugging Face model's), ``config.json`` beside ``out`` too; returns its path."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    if fmt == "torch":
        torch.save(weights, tmp)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp), metadata={"format": "pt", **metadata})
    tmp.replace(out)
    if config is None:
        return None
    beside = out.with_name("config.json")
    tmp = beside.with_name(".config.json.tmp")
    tmp.write_text(config)
    tmp.replace(beside)
    return beside
