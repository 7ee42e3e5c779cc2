"""Incremental checkpoints: a tensor whose bytes did not change since the previous
checkpoint of the tier is not written again (``checkpoint.incremental``).

The unit is DCP's write item (a tensor, or one rank's shard of one). Each save records a
fingerprint of every tensor item it saw (:func:`fingerprint`: dtype, shape and a sample
of its bytes, or all of them for a small tensor); the next save compares each item with
the previous checkpoint's (the *base*, :class:`Base`):

* a different fingerprint: the tensor changed, it is written (what full training meets
  for every tensor, at the cost of the sample);
* the same fingerprint: the bytes DCP stored for the base are read back and compared
  with the tensor's, every byte (a sample, like a CRC, only says "probably the same";
  the promise is a bit-identical restore). Equal: the item is not written, its storage
  record is the base's, pointing at the base's file (``../step-N/<file>``, or the file
  the base itself referenced: references always name the checkpoint that wrote the
  bytes, never a chain). A tensor of at most :data:`WHOLE_BYTES` is fingerprinted whole,
  so its equal fingerprint is the comparison.

The checkpoint's manifest lists the files it references with the size and CRC32C they
were committed with (manifest.py), so restore, verification and upload check them like
its own files, and retention keeps every referenced checkpoint (ftfleet/retention.py).

Every ``incremental_full_every``-th save writes every tensor: a chain of references
never spans more saves than that, so one lost or corrupt file of the tier costs at most
that many checkpoints, and retention can free a chain once none of it is kept. The first
save of a process writes every tensor too (the fingerprints are the writing process's).
Byte items (the loader's state, RNG states, the progress counters) are always written,
and so is a tensor that reaches the writer still on a device (a synchronous save of GPU
state: DCP copies it to the host while it writes); an asynchronous save hands the writer
its staged host copies.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ftfleet.contract import step_dir_name
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest, read_manifest
from ftfleet.trainer.checkpoint.writer import ChecksummingWriter

#: A tensor of at most this many bytes is fingerprinted whole (no read-back needed).
WHOLE_BYTES = 4096
#: Bytes sampled from a larger tensor, at an even stride from its first (and its last).
SAMPLES = 1024


def fingerprint(tensor: torch.Tensor) -> bytes | None:
    """dtype, shape and the bytes of ``tensor`` (a CPU tensor), all of them up to
    :data:`WHOLE_BYTES`, else :data:`SAMPLES` of them at an even stride and the last
    one; None for a tensor that cannot be compared as raw bytes (not contiguous, not on
    the CPU): it is always written."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    raw = tensor.detach().reshape(-1).view(torch.uint8).numpy()
    head = f"{tensor.dtype}|{tuple(tensor.shape)}|".encode()
    if raw.size <= WHOLE_BYTES:
        return head + raw.tobytes()
    stride = (raw.size - 1) // (SAMPLES - 1)
    return head + raw[::stride][:SAMPLES].tobytes() + raw[-1:].tobytes()


@dataclasses.dataclass(frozen=True, slots=True)
class Base:
    """The checkpoint a save may reference: the newest committed one of the tier that this
    process wrote, as this rank wrote it."""

    step: int
    created_at: float
    """Its manifest's, to tell it from another commit of the same step."""
    records: dict[MetadataIndex, tuple[_StorageInfo, bytes]]
    """This rank's tensor items -> where their bytes are (a path relative to a sibling
    checkpoint's directory: ``../step-N/<file>``) and their fingerprint."""
    files: dict[str, FileEntry]
    """Every file the base reads, by that relative path, as its manifest lists it."""
    chain: int
    """How many saves in a row, this one included, referenced an earlier one (0: it wrote
    every tensor)."""

    @classmethod
    def of(
        cls,
        manifest: Manifest,
        storage: dict[MetadataIndex, _StorageInfo],
        prints: dict[MetadataIndex, bytes],
        chain: int,
    ) -> Base:
        """The base that checkpoint ``manifest`` (committed, with DCP's ``storage``
        records) is for the next save, from the fingerprints this rank took of it."""
        here = f"../{step_dir_name(manifest.step)}/"

        def sibling(path: str) -> str:
            return path if path.startswith("../") else here + path

        records = {
            index: (dataclasses.replace(storage[index], relative_path=sibling(storage[index].relative_path)), fp)
            for index, fp in prints.items()
            if index in storage
        }
        files = {sibling(path): entry for path, entry in manifest.every_file().items()}
        return cls(manifest.step, manifest.created_at, records, files, chain)

    def still_there(self, tier_root: Path) -> bool:
        """Its manifest is still the one it was committed with (not removed, not a later
        save of the same step)."""
        try:
            manifest = read_manifest(tier_root / step_dir_name(self.step))
        except (OSError, ValueError):
            return False
        return manifest is not None and manifest.created_at == self.created_at


