"""Writing the contract's commit marker: "node X may go, checkpoint N is committed".

The marker goes first to the fast tier, ``<ckpt dir>/markers/<node id>.json``,
atomically (temporary file, fsync, rename, fsync of the directory): a reader sees the
old marker or the new one, never half of one. Then, when a durable tier is configured,
to ``<bucket prefix>/markers/<node id>.json`` through an injected ``put(key, data)``
callable (the durable tier's ``ObjectStore.put_bytes`` from trainer/checkpoint/tiers),
where the lifecycle-handoff function polls for it. The bucket upload is
retried until the notice's deadline; its failure is reported, not raised, because the
fast-tier marker and the checkpoint are already safe.

Call it once per node, after every rank's shard of the checkpoint is committed (e.g.
on local rank 0 after a barrier).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ftfleet.contract import CommitMarker, marker_key
from ftfleet.trainer.resilience import fencing

log = logging.getLogger(__name__)

#: Writes ``data`` at ``key`` (relative to the durable tier's root prefix).
PutObject = Callable[[str, bytes], None]


@dataclasses.dataclass(frozen=True, slots=True)
class MarkerWrite:
    """Where the marker landed."""

    local_path: Path
    #: True when the marker reached the durable tier (False: no uploader, or it failed).
    uploaded: bool
    #: The last upload error, if the upload was attempted and failed.
    error: str | None = None


def write_local_marker(root: str | os.PathLike[str], marker: CommitMarker) -> Path:
    """Atomically write ``marker`` under the tier root ``root``; returns its path."""
    path = Path(root) / marker_key(marker.node_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(marker.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def read_local_marker(root: str | os.PathLike[str], node_id: str) -> CommitMarker | None:
    """The node's marker under ``root``, or None when there is none."""
    try:
        text = (Path(root) / marker_key(node_id)).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return CommitMarker.from_json(text)


def publish_marker(
    marker: CommitMarker,
    *,
    fast_root: str | os.PathLike[str],
    put: PutObject | None = None,
    deadline: float | None = None,
    retry_s: float = 1.0,
) -> MarkerWrite:
    """Write ``marker`` to the fast tier, then upload it with ``put`` if given.

    The upload is retried every ``retry_s`` seconds until epoch ``deadline`` (None:
    one attempt). Returns what happened; raises only if the fast tier write fails.
    """
    fencing.check(fencing.current(), f"commit marker of step {marker.step}")  # one generation commits
    local = write_local_marker(fast_root, marker)
    log.info("commit marker written: %s (step %d, %s)", local, marker.step, marker.reason)
    if put is None:
        return MarkerWrite(local, uploaded=False)
    key, data = marker_key(marker.node_id), marker.to_json().encode()
    attempt, error = 0, None
    while True:
        attempt += 1
        try:
            put(key, data)
        except Exception as exc:  # noqa: BLE001 - any uploader failure is reported
            error = f"{type(exc).__name__}: {exc}"
            left = None if deadline is None else deadline - time.time()
            if left is None or left < retry_s:
                break
            log.warning("commit marker upload attempt %d failed (%s); retrying, %.0fs left", attempt, error, left)
            time.sleep(retry_s)
            continue
        log.info("commit marker uploaded to the durable tier: %s", key)
        return MarkerWrite(local, uploaded=True)
    log.error(
        "commit marker not uploaded after %d attempts: %s; the lifecycle handoff "
        "will time out instead of completing early",
        attempt,
        error,
    )
    return MarkerWrite(local, uploaded=False, error=error)
