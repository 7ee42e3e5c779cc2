"""Which checkpoints of a run a bucket holds, whatever the bucket's service.

A checkpoint counts in a bucket when its ``step-N/manifest.json`` is there and every
file the manifest lists is there with its size (contract.manifest_file_sizes): objects
arrive, or are replicated, one by one, so a manifest can be there before its shards.
Subclasses read one service (S3, Cloud Storage): the child prefixes under the run's
root, when a manifest arrived, an object's bytes, and the sizes under a prefix.
"""

from __future__ import annotations

from collections.abc import Mapping

from ftfleet import contract, retention

#: Step directories examined per bucket and sweep (newest first).
SCAN_LIMIT = 100


class CheckpointListing:
    def __init__(self, name: str, root: str):
        self.name, self.root = name, root
        self._committed: dict[int, float | None] = {}

    # --- what a service provides -----------------------------------------------------
    def child_prefixes(self, prefix: str) -> list[str]:
        """Names of the "folders" right under ``prefix`` (which ends with '/')."""
        raise NotImplementedError

    def arrival(self, key: str) -> float | None:
        """When the object ``key`` was written (epoch seconds), or None if it is absent."""
        raise NotImplementedError

    def read(self, key: str) -> bytes:
        raise NotImplementedError

    def sizes(self, prefix: str) -> dict[str, int]:
        """Object name below ``prefix`` -> size, for every object under it."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Step directories under the root, newest first (at most SCAN_LIMIT)."""
        found = [contract.parse_step_dir(name) for name in self.child_prefixes(f"{self.root}/")]
        return sorted((s for s in found if s is not None), reverse=True)[:SCAN_LIMIT]

    def manifest_key(self, step: int) -> str:
        return f"{self.root}/{contract.step_dir_name(step)}/{contract.MANIFEST_NAME}"

    def committed_at(self, step: int) -> float | None:
        """When the step's manifest arrived, or None without one."""
        if step not in self._committed:
            self._committed[step] = self.arrival(self.manifest_key(step))
        return self._committed[step]

    def complete(self, step: int) -> bool:
        """The manifest and every file it lists, with the listed sizes."""
        if self.committed_at(step) is None:
            return False
        try:
            wanted = contract.manifest_file_sizes(self.read(self.manifest_key(step)))
        except contract.ContractError:
            return False
        have = self.sizes(f"{self.root}/{contract.step_dir_name(step)}/")
        return all(have.get(name) == size for name, size in wanted.items())

    def newest_complete(self, steps: list[int]) -> int | None:
        return next((s for s in steps if self.complete(s)), None)


def recorded(text: bytes, sizes: Mapping[str, int]) -> tuple[retention.Recorded | None, bool]:
    """What a step's manifest records for retention (None: it does not read, or its file
    list does not: the step is kept, never guessed at), and whether every file it lists
    is there with its size (``sizes``: object name under the step -> size)."""
    try:
        record = retention.Recorded.parse(text)
        wanted = contract.manifest_file_sizes(text)
    except (ValueError, contract.ContractError):
        return None, False
    return record, all(sizes.get(name) == size for name, size in wanted.items())