def same_bytes(step_dir: Path, info: _StorageInfo, tensor: torch.Tensor) -> bool:
    """Whether the record DCP stored at ``info`` (relative to ``step_dir``) holds exactly
    ``tensor``'s bytes, as a plain little-endian torch.save record of its dtype and shape.
    The file is mapped (copy on write: writable for torch, never written), not read into
    a buffer: a record of gigabytes (a frozen embedding) costs page cache the kernel can
    take back, not memory of the process."""
    from ftfleet.trainer.checkpoint.reader import _NotPlain, raw_span

    if info.transform_descriptors:
        return False
    try:
        with open(step_dir / info.relative_path, "rb") as f:
            if os.fstat(f.fileno()).st_size < info.offset + info.length:
                return False
            start_page = info.offset - info.offset % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(
                f.fileno(), info.offset + info.length - start_page, access=mmap.ACCESS_COPY, offset=start_page
            )
    except (OSError, ValueError):
        return False
    try:
        record = memoryview(mapped)[info.offset - start_page :]
        try:
            start, nbytes = raw_span(record, tensor)
        except (_NotPlain, ValueError, KeyError):
            return False
        stored = torch.frombuffer(record, dtype=torch.uint8, count=nbytes, offset=start)
        live = tensor.detach().reshape(-1).view(torch.uint8)
        if nbytes % 8 == 0 and (info.offset + start) % 8 == 0 and live.data_ptr() % 8 == 0:
            stored, live = stored.view(torch.int64), live.view(torch.int64)  # compared 8 bytes at a time
        equal = torch.equal(stored, live)
        del stored, record
        return equal
    finally:
        try:
            mapped.close()
        except BufferError:  # a view still alive (an exception's frame): unmapped when it goes
            pass


class IncrementalWriter(ChecksummingWriter):
    """A :class:`ChecksummingWriter` that, given a ``base``, does not write the tensor
    items whose bytes the base holds; with ``track``, it fingerprints every tensor item it
    saves (:attr:`prints`) for the next save's base. :attr:`references` names the base's
    files this save's records point at, with their entries (for the manifest)."""

    def __init__(self, *args: Any, base: Base | None = None, track: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.base = base
        self.track = track or base is not None
        self.prints: dict[MetadataIndex, bytes] = {}
        self.references: dict[str, FileEntry] = {}
        self.reused_bytes = 0

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        self.prints, self.references, self.reused_bytes = {}, {}, 0

    def _candidate(self, item: WriteItem, tensor: Any) -> tuple[_StorageInfo, bool] | None:
        """The base's record of ``item`` when its fingerprint equals ``tensor``'s, and
        whether that settles it (a tensor fingerprinted whole); None: write it."""
        fp = fingerprint(tensor) if isinstance(tensor, torch.Tensor) else None
        if fp is None:
            return None
        self.prints[item.index] = fp
        if self.base is None or (known := self.base.records.get(item.index)) is None:
            return None
        info, base_fp = known
        if base_fp != fp or info.relative_path not in self.base.files:
            return None
        return info, tensor.numel() * tensor.element_size() <= WHOLE_BYTES

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if not self.track:
            return super().write_data(plan, planner)
        rest: list[WriteItem] = []
        check: list[tuple[WriteItem, _StorageInfo, torch.Tensor]] = []
        settled: list[tuple[WriteItem, _StorageInfo]] = []
        for item in plan.items:
            tensor = None if item.type == WriteItemType.BYTE_IO else planner.resolve_data(item)
            found = None if tensor is None else self._candidate(item, tensor)
            if found is None:
                rest.append(item)
            elif found[1]:
                settled.append((item, found[0]))
            else:
                check.append((item, found[0], tensor))
        # Read back and compare on the writer's threads (the reads and the comparison leave the GIL).
        with ThreadPoolExecutor(max_workers=max(1, min(self.thread_count, len(check)))) as pool:
            same = list(pool.map(lambda c: same_bytes(Path(self.path), c[1], c[2]), check))
        settled += [(item, info) for (item, info, _), equal in zip(check, same, strict=True) if equal]
        rest += [item for (item, _, _), equal in zip(check, same, strict=True) if not equal]
        reused = []
        for item, info in settled:
            self.references[info.relative_path] = self.base.files[info.relative_path]
            self.reused_bytes += info.length
            reused.append(WriteResult(index=item.index, size_in_bytes=info.length, storage_data=info))
        if rest:
            written = super().write_data(dataclasses.replace(plan, items=rest), planner).wait()
        else:
            written = []  # every item is the base's: this rank writes no file
        done: Future[list[WriteResult]] = Future()
        done.set_result(written + reused)
        return done
