"""``model.init_from``: the weights a run starts from when there is no checkpoint.

Three sources, told apart by what is on disk:

* a DCP directory (it has ``.metadata``): an ftfleet checkpoint step (its model is
  under ``app.model``), a checkpoint holding the model under ``model``, or a plain
  model state dict. Every rank reads its shards, resharded to this world size.
* a ``torch.save`` file of a state dict (``{"model": ...}`` or ``{"state_dict": ...}``
  wrappers are unwrapped), loaded with ``weights_only=True``.
* a safetensors file, or a directory of them (a sharded Hugging Face checkpoint).

Rank 0 reads the keys and shapes first and compares them with the model's: a
parameter missing, one too many, or one of another shape is one line naming the first
such key, on every rank, before any tensor is read. Then rank 0 reads the tensors and
broadcasts them into the (sharded) model; values are cast to the model's dtypes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from ftfleet.errors import ConfigError, UserError

log = logging.getLogger("ftfleet.weights")

#: Where the model's keys may sit in a DCP checkpoint, most specific first.
DCP_PREFIXES = ("app.model.", "model.", "")
_WRAPPERS = ("model", "state_dict", "module")


class Source:
    """A weights file or directory: its keys and shapes, and its tensors."""

    kind = ""

    def __init__(self, path: Path):
        self.path = path

    def shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class TorchFile(Source):
    kind = "torch.save file"

    def __init__(self, path: Path):
        super().__init__(path)
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001 - pickle errors of many kinds
            detail = (str(exc).strip().splitlines() or [""])[0]
            raise UserError(f"not a loadable torch.save file ({type(exc).__name__}: {detail[:200]})") from None
        while isinstance(obj, dict) and len(obj) == 1 and next(iter(obj)) in _WRAPPERS:
            obj = next(iter(obj.values()))
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise UserError("a torch.save file that does not hold a state dict (names -> tensors)")
        self._sd: dict[str, torch.Tensor] = obj

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self._sd.items()}

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self._sd)


class SafetensorsSource(Source):
    kind = "safetensors"

    def __init__(self, path: Path):
        super().__init__(path)
        self.files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not self.files:
            raise UserError("the directory holds no .safetensors files")
        from safetensors import safe_open

        self._shapes: dict[str, tuple[int, ...]] = {}
        for f in self.files:
            try:
                with safe_open(f, framework="pt") as st:
                    for k in st.keys():
                        self._shapes[k] = tuple(st.get_slice(k).get_shape())
            except Exception as exc:  # noqa: BLE001 - a damaged header
                raise UserError(f"{f.name}: not a readable safetensors file ({exc})") from None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def tensors(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in self.files:
            out.update(load_file(f, device="cpu"))
        return out


class DCPSource(Source):
    kind = "DCP checkpoint"

    def __init__(self, path: Path):
        super().__init__(path)
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from ftfleet.trainer.checkpoint.safe_load import read_metadata_file

        meta = read_metadata_file(path / ".metadata")
        self.entries = {
            k: tuple(v.size) for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
        }
        self.prefix = ""

    def pick_prefix(self, expected: dict[str, tuple[int, ...]]) -> None:
        """The prefix under which most of the model's keys are found."""
        self.prefix = max(DCP_PREFIXES, key=lambda p: sum(f"{p}{k}" in self.entries for k in expected))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        n = len(self.prefix)
        return {k[n:]: v for k, v in self.entries.items() if k.startswith(self.prefix)}


def open_source(path: Path) -> Source:
    if not path.exists():
        raise UserError("no such file or directory")
    if path.is_dir():
        if (path / ".metadata").is_file():
            return DCPSource(path)
        if any(path.glob("*.safetensors")):
            return SafetensorsSource(path)
        raise UserError("a directory without DCP .metadata or .safetensors files")
    if path.suffix == ".safetensors":
        return SafetensorsSource(path)
    return TorchFile(path)


