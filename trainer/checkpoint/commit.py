"""The commit protocol, run on every rank once DCP has written ``step-N/``.

1. DCP wrote the shards (``__<rank>_<i>.distcp``, fsynced by each rank) and rank 0 wrote
   ``.metadata``. DCP itself gathers errors, so every rank learns whether that worked.
2. Each rank reports the size and CRC32C of the shard files it wrote: those its writer
   (:class:`~trainer.checkpoint.writer.ChecksummingWriter`) checksummed while writing
   them, and those named ``__<rank>_*`` in DCP's metadata. A file whose streamed CRC
   cannot be trusted (see :mod:`ftfleet.trainer.checkpoint.writer`) or that has no record is
   read back and checksummed, as is ``.metadata`` (small) on rank 0.
3. Rank 0 gathers the entries, checks they cover exactly the files DCP's metadata names,
   each reported once and no smaller than DCP says, and writes ``manifest.json``
   atomically (temp file, fsync, rename, fsync dir).
4. Rank 0 broadcasts the manifest (or the reason there is none): all ranks agree on
   whether step N exists.

A crash anywhere before the rename leaves a directory without a manifest, which no
loader counts; a crash after it leaves a complete, verified checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ftfleet.contract import MANIFEST_NAME, split_manifest_path
from ftfleet.retention import Milestone, Policy
from ftfleet.trainer.checkpoint.manifest import (
    FileEntry,
    Manifest,
    checksum_files,
    write_manifest,
)
from ftfleet.trainer.checkpoint.safe_load import read_metadata_file
from ftfleet.trainer.resilience import fencing

log = logging.getLogger("ftfleet.ckpt")

DCP_METADATA = ".metadata"


@dataclasses.dataclass(frozen=True, slots=True)
class Notes:
    """What a checkpoint's manifest records beyond the files: the evaluation's metrics,
    whether it is a milestone (trainer/validation.py), and the writer's retention policy."""

    validation: dict[str, float] | None = None
    milestone: Milestone | None = None
    retention: Policy | None = None


class CommitError(RuntimeError):
    """The checkpoint was not committed; the message says why (same on every rank)."""


def storage_records(metadata: Any, step_dir: Path | None = None) -> dict[Any, Any]:
    """DCP's storage records of a save (item index -> where its bytes are), from its
    global metadata (identical on every rank). Metadata returned without them is read
    from the ``.metadata`` file that DCP wrote in ``step_dir`` before it returned."""
    storage = getattr(metadata, "storage_data", None)
    if storage is None and step_dir is not None:
        storage = read_metadata_file(Path(step_dir) / DCP_METADATA).storage_data
    if storage is None:
        raise CommitError("DCP returned no storage records and wrote no .metadata with them")
    return dict(storage)


def storage_files(metadata: Any, step_dir: Path | None = None) -> dict[str, int]:
    """File -> size, from DCP's storage records: the shards written (by name) and the
    files of earlier checkpoints referenced (``../step-N/<file>``)."""
    sizes: dict[str, int] = {}
    for info in storage_records(metadata, step_dir).values():
        end = info.offset + info.length
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    return sizes


def own_entries(
    step_dir: Path, rank: int, shards: dict[str, int], streamed: dict[str, FileEntry | str] | None
) -> dict[str, FileEntry]:
    """The entries this rank reports for the shards DCP's metadata names: those its
    writer recorded, and those with its rank's prefix (DCP names a rank's files after
    its rank in the checkpoint group, which spans the world). A trusted streamed entry
    is used as is; any other file is read back, with a warning when the writer had
    records (``streamed`` not None) but no trusted one for it. Rank 0 adds
    ``.metadata``, always read back."""
    records = streamed or {}
    prefix = f"__{rank}_"
    mine = sorted(n for n in shards if n in records or n.startswith(prefix))
    entries: dict[str, FileEntry] = {}
    reread: list[str] = []
    for name in mine:
        record = records.get(name)
        if isinstance(record, FileEntry):
            entries[name] = record
            continue
        reread.append(name)
        if streamed is not None:
            log.warning(
                "%s/%s: no CRC from the write (%s); reading the file back",
                step_dir.name,
                name,
                record or "not written through this rank's writer",
            )
    if rank == 0:
        reread.append(DCP_METADATA)
    entries.update(checksum_files(step_dir, reread))
    return entries


