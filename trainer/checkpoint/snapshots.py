"""Taking and restoring the in-memory snapshots (:mod:`~ftfleet.trainer.checkpoint.memory`).

Taking one (collective over the snapshot group): every rank serializes its state, writes
it to its node's shared memory, and sends it to the rank that holds its copy on the
previous node (ring), which writes it beside its own. A failed write (shared memory
full) is logged and costs that snapshot only; the disk tiers stay the durable ones.

Restoring (collective), like the disk tiers' search:

1. each rank lists its own complete snapshots and the copies it holds (manifests that
   belong to this run and config, at this world size);
2. rank 0 picks the newest step that every rank can get, each rank from its own
   snapshot or else from its holder's copy, and broadcasts the plan;
3. holders send the copies over gloo; every rank checks the size and CRC32C of what it
   got and that it fits the live state (nothing is loaded yet);
4. rank 0 gathers the problems: any problem excludes that rank's source for that step,
   and the plan is made again; none, and every rank loads.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ftfleet.trainer.checkpoint.manifest import Crc32c, Manifest
from ftfleet.trainer.checkpoint.memory import (
    MemoryTier,
    SnapshotMismatch,
    check,
    exchange,
    pack,
    prepare,
    serialize,
    snapshot_file,
    unpack,
)
from ftfleet.trainer.checkpoint.restore import Identity, Restored

log = logging.getLogger("ftfleet.ckpt")

OWN, PEER = "own", "peer"


class Snapshots:
    def __init__(self, tier: MemoryTier, app_state: Any, identity: Identity, comm: Any, group: Any) -> None:
        self.tier = tier
        self.app_state = app_state
        self.identity = identity
        self.comm = comm
        self.group = group
        self.taken = 0

    # -- taking --------------------------------------------------------------------

    def take(self, step: int) -> None:
        """Collective: snapshot the current state as ``step``."""
        ring, rank = self.tier.ring, self.comm.rank
        payload = serialize(self.app_state)
        crc = Crc32c()
        crc.update(payload)
        manifest = Manifest(
            step=step,
            run_id=self.identity.run_id,
            config_hash=self.identity.config_hash,
            world_size=self.comm.world_size,
            files={snapshot_file(rank): crc.entry()},
            torch_version=torch.__version__,
        )
        try:
            self.tier.write(False, rank, step, payload, manifest)
        except OSError as exc:
            log.warning("memory: snapshot of step %d not written to %s: %s", step, self.tier.describe(), exc)
        if not self.tier.has_peer:
            self.taken += 1
            return
        transfers = [(r, ring.holder_of(r)) for r in range(self.comm.world_size)]
        received = exchange(transfers, rank, {ring.holder_of(rank): pack(payload, manifest)}, self.group)
        peer = self.tier.peer_rank
        try:
            got, peer_manifest = unpack(received[peer])
            where = f"rank {peer}'s snapshot of step {peer_manifest.step}"
            check(got, peer_manifest, snapshot_file(peer), where)
            self.tier.write(True, peer, peer_manifest.step, got, peer_manifest)
        except (SnapshotMismatch, OSError) as exc:
            log.warning("memory: copy of rank %d's snapshot not kept: %s", peer, exc)
        self.taken += 1

    # -- restoring -----------------------------------------------------------------

    def restore(self, min_step: int | None = None) -> Restored | None:
        """Collective: load the newest step at or after ``min_step`` that every rank can
        get from memory. None (nothing loaded) when there is none."""
        world, rank = self.comm.world_size, self.comm.rank
        own = self.tier.listing(False, world, self.identity)
        held = self.tier.listing(True, world, self.identity) if self.tier.has_peer else []
        listings = self.comm.gather((own, held))
        excluded: set[tuple[int, int, str]] = set()
        while True:
            plan = self._plan(listings, excluded, min_step) if rank == 0 else None
            plan = self.comm.broadcast(plan)
            if plan is None:
                if rank == 0:
                    log.info("memory: no snapshot every rank can restore%s", _from(min_step))
                return None
            step, sources = plan
            state, manifest, problem = self._fetch(step, sources)
            problems = self.comm.gather(problem)
            if rank == 0:
                for r, p in enumerate(problems):
                    if p is not None:
                        log.warning("memory: step %d of rank %d (%s) skipped: %s", step, r, sources[r][0], p)
                        excluded.add((step, r, sources[r][0]))
            if not any(self.comm.broadcast([p is not None for p in problems] if rank == 0 else None)):
                break
        self.app_state.load_state_dict(state)
        peers = sorted(r for r, (kind, _) in sources.items() if kind == PEER)
        if rank == 0:
            how = f"ranks {peers} from their peers' copies" if peers else "every rank from its own"
            log.info("memory: restored step %d, %s", step, how)
        tier = "memory-peer" if peers else "memory"
        return Restored(step, tier, str(self.tier.root), manifest)

    def _plan(
        self, listings: list[tuple[list[int], list[int]]], excluded: set[tuple[int, int, str]], min_step: int | None
    ) -> tuple[int, dict[int, tuple[str, int]]] | None:
        ring = self.tier.ring
        steps = sorted({s for own, held in listings for s in (*own, *held)}, reverse=True)
        for step in steps:
            if min_step is not None and step < min_step:
                break
            sources: dict[int, tuple[str, int]] = {}
            for r in range(len(listings)):
                holder = ring.holder_of(r)
                if step in listings[r][0] and (step, r, OWN) not in excluded:
                    sources[r] = (OWN, r)
                elif holder != r and step in listings[holder][1] and (step, r, PEER) not in excluded:
                    sources[r] = (PEER, holder)
                else:
                    break
            if len(sources) == len(listings):
                return step, sources
        return None

    def _fetch(self, step: int, sources: dict[int, tuple[str, int]]) -> tuple[Any, Manifest | None, str | None]:
        """This rank's state for ``step`` (checked, not loaded), its manifest, or the problem."""
        rank, tier = self.comm.rank, self.tier
        transfers = [(src, r) for r, (kind, src) in sorted(sources.items()) if kind == PEER]
        outgoing: dict[int, bytes] = {}
        for src, dst in transfers:
            if src == rank:
                try:
                    outgoing[dst] = pack(*tier.read(True, step))
                except SnapshotMismatch as exc:
                    log.warning("memory: cannot send rank %d its copy: %s", dst, exc)
                    outgoing[dst] = b""
        received = exchange(transfers, rank, outgoing, self.group)
        kind, src = sources[rank]
        try:
            if kind == OWN:
                payload, manifest = tier.read(False, step)
            else:
                if not received.get(src):
                    raise SnapshotMismatch(f"rank {src} had no valid copy to send")
                payload, manifest = unpack(received[src])
                check(payload, manifest, snapshot_file(rank), f"the copy from rank {src}")
                if manifest.step != step:
                    raise SnapshotMismatch(f"the copy from rank {src} is of step {manifest.step}")
            return prepare(self.app_state, payload), manifest, None
        except SnapshotMismatch as exc:
            return None, None, str(exc)


def _from(min_step: int | None) -> str:
    return "" if min_step is None else f" at or after step {min_step} (the newest on disk)"
