"""The fast POSIX tier: local NVMe, or the FSx / Parallelstore / Managed Lustre mount.

Every rank must see the same directory (a shared file system, or one node): DCP lets any
rank read any shard when the world size changes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ftfleet.contract import MANIFEST_NAME, parse_step_dir, step_dir_name
from ftfleet.trainer.checkpoint.manifest import Manifest, fsync_dir, read_manifest


class LocalTier:
    name = "local"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def all_steps(self) -> list[int]:
        """Steps with a directory, committed or not."""
        if not self.root.is_dir():
            return []
        steps = (parse_step_dir(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(s for s in steps if s is not None)

    def committed_steps(self) -> list[int]:
        """Steps whose directory holds a ``manifest.json`` of any kind: one that is not a
        readable file is a damaged checkpoint, which restore reports and skips."""
        return [s for s in self.all_steps() if (self.step_dir(s) / MANIFEST_NAME).exists()]

    def read_manifest(self, step: int) -> Manifest | None:
        return read_manifest(self.step_dir(step))

    def remove_step(self, step: int) -> None:
        """Delete a step, manifest first and durably, so a crash halfway through leaves an
        uncommitted directory and never a committed checkpoint with files missing."""
        d = self.step_dir(step)
        if not d.exists():
            return
        try:
            (d / MANIFEST_NAME).unlink()
            fsync_dir(d)
        except FileNotFoundError:
            pass
        shutil.rmtree(d, ignore_errors=True)

    def describe(self) -> str:
        return str(self.root)
