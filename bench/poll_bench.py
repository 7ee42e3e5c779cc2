"""What the in-process launcher's polling costs training: the goodput bench's model,
18 steps without checkpoints, under torchrun (the baseline, same script) and under the
in-process launcher (1 warm spare) at two polling intervals; median step of the last 15.

    .venv/bin/python bench/poll_bench.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from bench.goodput_bench import CONFIG, env, model_overrides  # noqa: E402


def median_step(name: str, launcher: list[str], work: Path, d_model: int) -> float:
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [*launcher, "--config", str(CONFIG), f"run_dir={run_dir}"]
    cmd += [*model_overrides(d_model), "train.steps=18", "checkpoint.enabled=false"]
    with open(work / f"{name}.log", "w") as log:
        subprocess.run(cmd, env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, timeout=600, check=True)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return statistics.median([e["seconds"] for e in events if e["event"] == "step"][3:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--d-model", type=int, default=1856)
    p.add_argument("--polls", type=float, nargs="+", default=[0.05, 0.25])
    p.add_argument("--out", type=Path, default=Path("/tmp/ftfleet-poll-bench"))
    record.add_arguments(p)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ftfleet.trainer"]
    print("| round | torchrun | " + " | ".join(f"in-process, poll {p:g} s" for p in args.polls) + " |")
    print("|---" * (2 + len(args.polls)) + "|")
    rounds = []
    for r in range(args.rounds):
        row = [median_step(f"torchrun-{r}", torchrun, args.out, args.d_model)]
        for poll in args.polls:
            launcher = [py, "-m", "ftfleet.trainer.inprocess", "--nproc=2", "--spares=1", "--soft-timeout=600"]
            launcher += [f"--poll={poll}", "--"]
            row.append(median_step(f"inprocess-{poll:g}-{r}", launcher, args.out, args.d_model))
        base = row[0]
        cells = [f"{row[0]:.3f} s"] + [f"{x:.3f} s ({x / base:.3f}×)" for x in row[1:]]
        print(f"| {r + 1} | " + " | ".join(cells) + " |", flush=True)
        rounds.append(
            {
                "torchrun_step_s": base,
                "inprocess_step_s": {f"{poll:g}": x for poll, x in zip(args.polls, row[1:], strict=True)},
            }
        )
    record.write("poll", {"d_model": args.d_model, "steps": 18, "median_of_last": 15, "rounds": rounds}, args)


if __name__ == "__main__":
    main()
