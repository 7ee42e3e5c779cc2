"""The commit protocol, run on every rank once DCP has written ``step-N/``.

1. DCP wrote the shards (``__<rank>_<i>.distcp``, fsynced by each rank) and rank 0 wrote
   ``.metadata``. DCP itself gathers errors, so every rank learns whether that worked.
2. The files are split over ranks by size and each rank checksums its share.
3. Rank 0 gathers the checksums, checks they cover exactly the files DCP's metadata
   names, and writes ``manifest.json`` atomically (temp file, fsync, rename, fsync dir).
4. Rank 0 broadcasts the manifest (or the reason there is none): all ranks agree on
   whether step N exists.

A crash anywhere before the rename leaves a directory without a manifest, which no
loader counts; a crash after it leaves a complete, verified checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ftfleet.contract import MANIFEST_NAME
from trainer.checkpoint.manifest import (
    FileEntry,
    Manifest,
    assign_files,
    checksum_files,
    write_manifest,
)

log = logging.getLogger("ftfleet.ckpt")

DCP_METADATA = ".metadata"


class CommitError(RuntimeError):
    """The checkpoint was not committed; the message says why (same on every rank)."""


def storage_files(metadata: Any) -> dict[str, int]:
    """Shard file -> size, from DCP's global metadata (identical on every rank)."""
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    return sizes


def commit_step(comm: Any, step_dir: Path, step: int, metadata: Any, dcp_error: str | None,
                *, run_id: str, config_hash: str, torch_version: str) -> Manifest:
    """Collective: returns the committed manifest on every rank, or raises CommitError on
    every rank."""
    entries: dict[str, FileEntry] = {}
    error = dcp_error
    shards: dict[str, int] = {}
    if error is None:
        try:
            shards = storage_files(metadata)
            mine = assign_files(shards, comm.world_size)[comm.rank]
            if comm.rank == 0:
                mine = [*mine, DCP_METADATA]
            entries = checksum_files(step_dir, mine)
        except Exception as exc:  # noqa: BLE001 - reported to rank 0, decided there
            error = f"{type(exc).__name__}: {exc}"
    gathered = comm.gather((entries, error))

    verdict: tuple[bool, str] | None = None
    if comm.rank == 0:
        problems = [f"rank {r}: {err}" for r, (_, err) in enumerate(gathered) if err]
        files: dict[str, FileEntry] = {}
        for part, _ in gathered:
            files.update(part)
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
            manifest = Manifest(step=step, run_id=run_id, config_hash=config_hash,
                                world_size=comm.world_size, files=files,
                                torch_version=torch_version)
            try:
                write_manifest(step_dir, manifest)
                verdict = (True, manifest.to_json())
            except OSError as exc:
                problems.append(f"writing {MANIFEST_NAME}: {exc}")
        if verdict is None:
            verdict = (False, "; ".join(problems))
    ok, payload = comm.broadcast(verdict)
    if not ok:
        raise CommitError(f"step-{step} was not committed: {payload}")
    return Manifest.from_json(payload)