def commit_step(
    comm: Any,
    step_dir: Path,
    step: int,
    metadata: Any,
    dcp_error: str | None,
    *,
    run_id: str,
    config_hash: str,
    torch_version: str,
    streamed: dict[str, FileEntry | str] | None = None,
    fence: fencing.Fence | None = None,
    notes: Notes | None = None,
    references: dict[str, FileEntry] | None = None,
    reused_bytes: int = 0,
) -> Manifest:
    """Collective: returns the committed manifest on every rank, or raises CommitError on
    every rank. ``streamed``: this rank's writer's records (file name -> entry, or the
    reason there is none); without them this rank reads back the files of its prefix.
    ``fence``: the writer's generation, checked by rank 0 right before the manifest is
    written; a refusal is every rank's (:func:`~ftfleet.trainer.resilience.fencing.refuse`:
    the process leaves, or a replaced attempt's commit raises CommitError). ``notes``:
    what the manifest records beside the files (rank 0's are used). ``references``: the
    files of earlier checkpoints this rank's records point at (``../step-N/<file>``), as
    their manifests list them, and ``reused_bytes`` the bytes of its records there (an
    incremental save: trainer/checkpoint/incremental.py)."""
    entries: dict[str, FileEntry] = {}
    error = dcp_error
    shards: dict[str, int] = {}
    if error is None:
        try:
            shards = storage_files(metadata, step_dir)
            entries = own_entries(step_dir, comm.rank, shards, streamed)
            for path, entry in (references or {}).items():
                # The base was checked when it was chosen; a file removed or rewritten
                # since (by hand, by another process) would be committed as missing.
                try:
                    size = (step_dir / path).stat().st_size
                except OSError:
                    size = None
                if size != entry.size:
                    raise CommitError(f"{path}: referenced with {entry.size} bytes, {size} on disk")
                entries[path] = entry
        except Exception as exc:  # noqa: BLE001 - reported to rank 0, decided there
            error = f"{type(exc).__name__}: {exc}"
    gathered = comm.gather((entries, error, reused_bytes))

    verdict: tuple[bool, str, bool] | None = None  # committed, manifest or problems, fenced
    if comm.rank == 0:
        problems = [f"rank {r}: {err}" for r, (_, err, _) in enumerate(gathered) if err]
        files: dict[str, FileEntry] = {}
        reported_by: dict[str, int] = {}
        for r, (part, _, _) in enumerate(gathered):
            for name, entry in part.items():
                if name in reported_by and not (name.startswith("../") and files[name] == entry):
                    problems.append(f"{name} reported by ranks {reported_by[name]} and {r}")
                reported_by[name] = r
                files[name] = entry
        if not problems:
            expected = set(shards) | {DCP_METADATA}
            if set(files) != expected:
                problems.append(f"checksummed {sorted(files)} but DCP wrote {sorted(expected)}")
            for name, size in shards.items():
                if name in files and files[name].size < size:
                    problems.append(f"{name}: {files[name].size} bytes on disk, DCP wrote {size}")
        if not problems:
            extra = {p.name for p in step_dir.iterdir()} - set(files) - {MANIFEST_NAME}
            if extra:
                log.warning("step-%d: ignoring files DCP did not report: %s", step, sorted(extra))
            referenced: dict[int, dict[str, FileEntry]] = {}
            for path in [p for p in files if p.startswith("../")]:
                owner, name = split_manifest_path(path)
                if owner is None or owner >= step:
                    problems.append(f"{path}: not a file of an earlier checkpoint")
                referenced.setdefault(owner or 0, {})[name] = files.pop(path)
        if not problems:
            manifest = Manifest(
                step=step,
                run_id=run_id,
                config_hash=config_hash,
                world_size=comm.world_size,
                files=files,
                torch_version=torch_version,
                validation=notes.validation if notes else None,
                milestone=notes.milestone if notes else None,
                retention=notes.retention if notes else None,
                references=referenced,
                reused_bytes=sum(reused for _, _, reused in gathered) if referenced else 0,
            )
            fenced = fencing.problem_of(fence)  # right before the write: one generation commits
            if fenced is not None:
                verdict = (False, fenced, True)
            else:
                try:
                    write_manifest(step_dir, manifest)
                    verdict = (True, manifest.to_json(), False)
                except OSError as exc:
                    problems.append(f"writing {MANIFEST_NAME}: {exc}")
        if verdict is None:
            verdict = (False, "; ".join(problems), False)
    ok, payload, fenced = comm.broadcast(verdict)
    if fenced:
        try:
            fencing.refuse(fence, f"checkpoint step-{step}", payload)
        except fencing.Fenced as exc:
            raise CommitError(str(exc)) from None
    if not ok:
        raise CommitError(f"step-{step} was not committed: {payload}")
    return Manifest.from_json(payload)