def mismatch(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], aliases: dict[str, str]) -> str:
    """The first key that keeps ``found`` from filling the model exactly, or ''."""
    for key in sorted(expected):
        if key not in found and aliases.get(key) not in found:
            return f"{key} is missing from it"
    for key in sorted(expected):
        shape = found.get(key, found.get(aliases.get(key, ""), expected[key]))
        if tuple(shape) != tuple(expected[key]):
            return f"{key} has shape {list(shape)} there, the model's is {list(expected[key])}"
    for key in sorted(found):
        if key not in expected:
            return f"{key} is in it but the model has no such parameter"
    return ""


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """name -> another name of the same tensor (tied weights, which files store once)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in _named_tensors(model):
        if id(p) in first:
            aliases[name] = first[id(p)]
            aliases[first[id(p)]] = name
        else:
            first[id(p)] = name
    return aliases


def _named_tensors(model: nn.Module):
    inner = getattr(model, "module", model)
    yield from inner.named_parameters(remove_duplicate=False)
    yield from inner.named_buffers(remove_duplicate=False)


def load_pretrained(model: nn.Module, init_from: str, *, rank: int, group: Any = None) -> str:
    """Collective: fill ``model`` (FSDP2, DDP or plain) from ``init_from``. Returns what
    was loaded, for the log. ConfigError naming the first mismatched key."""
    path = Path(init_from)
    model_sd = get_model_state_dict(model)
    expected = {k: tuple(v.shape) for k, v in model_sd.items()}
    aliases = tied_aliases(model)
    source: Source | None = None
    verdict: tuple[str, str, str] = ("", "", "")
    if rank == 0:
        try:
            source = open_source(path)
            if isinstance(source, DCPSource):
                source.pick_prefix(expected)
            verdict = (mismatch(expected, source.shapes(), aliases), source.kind, getattr(source, "prefix", ""))
        except UserError as exc:
            verdict = (str(exc), "", "")
    problem, kind, prefix = _broadcast(verdict, group)
    if problem:
        raise ConfigError(f"model.init_from={init_from}: {problem}")

    if kind == DCPSource.kind:
        _load_dcp(model, model_sd, path, prefix)
    else:
        full: dict[str, torch.Tensor] = {}
        if rank == 0:
            tensors = source.tensors()
            for key, value in model_sd.items():
                src = tensors[key] if key in tensors else tensors[aliases[key]]
                full[key] = src.to(dtype=value.dtype)
        set_model_state_dict(
            model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=dist.is_initialized())
        )
    return f"{kind} {path}"


def _load_dcp(model: nn.Module, model_sd: dict[str, Any], path: Path, prefix: str) -> None:
    from ftfleet.trainer.checkpoint.safe_load import load_into

    state: dict[str, Any] = model_sd
    for part in reversed([p for p in prefix.split(".") if p]):
        state = {part: state}
    load_into(state, path, expected=_checked_files(path))
    set_model_state_dict(model, model_sd)


def _checked_files(path: Path) -> dict[str, Any] | None:
    """What an ftfleet checkpoint's manifest lists (every file read is then checked
    against it, those it references in the sibling directories too); None for a DCP
    directory without one. A checkpoint that references files of others but whose
    manifest does not say with which bytes is refused: what sits beside it may be
    another checkpoint's."""
    from ftfleet.trainer.checkpoint.manifest import ManifestError, read_manifest
    from ftfleet.trainer.checkpoint.safe_load import read_metadata_file

    try:
        manifest = read_manifest(path)
    except ManifestError as exc:
        raise ConfigError(f"model.init_from={path}: its manifest.json does not read ({exc})") from None
    if manifest is not None:
        return manifest.every_file()
    storage = getattr(read_metadata_file(path / ".metadata"), "storage_data", None) or {}
    if any(str(info.relative_path).startswith("../") for info in storage.values()):
        raise ConfigError(
            f"model.init_from={path}: it reads files of other checkpoints and has no manifest to check them "
            "against; use a copy from `ftfleet ckpt export DIR STEP --to checkpoint`"
        )
    return None


def _broadcast(obj: Any, group: Any) -> Any:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
