"""Two revisions of the trainer on the same run, interleaved (base, head, head, base, base,
head, ...: each pair of repeats is ABBA, so that a steady drift of the machine weighs on
both alike): for a change whose effect is smaller than a machine's drift between two benchmark
runs (several per cent within an evening on a shared virtual machine).

Each run is the goodput bench's model (``--d-model``, 2 processes under torchrun, the
launch environment that revision's own bench gives: the host allocator of
``FTFLEET_HOST_ALLOCATOR`` and glibc's tunables, as the image sets them) with in-memory
snapshots every ``--snapshot-every`` steps and no durable save but the final one, so
what differs between the revisions is what a snapshot costs the run. Extra trainer
overrides follow ``--``. Each revision runs from a git worktree of its own; the
project's editable install is pointed at that worktree (``sitecustomize.py``).

    python bench/revisions_ab.py --base 12a7ae6 --head HEAD --shm-root /tmp/hugetest

Printed, per run: the wall time from the end of step 4 to the end of the last step,
the median step with and without a snapshot's background part in flight, the median
time a snapshot blocked training and its background part; then head's mean wall over
base's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from bench.goodput_bench import CONFIG, cmd, env, model_overrides, say  # noqa: E402
from drill.runner import Node  # noqa: E402
from ftfleet.trainer.events import read_events  # noqa: E402

#: Written into each worktree: the editable install's finder maps ``ftfleet`` to the
#: project's checkout; a worktree's processes must import the worktree's code.
SHIM = """import os
root = os.path.dirname(os.path.abspath(__file__))
try:
    import __editable___ftfleet_0_1_0_finder as f
except ImportError:
    f = None
if f is not None:
    for k in list(f.MAPPING):
        f.MAPPING[k] = f.MAPPING[k].replace({repo!r}, root)
"""

#: Steps left out at the start of each run (process start, first files, warm-up).
SKIP = 3


def resolve(rev: str) -> str:
    git = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True)
    return git.stdout.strip()


def worktree(sha: str, into: Path) -> tuple[str, Path]:
    path = into / sha[:12]
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True, capture_output=True)
    (path / "sitecustomize.py").write_text(SHIM.format(repo=str(REPO)))
    return sha[:12], path


def order(repeat: int, trees: list[Any]) -> list[Any]:
    """The revisions in the order of repeat ``repeat`` (from 0): base first in even
    repeats, head first in odd ones."""
    return list(trees) if repeat % 2 == 0 else list(reversed(trees))


def run_to_end(argv: list[str], cwd: Path, environ: dict[str, str], log: Path, timeout: float) -> None:
    """Run ``argv`` (torchrun) to its end. Past ``timeout``, or failed, it stops with its
    log's tail; a run cut off takes its workers with it (torchrun starts each in a
    session of its own, which a kill of torchrun alone would leave running)."""
    node = Node(log.stem, argv, environ, cwd, log).start()
    assert node.proc is not None
    try:
        rc: int | None = node.proc.wait(timeout)  # no polling of /proc while it is measured
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        node.kill()  # nothing when it ended; else torchrun and every worker
    if rc != 0:
        why = f"ran past {timeout:.0f} s" if rc is None else f"exited {rc}"
        raise SystemExit(f"revisions_ab: the run in {cwd} {why}; its log ends:\n{node.log_tail(3000)}")


def tree_env(tree: Path) -> dict[str, str]:
    """The environment the revision in ``tree`` starts its trainers with: its own
    goodput bench's :func:`~bench.goodput_bench.env` (the image's launch variables as
    that revision sets them, e.g. the host allocator, glibc's tunables), asked of a
    Python in the worktree; a revision without that function gets this one's."""
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from bench.goodput_bench import env; "
        "print(json.dumps(env({'PYTHONPATH': sys.argv[1]})))"
    )
    clean = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | {"PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", probe, str(tree)], cwd=tree, env=clean, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        say(f"{tree.name}: its bench gave no environment ({why}); using this one's")
        return {k: v for k, v in env({"PYTHONPATH": str(tree)}).items() if k != "GLIBC_TUNABLES"}
    return json.loads(lines[-1])


