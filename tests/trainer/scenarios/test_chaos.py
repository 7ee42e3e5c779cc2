"""Chaos: many random SIGKILLs, of single ranks and of whole nodes, in one run that must
still end bit-identical to the uninterrupted one (`make chaos`; not in `make test`).

One machine runs the in-process launcher (2 training processes, 1 warm spare), the
ranks simulated as 2 nodes (``checkpoint.ranks_per_node=1``): snapshots in shared
memory every step, each node holding its own and a copy of its neighbour's, durable
checkpoints every 8 steps. Each kill, at a seeded random moment (while restoring, or
1-3 steps into training):

* **rank**: SIGKILL one training process. The wrapper restarts the survivor in place
  and the spare takes the dead rank; with no spare left the launcher stops and the
  harness starts it again (the machine's service restarting it), shared memory intact.
* **node** (about one in four): SIGKILL the launcher and every process, remove one
  node's shared memory (its RAM is gone), start again: that node's rank restores from
  the copy its neighbour holds.

``FTFLEET_CHAOS_KILLS`` (default 50) and ``FTFLEET_CHAOS_SEED`` (default 13) set the
run; ``FTFLEET_CHAOS_REPORT`` names a JSON file for the per-kill record (kind, step at
the kill, the step and tier restored, seconds from the kill to the next step, and the
rung that recovered it: an in-process restart, a machine restart, or a lost node's).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import BASE, LOADER_WORKERS, MEMORY, REPO, child_env, inprocess_cmd, kill9, run_trainer

pytestmark = pytest.mark.integration

pytest.importorskip("nvidia_resiliency_ext.inprocess", reason="make setup installs nvidia-resiliency-ext")

KILLS = int(os.environ.get("FTFLEET_CHAOS_KILLS", "50"))
SEED = int(os.environ.get("FTFLEET_CHAOS_SEED", "13"))
#: Enough steps that every kill lands in training: at most 3 steps between kills.
STEPS = 4 * KILLS + 16
ARGS = [f"train.steps={STEPS}", *MEMORY, "train.step_events=true"]


def _events(run_dir: Path) -> list[dict]:
    from ftfleet.trainer.events import read_events

    return list(read_events(run_dir)) if (run_dir / "events.jsonl").exists() else []


class Machine:
    """The in-process launcher, started again whenever it stops short of the end."""

    def __init__(self, tmp: Path, run_dir: Path, shm: Path):
        self.run_dir, self.shm, self.log = run_dir, shm, tmp / "launch.log"
        self.proc: subprocess.Popen | None = None
        self.launches = 0

    def start(self) -> None:
        cmd = inprocess_cmd(self.run_dir, *BASE, *ARGS, LOADER_WORKERS, soft_timeout=30)
        with self.log.open("a") as out:
            out.write(f"--- launch {self.launches}\n")
            out.flush()
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=child_env({"FTFLEET_SHM_DIR": str(self.shm)}),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.launches += 1

    def kill(self) -> None:
        kill9(self.proc)
        self.proc.wait(timeout=30)

    def restart_if_stopped(self) -> bool:
        """Start again after a nonzero exit; True once the run has finished (exit 0)."""
        rc = self.proc.poll()
        if rc is None:
            return False
        if rc == 0:
            return True
        self.start()
        return False

    def tail(self) -> str:
        return self.log.read_text()[-6000:]


def _wait(machine: Machine, predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if machine.restart_if_stopped():
            return None  # finished
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}\n{machine.tail()}")


def _after_last_start(run_dir: Path, starts_before: int) -> tuple[dict | None, list[dict]]:
    """The newest start event, if there are more than ``starts_before``, and the events
    after it."""
    events = _events(run_dir)
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    if len(starts) <= starts_before:
        return None, []
    return events[starts[-1]], events[starts[-1] + 1 :]


@pytest.mark.chaos
@pytest.mark.timeout(3600)
def test_random_sigkills_of_ranks_and_nodes_end_bit_identical(tmp_path):
    ref = run_trainer(2, tmp_path / "ref", *ARGS, env={"FTFLEET_SHM_DIR": str(tmp_path / "ref-shm")}, timeout=600)
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    rng = random.Random(SEED)
    machine = Machine(tmp_path, run_dir, shm)
    kills: list[dict] = []
    machine.start()
    try:
        starts = 0
        while len(kills) < KILLS:
            # A new attempt has started (the first one, or the recovery from the last kill).
            got = _wait(machine, lambda n=starts: _after_last_start(run_dir, n)[0], 300, f"attempt {starts + 1}")
            if got is None:
                break
            starts = sum(e["event"] == "start" for e in _events(run_dir))
            # While restoring (1 in 10), or 1-3 steps into training.
            steps = 0 if rng.random() < 0.1 else rng.randint(1, 3)
            if kills and steps:
                kills[-1].update(_recovery(run_dir, machine, starts))
            elif kills:
                kills[-1]["next"] = "killed again while restoring"
            if steps:
                done = _wait(
                    machine,
                    lambda n=starts, k=steps: _steps_after_last_start(run_dir, n) >= k,
                    300,
                    f"{steps} steps after attempt {starts}",
                )
                if done is None:
                    break
            start, after = _after_last_start(run_dir, starts - 1)
            at_step = max((e["step"] for e in after if e["event"] == "step"), default=None)
            kill = {"kill": len(kills) + 1, "at_step": at_step, "t": time.time(), "launches": machine.launches}
            if rng.random() < 0.25:
                node = rng.randrange(2)
                machine.kill()
                shutil.rmtree(shm / "ftfleet-t" / f"node-{node}", ignore_errors=True)
                machine.start()
                kill.update(kind="node", node=node)
            else:
                rank = rng.randrange(2)
                kill.update(kind="rank", rank=rank)
                try:
                    os.kill(start["pids"][rank], signal.SIGKILL)
                except ProcessLookupError:  # it had already gone: the run is restarting
                    kill["missed"] = True
            kills.append(kill)
        # The last recovery, then the rest of the run.
        if kills and "resumed_step" not in kills[-1]:
            got = _wait(machine, lambda: _after_last_start(run_dir, starts)[0], 300, "the last recovery")
            if got is not None:
                kills[-1].update(_recovery(run_dir, machine, starts + 1))
        _wait(machine, lambda: machine.proc.poll() == 0, 1200, "the end of the run")
    finally:
        if machine.proc is not None and machine.proc.poll() is None:
            machine.kill()
        _report(kills, machine)

    assert len(kills) == KILLS, f"the run ended after {len(kills)} of {KILLS} kills: raise STEPS"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == STEPS
    assert summary["state_sha256"] == ref["state_sha256"], machine.tail()


def _steps_after_last_start(run_dir: Path, starts: int) -> int:
    return sum(e["event"] == "step" for e in _after_last_start(run_dir, starts - 1)[1])


def _recovery(run_dir: Path, machine: Machine, starts: int) -> dict:
    """What the attempt that followed a kill restored, and when it stepped again."""
    found = _wait(
        machine,
        lambda: (lambda a: a if any(e["event"] in ("first_step", "step") for e in a) else None)(
            _after_last_start(run_dir, starts - 1)[1]
        ),
        300,
        f"a step in attempt {starts}",
    )
    if found is None:
        return {}
    restored = next((e for e in found if e["event"] in ("restored", "fresh")), {})
    first = next(e for e in found if e["event"] in ("first_step", "step"))
    return {
        "resumed_step": restored.get("step", 0),
        "tier": restored.get("tier", "fresh"),
        "first_step_t": first["t"],
        "launches_after": machine.launches,
    }


def rung(kill: dict) -> str:
    """Which rung of the recovery ladder (docs/RESILIENCE.md) recovered a kill: for a
    process, whether the launcher had to start again."""
    if "launches_after" not in kill:
        return "not timed"  # killed again while restoring
    if kill["kind"] == "node":
        return "lost node"
    if kill.get("missed"):
        return "missed"  # the process had gone already
    return "in-process restart" if kill["launches_after"] == kill["launches"] else "machine restart"


def _report(kills: list[dict], machine: Machine) -> None:
    for k in kills:
        if "first_step_t" in k:
            k["recovery_s"] = round(k.pop("first_step_t") - k["t"], 2)
            if k["at_step"] is not None:
                k["lost_steps"] = max(0, k["at_step"] - k["resumed_step"])
    by_kind = {kind: [k for k in kills if k["kind"] == kind] for kind in ("rank", "node")}
    again = sum("next" in k for k in kills)
    lines = [
        f"chaos: {len(kills)} kills (seed {SEED}), {machine.launches} launches of the machine, "
        f"{again} recoveries killed again while restoring"
    ]
    for kind, ks in by_kind.items():
        times = sorted(k["recovery_s"] for k in ks if "recovery_s" in k)
        if times:
            tiers = sorted({k["tier"] for k in ks if "tier" in k})
            lines.append(
                f"  {kind}: {len(ks)} kills, kill to next step {times[0]}-{times[-1]} s "
                f"(median {times[len(times) // 2]}), lost steps max "
                f"{max(k.get('lost_steps', 0) for k in ks)}, restored from {', '.join(tiers)}"
            )
    for k in kills:
        k["rung"] = rung(k)
    for name in ("in-process restart", "machine restart", "lost node"):
        times = sorted(k["recovery_s"] for k in kills if k["rung"] == name and "recovery_s" in k)
        if times:
            lines.append(f"  {name}: {len(times)} timed, {times[0]}-{times[-1]} s (median {times[len(times) // 2]})")
    print("\n".join(lines))
    path = os.environ.get("FTFLEET_CHAOS_REPORT")
    if path:
        Path(path).write_text(json.dumps({"seed": SEED, "launches": machine.launches, "kills": kills}, indent=1))
