"""Finding the checkpoint to resume from, across tiers, and making it safe to load.

Candidates are the committed steps (those with a manifest) of the local tier, the
primary bucket and the replica bucket, newest step first; for the same step the local
copy is preferred, then the primary, then the replica. For each candidate, in turn:

* rank 0 reads and parses its manifest (a malformed one is skipped) and checks it
  belongs to this run and config (a foreign one is refused unless forced);
* every rank checks its share of the files: locally, by size and CRC32C (or by size
  only, ``local_crc=False``, when the load that follows checks the CRC as it reads:
  :mod:`~ftfleet.trainer.checkpoint.reader`); from a bucket, by downloading its share
  into ``<local>/step-N/`` in parallel and then checking it, after which rank 0 writes
  the manifest locally (the download is then an ordinary local commit);
* the first candidate whose every file checks out is the one. Each failure is logged
  in one line naming the tier, the step and the bad file, and the next is tried.

When committed steps exist and none of them loads, the start is refused
(:class:`HistoryUnreadable`, exit 2) rather than made from step 0: that run's saves
would replace the step directories of the run's history.

This is what makes both durability paths safe: a bucket copy exported by FSx may show
a manifest before every shard has arrived, and an interrupted upload may leave shards
without a manifest; neither passes.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from ftfleet.errors import UserError
from ftfleet.trainer.checkpoint.manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    assign_files,
    check_file,
    object_key,
    read_manifest,
    write_manifest,
)
from ftfleet.trainer.checkpoint.tiers import LocalTier, ObjectStore, TierUnavailable

log = logging.getLogger("ftfleet.ckpt")


class CheckpointRefused(UserError):
    """The newest checkpoint belongs to another run or config."""


class HistoryUnreadable(UserError):
    """Committed checkpoints exist but none loads: a fresh start would train over a
    run's history (its saves replace those step directories, retention prunes the rest),
    so the start is refused and nothing is changed."""


def refuse_over_history(candidates: Sequence[tuple[int, str, str]]) -> HistoryUnreadable:
    """The error for a start that found ``candidates`` ((step, tier name, location),
    newest first: every committed step of every tier) and loaded none of them."""
    by_tier: dict[tuple[str, str], list[int]] = {}
    for step, name, where in candidates:
        by_tier.setdefault((name, where), []).append(step)
    found = "; ".join(
        f"{', '.join(f'step-{s}' for s in steps)} in the {name} tier ({where})"
        for (name, where), steps in by_tier.items()
    )
    local = next((where for _, name, where in candidates if name == "local"), None)
    check = f" (`ftfleet ckpt verify {local}` names the bad files)" if local else ""
    return HistoryUnreadable(
        f"checkpoint: none of the checkpoints found loads: {found}; nothing was changed. "
        f"Repair or move them{check}, point checkpoint.dir (and uri) at a new place, "
        "or set checkpoint.load=false to start from step 0 here (its saves then replace these)"
    )


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    tier: str  # "local", "primary" or "replica"
    location: str
    manifest: Manifest

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "tier": self.tier, "location": self.location, "world_size": self.manifest.world_size}


@dataclasses.dataclass(frozen=True)
class Identity:
    run_id: str
    config_hash: str

    def mismatch(self, manifest: Manifest) -> str | None:
        if manifest.run_id != self.run_id:
            return f"run_id {manifest.run_id!r}, this run is {self.run_id!r}"
        if manifest.config_hash != self.config_hash:
            return f"config hash {manifest.config_hash}, this config is {self.config_hash}"
        return None


def list_candidates(
    local: LocalTier,
    stores: Sequence[tuple[str, ObjectStore]],
    load_step: int | None = None,
    exclude: Collection[tuple[int, str]] = (),
) -> list[tuple[int, int]]:
    """(step, tier index) newest first; tier 0 is local, then ``stores`` in order.
    ``exclude``: (step, tier name) pairs already found invalid."""
    found = [(s, 0) for s in local.committed_steps()]
    for i, (name, store) in enumerate(stores, start=1):
        # Any failure of a bucket (missing, no access, 5xx after the retries) skips that
        # tier: this runs on rank 0 only, between collectives, and raising here would
        # leave the other ranks waiting in the next one until its timeout.
        try:
            found += [(s, i) for s in store.committed_steps()]
        except TierUnavailable as exc:
            log.warning("restore: %s tier unavailable, skipping it: %s", name, exc)
        except Exception as exc:  # noqa: BLE001
            log.warning("restore: cannot list the %s tier, skipping it: %s: %s", name, type(exc).__name__, exc)
    if load_step is not None:
        found = [c for c in found if c[0] == load_step]
    names = ["local", *(name for name, _ in stores)]
    found = [c for c in found if (c[0], names[c[1]]) not in exclude]
    return sorted(found, key=lambda c: (-c[0], c[1]))


def find_and_prepare(
    comm: Any,
    local: LocalTier,
    stores: Sequence[tuple[str, ObjectStore]],
    identity: Identity,
    *,
    force: bool = False,
    load_step: int | None = None,
    workers: int = 8,
    local_crc: bool = True,
    exclude: Collection[tuple[int, str]] = (),
) -> Restored | None:
    """Collective. The newest valid checkpoint, present and verified in the local tier,
    or None when there is none. ``local_crc=False``: local files are checked by size
    only (the caller loads them through the verifying reader). ``exclude``: (step, tier
    name) pairs to pass over."""
    tiers: list[tuple[str, Any]] = [("local", local), *stores]
    candidates = list_candidates(local, stores, load_step, exclude) if comm.rank == 0 else []
    while True:
        decision: tuple | None = None
        if comm.rank == 0:
            decision = _next_candidate(candidates, tiers, identity, force)
        decision = comm.broadcast(decision)
        if decision[0] == "refuse":
            raise CheckpointRefused(decision[1])
        if decision[0] == "none":
            if load_step is not None:
                raise UserError(
                    f"checkpoint.load_step={load_step}: no valid copy of "
                    f"step-{load_step} in any tier; pick a listed step "
                    "(`ftfleet ckpt list`) or unset it"
                )
            return None
        _, tier_index, payload = decision
        manifest = Manifest.from_json(payload)
        name, tier = tiers[tier_index]
        problems = _fetch_and_check(comm, local, name, tier, manifest, workers, local_crc)
        gathered = comm.gather(problems)
        verdict = None
        if comm.rank == 0:
            bad = [p for part in gathered for p in part]
            if not bad and tier_index > 0:
                try:
                    write_manifest(local.step_dir(manifest.step), manifest)
                except OSError as exc:
                    bad.append(f"writing the local manifest: {exc}")
            for problem in bad:
                log.warning(
                    "restore: step-%d in %s is invalid, skipping it: %s", manifest.step, tier.describe(), problem
                )
            verdict = not bad
        if comm.broadcast(verdict):
            where = tier.describe()
            if comm.rank == 0:
                log.info("restore: using step-%d from %s tier (%s)", manifest.step, name, where)
            return Restored(manifest.step, name, where, manifest)


def _next_candidate(
    candidates: list[tuple[int, int]], tiers: list[tuple[str, Any]], identity: Identity, force: bool
) -> tuple:
    while candidates:
        step, index = candidates.pop(0)
        name, tier = tiers[index]
        try:
            manifest = tier.read_manifest(step)
        except ManifestError as exc:
            log.warning("restore: step-%d in %s has a malformed manifest, skipping it: %s", step, tier.describe(), exc)
            continue
        except Exception as exc:  # noqa: BLE001 - unreachable, 5xx after retries: rank 0 only
            log.warning(
                "restore: cannot read step-%d manifest from %s, skipping it: %s: %s",
                step,
                tier.describe(),
                type(exc).__name__,
                exc,
            )
            continue
        if manifest is None:  # deleted since listing
            continue
        if manifest.step != step:
            log.warning(
                "restore: step-%d in %s has the manifest of step %d, skipping it", step, tier.describe(), manifest.step
            )
            continue
        mismatch = identity.mismatch(manifest)
        if mismatch and not force:
            return (
                "refuse",
                f"checkpoint step-{step} in {tier.describe()} has {mismatch}: "
                "point checkpoint.dir/uri at this run's checkpoints, or set "
                "checkpoint.force_load=true to load it anyway",
            )
        if mismatch:
            log.warning("restore: loading step-%d despite %s (checkpoint.force_load)", step, mismatch)
        return ("try", index, manifest.to_json())
    return ("none",)


def _sibling_clash(path: Path, entry: FileEntry) -> str | None:
    """Why the referenced file ``path`` may not be written where it goes: the fast tier
    holds a committed checkpoint there whose manifest lists other bytes under its name
    (another save of that step). None: nothing committed there says otherwise."""
    try:
        manifest = read_manifest(path.parent)
    except ManifestError:
        return None  # no checkpoint a loader would take: the file may go
    if manifest is None or manifest.files.get(path.name) in (None, entry):
        return None
    return (
        f"../{path.parent.name}/{path.name}: the fast tier's {path.parent.name} is another save of that "
        "step; not overwritten"
    )


def _fetch_and_check(
    comm: Any, local: LocalTier, name: str, tier: Any, manifest: Manifest, workers: int, local_crc: bool = True
) -> list[str]:
    """This rank's share: check local files, or download then check. Problems found."""
    step_dir = local.step_dir(manifest.step)
    listed = manifest.every_file()
    mine = assign_files({n: e.size for n, e in listed.items()}, comm.world_size)[comm.rank]
    if name == "local":
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(mine) or 1))) as pool:
            return [p for p in pool.map(lambda n: check_file(step_dir / n, listed[n], local_crc, n), mine) if p]

    if comm.rank == 0:  # replace whatever local copy of this step there is
        local.remove_step(manifest.step)
        step_dir.mkdir(parents=True, exist_ok=True)
    comm.barrier()
    problems: list[str] = []
    total = sum(listed[n].size for n in mine)
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        file=sys.stderr,
        mininterval=0.5,
        desc=f"restore step-{manifest.step} from {name}",
        disable=comm.rank != 0,
    )

    def fetch(n: str) -> str | None:
        path = step_dir / n
        # A referenced file goes beside, into its own checkpoint's directory, where the
        # fast tier may hold it already (then it is not fetched again); never over a
        # committed checkpoint there that lists other bytes under that name.
        if n.startswith("../"):
            if check_file(path, listed[n]) is None:
                return None
            if (clash := _sibling_clash(path, listed[n])) is not None:
                return clash
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tier.download_file(object_key(manifest.step, n), path)
        except Exception as exc:  # noqa: BLE001 - missing object, retries exhausted, ...
            return f"{n}: download failed ({type(exc).__name__}: {exc})"
        return check_file(path, listed[n], label=n)

    with bar, ThreadPoolExecutor(max_workers=max(1, min(workers, len(mine) or 1))) as pool:
        futures = {pool.submit(fetch, n): n for n in mine}
        for fut in as_completed(futures):
            if problem := fut.result():
                problems.append(problem)
            bar.update(listed[futures[fut]].size)
    return problems
