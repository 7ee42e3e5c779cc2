"""The host-memory tier: each rank's latest snapshots in shared memory, and a copy of the
next node's.

A snapshot is this rank's whole :class:`~ftfleet.trainer.checkpoint.state.AppState`
(model and optimizer shards, LR schedule, step, data reader, RNGs, extras), serialized
with ``torch.save`` (DTensors as their local shards) into one file, written under the
run's shared-memory directory (:func:`ftfleet.contract.memory_dir`)::

    <root>/node-<i>/rank-<r>/step-N/{__<r>.pt, manifest.json}        own snapshot
    <root>/node-<i>/peer/rank-<q>/step-N/{__<q>.pt, manifest.json}   copy of node i+1's rank q

``/dev/shm`` outlives the training process (a SIGKILL, a crash, torchrun's restart of
the group) but not the node. So node ``i`` also keeps the latest snapshot of node
``(i + 1) mod N`` (a ring): after a snapshot, each rank sends its bytes to the rank with
the same local rank on the previous node (gloo point-to-point on a group of its own).
A lost node's ranks then restore from their holders' RAM.

A snapshot is complete only once its manifest exists: the same
:class:`~ftfleet.trainer.checkpoint.manifest.Manifest` as the disk tiers (size and
CRC32C of the file, step, run, config hash, world size), written last, atomically. A
directory without a manifest (a kill mid-write) is never listed; a file whose size or
CRC does not match its manifest is skipped with a warning. The file is named after the
rank (``__<r>.pt``), so a snapshot is never loaded into another rank. Snapshots are
per rank and valid only at the world size that wrote them: after a world-size change
the restore goes to the disk tiers, where DCP reshards.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ftfleet.contract import step_dir_name
from ftfleet.trainer.checkpoint.manifest import (
    Crc32c,
    Manifest,
    ManifestError,
    read_manifest,
    write_manifest,
)

log = logging.getLogger("ftfleet.ckpt")


class SnapshotMismatch(RuntimeError):
    """A snapshot that does not fit the live state (another model, another layout)."""


def snapshot_file(rank: int) -> str:
    return f"__{rank}.pt"


@dataclasses.dataclass(frozen=True)
class Ring:
    """Which ranks form a node, and who holds whose copy. ``ranks_per_node`` ranks per
    node, in rank order (torchrun's numbering); node ``i`` holds node ``i + 1``'s."""

    rank: int
    world_size: int
    ranks_per_node: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.ranks_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def peer_of(self, rank: int) -> int:
        """The rank whose snapshot ``rank`` holds (same local rank, next node)."""
        node, local = divmod(rank, self.ranks_per_node)
        return ((node + 1) % self.nodes) * self.ranks_per_node + local

    def holder_of(self, rank: int) -> int:
        """The rank that holds ``rank``'s copy (same local rank, previous node)."""
        node, local = divmod(rank, self.ranks_per_node)
        return ((node - 1) % self.nodes) * self.ranks_per_node + local


class MemoryTier:
    """The snapshot directories of one rank: its own, and the copy it holds for its peer."""

    def __init__(self, root: str | Path, ring: Ring, keep: int = 2) -> None:
        self.root = Path(root)
        self.ring = ring
        self.keep = keep
        node = self.root / f"node-{ring.node_of(ring.rank)}"
        self.own_dir = node / f"rank-{ring.rank}"
        self.peer_rank = ring.peer_of(ring.rank)
        self.held_dir = node / "peer" / f"rank-{self.peer_rank}"

    @property
    def has_peer(self) -> bool:
        return self.ring.nodes > 1

    def describe(self, held: bool = False) -> str:
        return str(self.held_dir if held else self.own_dir)

    # -- writing ---------------------------------------------------------------

    def write(self, held: bool, rank: int, step: int, payload: bytes, manifest: Manifest) -> None:
        """Write one snapshot: the file, then the manifest (atomically), then retention.
        An older directory of the same step is removed first, manifest first."""
        base = self.held_dir if held else self.own_dir
        step_dir = base / step_dir_name(step)
        _remove(step_dir)
        step_dir.mkdir(parents=True, exist_ok=True)
        path = step_dir / snapshot_file(rank)
        with open(path, "wb") as f:
            f.write(payload)
        write_manifest(step_dir, manifest)
        for old in self.steps(base)[self.keep :]:
            _remove(base / step_dir_name(old))

    # -- reading ---------------------------------------------------------------

    @staticmethod
    def steps(base: Path) -> list[int]:
        """Steps with a manifest under ``base``, newest first (unverified)."""
        out = []
        for p in base.glob("step-*") if base.is_dir() else ():
            try:
                step = int(p.name.removeprefix("step-"))
            except ValueError:
                continue
            if (p / "manifest.json").exists():
                out.append(step)
        return sorted(out, reverse=True)

    def listing(self, held: bool, world_size: int, identity: Any) -> list[int]:
        """Steps whose manifest parses, belongs to this run and config, and was written
        at ``world_size``; the others are logged and left out."""
        base = self.held_dir if held else self.own_dir
        rank = self.peer_rank if held else self.ring.rank
        good = []
        for step in self.steps(base):
            where = base / step_dir_name(step)
            try:
                manifest = read_manifest(where)
            except ManifestError as exc:
                log.warning("memory: %s has a malformed manifest, skipping it: %s", where, exc)
                continue
            if manifest is None:
                continue
            why = identity.mismatch(manifest)
            if why is None and manifest.world_size != world_size:
                why = f"written by {manifest.world_size} ranks, {world_size} now (the disk tiers reshard)"
            if why is None and (manifest.step != step or set(manifest.files) != {snapshot_file(rank)}):
                why = f"manifest of step {manifest.step} listing {sorted(manifest.files)}"
            if why:
                log.warning("memory: skipping %s: %s", where, why)
                continue
            good.append(step)
        return good

    def read(self, held: bool, step: int) -> tuple[bytes, Manifest]:
        """The verified bytes of a snapshot; raises SnapshotMismatch (one line) when the
        file is missing or does not match its manifest."""
        base = self.held_dir if held else self.own_dir
        rank = self.peer_rank if held else self.ring.rank
        where = base / step_dir_name(step)
        try:
            manifest = read_manifest(where)
            payload = (where / snapshot_file(rank)).read_bytes()
        except (OSError, ManifestError) as exc:
            raise SnapshotMismatch(f"{where}: {type(exc).__name__}: {exc}") from None
        if manifest is None:
            raise SnapshotMismatch(f"{where}: manifest gone")
        check(payload, manifest, snapshot_file(rank), str(where))
        return payload, manifest


def check(payload: bytes, manifest: Manifest, name: str, where: str) -> None:
    expected = manifest.files.get(name)
    if expected is None:
        raise SnapshotMismatch(f"{where}: the manifest does not list {name}")
    crc = Crc32c()
    crc.update(payload)
    got = crc.entry()
    if got.size != expected.size:
        raise SnapshotMismatch(f"{where}/{name}: size {got.size} bytes, manifest says {expected.size} (torn)")
    if got.crc32c != expected.crc32c:
        raise SnapshotMismatch(f"{where}/{name}: crc32c {got.crc32c}, manifest says {expected.crc32c} (corrupt)")


def _remove(step_dir: Path) -> None:
    (step_dir / "manifest.json").unlink(missing_ok=True)
    shutil.rmtree(step_dir, ignore_errors=True)


# ---------------------------------------------------------------------------
# The state <-> bytes
# ---------------------------------------------------------------------------


def _localize(node: Any) -> Any:
    if isinstance(node, DTensor):
        return node.to_local().detach().clone()
    if isinstance(node, torch.Tensor):
        return node.detach().clone()
    if isinstance(node, dict):
        return {k: _localize(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_localize(v) for v in node]
    if isinstance(node, tuple):
        return tuple(_localize(v) for v in node)
    return node


def serialize(app_state: Any) -> bytes:
    """This rank's state, as of now, as bytes (DTensors as their local shards)."""
    buf = io.BytesIO()
    torch.save(_localize(app_state.state_dict()), buf)
    return buf.getvalue()


def _merge(template: Any, saved: Any, path: str) -> Any:
    """``saved`` shaped as ``template``: DTensors rebuilt around the saved local shards;
    keys, tensor shapes and dtypes must agree."""
    if isinstance(template, DTensor):
        local = template.to_local()
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape or saved.dtype != local.dtype:
            raise SnapshotMismatch(f"{path}: {_describe(saved)} in the snapshot, the live shard is {_describe(local)}")
        return DTensor.from_local(
            saved.to(local.device),
            template.device_mesh,
            template.placements,
            run_check=False,
            shape=template.shape,
            stride=template.stride(),
        )
    if isinstance(template, torch.Tensor):
        if not isinstance(saved, torch.Tensor) or saved.shape != template.shape or saved.dtype != template.dtype:
            raise SnapshotMismatch(f"{path}: {_describe(saved)} in the snapshot, live {_describe(template)}")
        return saved.to(template.device)
    if isinstance(template, dict):
        if not isinstance(saved, dict) or set(saved) != set(template):
            keys = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
            raise SnapshotMismatch(f"{path or '/'}: keys {keys} in the snapshot, live {sorted(map(str, template))}")
        return {k: _merge(template[k], saved[k], f"{path}/{k}") for k in template}
    if isinstance(template, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(template):
            raise SnapshotMismatch(f"{path}: {_describe(saved)} in the snapshot, live has {len(template)} items")
        return type(template)(_merge(t, s, f"{path}/{i}") for i, (t, s) in enumerate(zip(template, saved, strict=True)))
    return saved


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def prepare(app_state: Any, payload: bytes) -> dict[str, Any]:
    """The state dict to load into ``app_state`` from a snapshot's bytes; raises
    SnapshotMismatch when it does not fit. Changes nothing."""
    try:
        saved = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - verified bytes that do not unpickle: a foreign file
        raise SnapshotMismatch(f"does not load: {type(exc).__name__}: {exc}") from None
    app_state.loading = True
    try:
        template = app_state.state_dict()
    finally:
        app_state.loading = False
    return _merge(template, saved, "")


# ---------------------------------------------------------------------------
# Moving bytes between ranks (gloo point-to-point)
# ---------------------------------------------------------------------------


def exchange(
    transfers: list[tuple[int, int]], rank: int, outgoing: dict[int, bytes | bytearray], group: Any
) -> dict[int, memoryview]:
    """Point-to-point transfers ``(src, dst)``, the same list on every rank: this rank
    sends ``outgoing[dst]`` for each of its own and returns what it received, by
    source. A sender with nothing to send (``b""``) makes its receiver get ``b""``."""
    mine_out = [(s, d) for s, d in transfers if s == rank]
    mine_in = [(s, d) for s, d in transfers if d == rank]
    if not mine_out and not mine_in:
        return {}
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    sizes_out = {d: torch.tensor([len(outgoing.get(d, b""))], dtype=torch.int64) for _, d in mine_out}
    sizes_in = {s: torch.zeros(1, dtype=torch.int64) for s, _ in mine_in}
    ops = [dist.P2POp(dist.isend, t, peer(d), group) for d, t in sizes_out.items()]
    ops += [dist.P2POp(dist.irecv, t, peer(s), group) for s, t in sizes_in.items()]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    bufs_in = {s: torch.empty(int(t.item()), dtype=torch.uint8) for s, t in sizes_in.items()}
    ops = [dist.P2POp(dist.isend, _as_tensor(outgoing[d]), peer(d), group) for d in sizes_out if outgoing.get(d)]
    ops += [dist.P2POp(dist.irecv, b, peer(s), group) for s, b in bufs_in.items() if b.numel()]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    # Views of the received tensors, not copies (each is the size of a rank's state).
    return {s: memoryview(b.numpy()) for s, b in bufs_in.items()}


def _as_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    """A uint8 tensor over ``data``: no copy when it is writable (what :func:`pack`
    makes); torch.frombuffer refuses to share a read-only buffer silently."""
    if isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly):
        data = bytearray(data)
    return torch.frombuffer(data, dtype=torch.uint8)


def pack(payload: bytes | memoryview, manifest: Manifest) -> bytearray:
    """A snapshot and its manifest as one message, in one writable buffer that
    :func:`exchange` sends without another copy."""
    head = manifest.to_json().encode()
    n, size = len(head), memoryview(payload).nbytes
    message = bytearray(8 + n + size)
    message[:8] = n.to_bytes(8, "little")
    message[8 : 8 + n] = head
    message[8 + n :] = payload
    return message


def unpack(message: bytes | bytearray | memoryview) -> tuple[memoryview, Manifest]:
    """Raises SnapshotMismatch for a message that is not a packed snapshot. The payload
    is a view into ``message``."""
    view = memoryview(message)
    try:
        n = int.from_bytes(view[:8], "little")
        manifest = Manifest.from_json(bytes(view[8 : 8 + n]))
    except (ManifestError, ValueError) as exc:
        raise SnapshotMismatch(f"not a snapshot message: {exc}") from None
    return view[8 + n :], manifest
