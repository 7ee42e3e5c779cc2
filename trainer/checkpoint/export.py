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

``checkpoint`` is the whole checkpoint instead, as a tier holds it (``OUT/step-N/``) but
self-contained (:func:`write_checkpoint`): the files an incremental checkpoint
references are copied into it, so it can be moved, archived or handed on alone, and a
run (``checkpoint.dir=OUT``) or ``model.init_from`` reads it.

A checkpoint of a Hugging Face model holds its config (:class:`~ftfleet.trainer.hf.ConfigRecord`):
it is written as ``config.json`` beside the weights, so that a directory holding it and
``model.safetensors`` (or ``pytorch_model.bin``) loads with ``from_pretrained``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FORMATS = ("torch", "safetensors", "checkpoint")
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


def write_checkpoint(step_dir: Path, manifest: Any, root: Path) -> Any:
    """Copy the verified checkpoint ``manifest`` of ``step_dir`` to ``root/step-N``, with
    every file it references copied in as ``step-M.<name>`` and DCP's ``.metadata``
    pointing there; its manifest lists them as its own. Atomic: the directory appears
    complete under its final name or not at all. Returns the new manifest."""
    import dataclasses
    import pickle
    import shutil

    from ftfleet.contract import split_manifest_path, step_dir_name
    from ftfleet.errors import UserError
    from ftfleet.trainer.checkpoint.commit import DCP_METADATA
    from ftfleet.trainer.checkpoint.manifest import checksum_files, fsync_dir, write_manifest
    from ftfleet.trainer.checkpoint.safe_load import read_metadata_file

    final = root / step_dir_name(manifest.step)
    if final.exists():
        raise UserError(f"{final} exists: pick another -o directory or remove it")
    tmp = root / f".{final.name}.export.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        renamed: dict[str, str] = {}
        for path in manifest.every_file():
            owner, name = split_manifest_path(path)
            here = name if owner is None else f"{step_dir_name(owner)}.{name}"
            renamed[path] = here
            if path != DCP_METADATA:
                shutil.copyfile(step_dir / path, tmp / here)
                with open(tmp / here, "rb") as copied:  # durable before the rename names them
                    os.fsync(copied.fileno())
        metadata = read_metadata_file(step_dir / DCP_METADATA)
        for index, info in list(metadata.storage_data.items()):
            metadata.storage_data[index] = dataclasses.replace(info, relative_path=renamed[info.relative_path])
        with open(tmp / DCP_METADATA, "wb") as f:
            pickle.dump(metadata, f)
            f.flush()
            os.fsync(f.fileno())
        files = checksum_files(tmp, sorted(renamed.values()))
        for path, entry in manifest.every_file().items():
            if path != DCP_METADATA and files[renamed[path]] != entry:
                raise UserError(f"{path} changed while it was copied to {final}: run the export again")
        copy = dataclasses.replace(manifest, files=files, references={}, reused_bytes=0)
        write_manifest(tmp, copy)  # fsyncs the manifest and the directory
        tmp.rename(final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return copy
