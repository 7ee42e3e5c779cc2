"""Loading a DCP checkpoint without unpickling anything a checkpoint could abuse.

Stock DCP unpickles ``.metadata`` with plain ``pickle`` and non-tensor entries with
``torch.load(weights_only=False)``: a checkpoint from an untrusted bucket could run code
on load. Here ``.metadata`` goes through an unpickler that resolves only the classes
DCP's metadata module defines, ``torch.Size``, dtypes and layouts and ``pathlib`` paths,
and non-tensor entries through ``torch.load(weights_only=True)``. Tensors were already
loaded with ``weights_only=True`` by DCP.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

from ftfleet.contract import EXIT_CONFIG
from ftfleet.errors import UserError, interrupt_in

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint's metadata references a global outside the allowlist."""


class CheckpointLoadError(RuntimeError):
    """DCP could not load a checkpoint (DCP's own exception is a BaseException, which
    ordinary ``except Exception`` handlers would let through)."""


class CheckpointMismatch(UserError):
    """The checkpoint cannot fit the state it is loaded into: a restart cannot fix that."""

    exit_code = EXIT_CONFIG


def _loading(fn, *args, **kwargs) -> None:
    from ftfleet.trainer.checkpoint.reader import CorruptFile

    try:
        fn(*args, **kwargs)
    except CheckpointException as exc:
        group = kwargs.get("process_group")
        rank = torch.distributed.get_rank(group) if torch.distributed.is_initialized() else 0
        if (interrupt := interrupt_in(exc, rank)) is not None:
            raise interrupt from None  # an in-process restart's request, wrapped by DCP
        # Every rank gets the same failures (by rank): each raises the same one.
        failures = [error for error, _trace in exc.failures.values()]
        for kind in (CheckpointMismatch, CorruptFile):
            for error in failures:
                if isinstance(error, kind):
                    raise error from None
        raise CheckpointLoadError(f"loading the checkpoint failed: {exc}") from None


#: Entries that must be in the checkpoint, with the shape they have here: the weights
#: and the optimizer's per-parameter state. Anything else a checkpoint lacks (an extra,
#: a scheduler, another device's RNG state, a hyperparameter) keeps its current value.
REQUIRED = ("app.model.", "app.optim.state.")


def _shape(md: Any) -> list[int] | None:
    return list(md.size) if isinstance(md, TensorStorageMetadata) else None


def fit(state_dict: dict[str, Any], metadata: Metadata, required: tuple[str, ...] = REQUIRED) -> list[str]:
    """Check that a flattened state dict can be loaded from a checkpoint. Raises
    :class:`CheckpointMismatch` naming the first entry that does not fit; returns the
    optional entries the checkpoint does not have."""
    saved = metadata.state_dict_metadata
    absent = []
    for fqn, obj in state_dict.items():
        name = fqn.removeprefix("app.")
        if fqn not in saved:
            if fqn.startswith(required):
                raise CheckpointMismatch(f"{name} is not in the checkpoint")
            absent.append(fqn)
            continue
        here = list(obj.size()) if isinstance(obj, torch.Tensor) else None
        there = _shape(saved[fqn])
        if here != there:

            def what(shape: list[int] | None) -> str:
                return "not a tensor" if shape is None else f"shape {shape}"

            raise CheckpointMismatch(f"{name} has {what(there)} in the checkpoint and {what(here)} here")
    for fqn in saved:
        if fqn.startswith(required[0]) and fqn not in state_dict:
            raise CheckpointMismatch(f"the checkpoint has {fqn.removeprefix('app.')}, which this model does not")
    return absent


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Pickle protocol 4 resolves a dotted name attribute by attribute, so
        # ("torch.distributed.checkpoint.metadata", "os.system") would reach any module
        # the allowed one imports: only plain names, and from the metadata module only
        # the classes it defines.
        if "." not in name:
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            if (module, name) in _ALLOWED:
                return super().find_class(module, name)
            if module == _METADATA_MODULE:
                obj = super().find_class(module, name)
                if isinstance(obj, type) and obj.__module__ == _METADATA_MODULE:
                    return obj
        raise UnsafeCheckpointError(
            f"checkpoint metadata references {module}.{name}, which a DCP checkpoint never "
            "needs; refusing to unpickle it"
        )


def read_metadata_file(path: str | Path) -> Metadata:
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{path} does not hold DCP metadata")
    return metadata


class SafeFileSystemReader(dcp.FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata_file(self._get_metadata_path(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_bytes_safely(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
    obj = torch.load(value, weights_only=True)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], obj)
    else:
        planner.state_dict[read_item.dest_index.fqn] = obj


class SafeLoadPlanner(DefaultLoadPlanner):
    """Loads non-tensor entries with ``weights_only=True``, refuses a checkpoint that
    does not fit (:func:`fit`), and leaves the optional entries it lacks alone
    (``absent``, for the log)."""

    def __init__(self) -> None:
        super().__init__()
        self.absent: list[str] = []

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        self.absent = fit(self.state_dict, self.metadata)
        for fqn in self.absent:
            del self.state_dict[fqn]
        return super().create_local_plan()

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_bytes_safely(self, read_item, value)


class _SafeEmptyLoadPlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_bytes_safely(self, read_item, value)


def load_into(
    state: dict[str, Any],
    step_dir: Path,
    process_group: Any = None,
    expected: dict[str, Any] | None = None,
    blank: bool = False,
) -> list[str]:
    """Load ``step_dir`` into ``state`` in place (collective over ``process_group``).
    Returns the optional entries the checkpoint lacked (they keep their values).

    ``expected``: the manifest's file entries. Every file read is then checked against
    them as it is read (:mod:`~ftfleet.trainer.checkpoint.reader`); one that does not
    match raises :class:`~ftfleet.trainer.checkpoint.reader.CorruptFile` on every rank,
    before any rank has changed ``state``. With ``blank`` (``state``'s tensors hold no
    values yet), each file is checked as its host tensors are copied, in one pass: a
    corrupt file then may leave some of those tensors overwritten, and nothing else."""
    planner = SafeLoadPlanner()
    if expected is None:
        reader: SafeFileSystemReader = SafeFileSystemReader(step_dir)
    else:
        from ftfleet.trainer.checkpoint.reader import VerifyingReader

        reader = VerifyingReader(step_dir, expected, blank=blank)
        reader.check_metadata()  # the same file on every rank: all raise, or none
    try:
        _loading(dcp.load, state, storage_reader=reader, planner=planner, process_group=process_group)
    finally:
        if expected is not None:
            reader.close()
    return planner.absent


def load_offline(step_dir: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The whole checkpoint (or ``keys``) as unsharded tensors in this process, without a
    model or a process group: for inspection and hashing."""
    # dcp.load only fills keys the caller provides; the planner that rebuilds the state
    # from the metadata is driven through the loader DCP itself uses for this
    # (_load_state_dict_from_keys), with the safe reader and planner.
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _loading(
        _load_state_dict,
        state,
        storage_reader=SafeFileSystemReader(step_dir),
        planner=_SafeEmptyLoadPlanner(keys=keys),
        no_dist=True,
    )
    return state
