"""The shape every checkpoint tier shares.

A tier root holds ``step-N/`` prefixes (directories or object-key prefixes). A step
exists for a loader only when ``step-N/manifest.json`` exists in that tier; everything
else under a root is either being written or debris of a crash.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from pathlib import Path

from ftfleet.contract import MANIFEST_NAME, parse_step_dir, step_dir_name
from ftfleet.trainer.checkpoint.manifest import Manifest


class VersionConflict(Exception):
    """A conditional write found the object changed (or present, for a create) since the
    version it was conditioned on: another writer got there first."""


class TierUnavailable(Exception):
    """The tier cannot be reached or does not exist (missing bucket, no access, no
    network). Restore logs it and goes on to the next tier."""


def parse_uri(uri: str) -> tuple[str, str, str]:
    """``s3://bucket/a/b`` -> ("s3", "bucket", "a/b")."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in ("s3", "gs"):
        raise ValueError(f"not an object-store URI: {uri!r} (use s3://bucket/prefix or gs://...)")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return scheme, bucket, prefix.strip("/")


class ObjectStore(abc.ABC):
    """A bucket prefix. Keys passed to the methods are relative to the prefix."""

    name = "object"

    def __init__(self, uri: str):
        self.scheme, self.bucket, self.prefix = parse_uri(uri)

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    # --- operations each store implements -----------------------------------
    @abc.abstractmethod
    def list(self, rel_prefix: str) -> dict[str, int]:
        """Relative key -> size of every object under ``rel_prefix``."""

    @abc.abstractmethod
    def get_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    @abc.abstractmethod
    def put_bytes(self, rel: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def read_versioned(self, rel: str) -> tuple[bytes | None, str | None]:
        """The object's bytes and version (an opaque token: S3's ETag, GCS's generation),
        or (None, None) when it does not exist."""

    @abc.abstractmethod
    def write_if(self, rel: str, data: bytes, version: str | None) -> str:
        """Write ``data`` only if the object is still at ``version`` (None: only if it
        does not exist), in one conditional request; returns the new version. Raises
        :class:`VersionConflict` when the condition does not hold."""

    @abc.abstractmethod
    def upload_file(self, path: Path, rel: str) -> None: ...

    @abc.abstractmethod
    def download_file(self, rel: str, path: Path) -> None: ...

    @abc.abstractmethod
    def iter_object(self, rel: str) -> Iterator[bytes]: ...

    @abc.abstractmethod
    def delete(self, rels: list[str]) -> None: ...

    # --- the checkpoint layout, shared --------------------------------------
    def bounded(self, timeout_s: float) -> ObjectStore:
        """This store (the same objects) with one attempt per request, each waiting at
        most about ``timeout_s``: for a write that must land soon after a check of the
        run lease, or not at all. Stores without network requests return themselves."""
        return self

    def committed_steps(self) -> list[int]:
        steps = set()
        for rel in self.list("step-"):
            top, _, name = rel.partition("/")
            step = parse_step_dir(top)
            if step is not None and name == MANIFEST_NAME:
                steps.add(step)
        return sorted(steps)

    def all_steps(self) -> list[int]:
        """Steps with any object, committed or not (retention sweeps the debris)."""
        steps = {parse_step_dir(rel.partition("/")[0]) for rel in self.list("step-")}
        return sorted(s for s in steps if s is not None)

    def read_manifest(self, step: int) -> Manifest | None:
        data = self.get_bytes(f"{step_dir_name(step)}/{MANIFEST_NAME}")
        return None if data is None else Manifest.from_json(data)

    def step_objects(self, step: int) -> dict[str, int]:
        """File name -> size of the objects of ``step``."""
        prefix = f"{step_dir_name(step)}/"
        return {rel[len(prefix) :]: size for rel, size in self.list(prefix).items()}

    def remove_step(self, step: int) -> None:
        """Delete a step, manifest first, so it stops existing before it loses a file."""
        d = step_dir_name(step)
        self.delete([f"{d}/{MANIFEST_NAME}"])
        rest = [f"{d}/{name}" for name in self.step_objects(step)]
        if rest:
            self.delete(rest)

    def describe(self) -> str:
        return self.uri