def run(tree: Path, run_dir: Path, overrides: list[str], shm: Path, timeout: float) -> dict[str, Any]:
    shutil.rmtree(shm, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # events are appended; a checkpoint would be resumed
    log = run_dir.with_suffix(".log")
    log.unlink(missing_ok=True)  # Node appends
    argv = cmd(2, run_dir, overrides, config=tree / CONFIG.relative_to(REPO))  # the worktree's own config
    run_to_end(argv, tree, tree_env(tree), log, timeout)
    return stats(run_dir)


def stats(events: Path) -> dict[str, Any]:
    """The figures of the run in directory ``events`` (its events.jsonl)."""
    ev = list(read_events(events))
    steps = [e for e in ev if e.get("event") == "step" and e["step"] > SKIP]
    if len(steps) < 2:
        raise SystemExit(f"revisions_ab: {events} has {len(steps)} step events after step {SKIP}: use more --steps")
    if any(e.get("attempt", 0) != 0 for e in ev):
        raise SystemExit(f"revisions_ab: {events} has more than one attempt (a restart): its wall is no measure")
    quiet = [e["seconds"] for e in steps if not e.get("snapshotting")]
    busy = [e["seconds"] for e in steps if e.get("snapshotting")]
    blocked = [e["blocked_s"] for e in ev if e["event"] == "snapshot" and e["step"] > SKIP]
    background = [e["background_s"] for e in ev if e["event"] == "snapshotted" and e["step"] > SKIP]

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 3) if xs else None

    return {
        "wall_s": round(steps[-1]["t"] - steps[0]["t"], 2),
        "steps": len(steps),
        "quiet_step_s": med(quiet),
        "busy_step_s": med(busy),
        "busy_steps": len(busy),
        "snapshots": len(blocked),
        "blocked_s": med(blocked),
        "background_s": med(background),
    }


def _stop(signum: int, _frame: Any) -> None:
    raise SystemExit(f"revisions_ab: stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD~1")
    p.add_argument("--head", default="HEAD")
    p.add_argument("--repeats", type=int, default=2, help="runs of each revision (even: whole ABBA pairs)")
    p.add_argument("--steps", type=int, default=46)
    p.add_argument("--snapshot-every", type=int, default=3)
    p.add_argument("--d-model", type=int, default=1856)
    p.add_argument("--shm-root", type=Path, default=Path("/dev/shm"), help="the RAM file system of the snapshots")
    p.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("overrides", nargs="*", help="more trainer overrides (after --)")
    record.add_arguments(p)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats: use 1 or more")
    if args.repeats % 2:
        say(f"--repeats {args.repeats} is odd: the last repeat runs base first only, unbalanced by drift")
    # Each run is in a session of its own (so that a timeout can stop all of it): a
    # SIGTERM or a hang-up of the bench must still stop the run in flight.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    shm = args.shm_root / "ftfleet-revisions-ab"
    overrides = model_overrides(args.d_model) + [
        f"train.steps={args.steps}",
        "checkpoint.memory=true",
        f"checkpoint.memory_root={shm}",
        "checkpoint.async_save=false",
        "resilience.interval.mode=fixed",
        f"resilience.interval.fixed_steps={args.steps * 10}",
        f"resilience.interval.snapshot_fixed_steps={args.snapshot_every}",
        *args.overrides,
    ]
    work = Path(tempfile.mkdtemp(prefix="ftfleet-ab-"))
    out = args.out.resolve() if args.out else work / "runs"
    out.mkdir(parents=True, exist_ok=True)
    trees: list[tuple[str, Path]] = []
    try:
        shas = [resolve(args.base), resolve(args.head)]
        if shas[0] == shas[1]:  # before a worktree: a second one at the same path would fail
            raise SystemExit("revisions_ab: --base and --head are the same commit")
        for sha in shas:
            trees.append(worktree(sha, work))
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for r in range(args.repeats):
            for name, tree in order(r, trees):
                say(f"run {r + 1}/{args.repeats}: {name}")
                s = run(tree, out / f"{name}-{r + 1}", overrides, shm, args.timeout)
                results[name].append(s)
                print(json.dumps({"rev": name, "run": r + 1, **s}), flush=True)
        (base, _), (head, _) = trees
        walls = {n: statistics.mean(s["wall_s"] for s in results[n]) for n in results}
        print(
            f"head {head} / base {base}, mean wall over steps {SKIP + 2}-{args.steps}: {walls[head] / walls[base]:.3f}"
        )
        figures = {
            "base": base,
            "head": head,
            "steps": args.steps,
            "snapshot_every": args.snapshot_every,
            "d_model": args.d_model,
            "overrides": args.overrides,
            "mean_wall_s": walls,
            "head_vs_base_wall": walls[head] / walls[base],
            "runs": results,
        }
        record.write("revisions-ab", figures, args)
    finally:
        for _, tree in trees:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)  # runs under --out are kept
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
