"""Which checkpoints of a run a bucket holds, whatever the bucket's service.

A checkpoint counts in a bucket when its ``step-N/manifest.json`` is there and every
file the manifest lists is there with its size (contract.manifest_file_sizes), the files
of earlier checkpoints it references included: objects arrive, or are replicated, one by
one, so a manifest can be there before its shards.
Subclasses read one service (S3, Cloud Storage): the child prefixes under the run's
root, when a manifest arrived, an object's bytes, and the sizes under a prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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
            return whole(wanted, lambda s: self.sizes(f"{self.root}/{contract.step_dir_name(s)}/"), step)
        except contract.ContractError:
            return False

    def newest_complete(self, steps: list[int]) -> int | None:
        return next((s for s in steps if self.complete(s)), None)


def whole(wanted: Mapping[str, int], sizes_of: Callable[[int], Mapping[str, int]], step: int) -> bool:
    """Whether every file of ``wanted`` (contract.manifest_file_sizes of ``step``'s
    manifest) is there with its size; ``sizes_of(s)``: object name under step ``s`` -> size."""
    listed: dict[int, Mapping[str, int]] = {}
    for path, size in wanted.items():
        owner, name = contract.split_manifest_path(path)
        owner = step if owner is None else owner
        if owner not in listed:
            listed[owner] = sizes_of(owner)
        if listed[owner].get(name) != size:
            return False
    return True


def recorded(text: bytes, step: int, sizes: Mapping[int, Mapping[str, int]]) -> tuple[retention.Recorded | None, bool]:
    """What a step's manifest records for retention (None: it does not read, or its file
    list does not: the step is kept, never guessed at), and whether every file it lists
    is there with its size (``sizes``: step -> object name under it -> size, for the steps
    listed; the referenced files of earlier steps are looked up there)."""
    try:
        record = retention.Recorded.parse(text)
        wanted = contract.manifest_file_sizes(text)
        return record, whole(wanted, lambda s: sizes.get(s, {}), step)
    except (ValueError, contract.ContractError):
        return None, False
