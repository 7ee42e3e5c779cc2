"""Kill -> first step after recovery on the tiny model (issue 13, parts 1-3): the
in-process restart with a warm spare (``python -m ftfleet.trainer.inprocess``) beside
torchrun's whole-group restart, both restoring from the in-memory snapshots.

    .venv/bin/python bench/restart_bench.py --runs 5 --modes inprocess torchrun shrink

``--set KEY=VALUE`` (repeatable) adds a trainer override to every run, the reference's
too (``--set data.num_workers=0``: no loader workers; the config's 2 by default).
``--kill-at 1`` times a take-over right after the launch, while a spare may still be
warming up.

``shrink``: in-process without a spare, so the survivor goes on alone (world 1): the
snapshots are refused at the new world size, the restore reshards the newest durable
checkpoint, and the result is not the 2-rank reference (it is the smaller-world rung).

Each run: 2 training processes (+ 1 spare in-process), snapshots every step, durable
checkpoints every 8; once rank 0 logged step ``--kill-at``, rank 1 gets SIGKILL. From rank 0's
event log (rank 0 survives): kill -> ``start`` of the next attempt (detection, abort,
re-rendezvous), -> ``restored`` (from memory), -> ``first_step``. Also checks the run
ended bit-identical to an uninterrupted run of the same config (run once first).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from ftfleet.hostenv import host_memory_env  # noqa: E402  (no torch)

MODEL = [
    "run_id=bench",
    "seed=7",
    "model.vocab_size=64",
    "model.seq_len=16",
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.dropout=0.1",
    "optim.warmup_steps=4",
    "train.steps=24",
    "train.global_batch_size=6",
    "train.log_every=1000",
    "train.state_hash=true",
    "train.step_events=true",
    "resilience.interval.mode=fixed",
    "resilience.interval.fixed_steps=8",
    "resilience.interval.snapshot_fixed_steps=1",
    "checkpoint.memory=true",
    "checkpoint.ranks_per_node=1",
    "faults.step_delay_s=0.05",
]


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _launch(
    run_dir: Path, shm: Path, spares: int, log: Path, mode: str = "inprocess", extra: tuple[str, ...] = ()
) -> subprocess.Popen:
    if mode in ("inprocess", "shrink"):
        head = [
            sys.executable,
            "-m",
            "ftfleet.trainer.inprocess",
            "--nproc=2",
            f"--spares={spares}",
            *(["--min-ranks=1"] if mode == "shrink" else []),
            "--worker=drill.inprocess_worker",
            "--",
        ]
    else:
        torchrun = str(Path(sys.executable).parent / "torchrun")
        head = [torchrun, "--standalone", "--nproc-per-node=2", "--max-restarts=3", "-m", "drill.worker"]
    cmd = [
        *head,
        "--config",
        str(REPO / "trainer" / "configs" / "tiny.yaml"),
        *MODEL,
        *extra,
        f"run_dir={run_dir}",
    ]
    env = {
        **os.environ,
        **host_memory_env(os.environ),  # as the image's entrypoint and the in-process launcher
        "FTFLEET_SHM_DIR": str(shm),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _rank_pid(launcher: int, rank: int, log: Path, mode: str) -> int:
    if mode in ("inprocess", "shrink"):
        prefix = f"ftfleet.inprocess: process {rank} "
        return next(int(x.split()[4]) for x in log.read_text().splitlines() if x.startswith(prefix))
    for entry in Path("/proc").iterdir():  # torchrun's worker whose RANK is ``rank``
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == launcher and f"RANK={rank}".encode() in env:
            return int(entry.name)
    raise RuntimeError(f"no worker of rank {rank} under {launcher}")


def one(work: Path, kill_at: int, mode: str, extra: tuple[str, ...] = ()) -> dict:
    run_dir, shm, log = work / "run", work / "shm", work / "launch.log"
    proc = _launch(run_dir, shm, 0 if mode == "shrink" else 1, log, mode, extra)
    deadline = time.monotonic() + 120
    while not any(e["event"] == "step" and e["step"] >= kill_at for e in _events(run_dir)):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"never reached step {kill_at}: {log}")
        time.sleep(0.005)
    pid = _rank_pid(proc.pid, 1, log, mode)
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    code = proc.wait(timeout=180)
    after = [e for e in _events(run_dir) if e["t"] > t_kill and e["attempt"] == 1]
    at = {e["event"]: e["t"] - t_kill for e in reversed(after)}
    summary = json.loads((run_dir / "summary.json").read_text())
    # A kill before the first snapshot: the next attempt starts from step 0 ("fresh").
    resumed = summary["resumed_from"] or {"tier": "none", "step": 0}
    return {
        "code": code,
        "start": at.get("start"),
        "restored": at.get("restored", at.get("fresh")),
        "first_step": at.get("first_step"),
        "resumed": resumed,
        "sha": summary["state_sha256"],
        "lost": max((e["step"] for e in _events(run_dir) if e["event"] == "step" and e["t"] < t_kill), default=0)
        - resumed["step"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kill-at", type=int, default=10)
    modes = ("inprocess", "torchrun", "shrink")
    parser.add_argument("--modes", nargs="+", choices=modes, default=["inprocess", "torchrun"])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer override")
    record.add_arguments(parser)
    args = parser.parse_args()
    extra = tuple(args.set)
    root = Path(tempfile.mkdtemp(prefix="ftfleet-restart-"))
    ref = root / "ref"
    ref.mkdir()
    proc = _launch(ref / "run", ref / "shm", 0, ref / "launch.log", extra=extra)
    assert proc.wait(timeout=180) == 0, (ref / "launch.log").read_text()[-3000:]
    ref_sha = json.loads((ref / "run" / "summary.json").read_text())["state_sha256"]
    figures: dict = {"kill_at_step": args.kill_at, "overrides": list(extra), "reference_sha256": ref_sha, "modes": {}}
    for mode in args.modes:
        rows = []
        for i in range(args.runs):
            work = root / f"{mode}-{i}"
            work.mkdir()
            r = one(work, args.kill_at, mode, extra)
            r["identical"] = r["sha"] == ref_sha
            rows.append(r)
            print(
                f"{mode} run {i}: exit {r['code']}, kill -> start {r['start']:.2f} s, -> restored "
                f"{r['restored']:.2f} s, -> first step {r['first_step']:.2f} s (restored -> first step "
                f"{r['first_step'] - r['restored']:.2f} s); resumed from "
                f"{r['resumed']['tier']} step {r['resumed']['step']}, {r['lost']} steps lost, "
                f"bit-identical: {r['identical']}",
                flush=True,
            )
        first = [r["first_step"] for r in rows]
        print(
            f"{mode}: kill -> first step after recovery: median {statistics.median(first):.2f} s, "
            f"min {min(first):.2f} s, max {max(first):.2f} s over {len(rows)} runs; "
            f"bit-identical {sum(r['identical'] for r in rows)}/{len(rows)}",
            flush=True,
        )
        figures["modes"][mode] = {
            "kill_to_first_step_s": {"median": statistics.median(first), "min": min(first), "max": max(first)},
            "identical": sum(r["identical"] for r in rows),
            "runs": rows,
        }
    record.write("restart", figures, args)


if __name__ == "__main__":
    main()
