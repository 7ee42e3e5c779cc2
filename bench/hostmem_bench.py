"""Host memory: the goodput bench's model trained with 4 KiB pages and with transparent
huge pages (``train.huge_pages``, trainer/hostmem.py), alternating, in one script.

    .venv/bin/python bench/hostmem_bench.py --rounds 2

Each run: torchrun, 2 ranks, the goodput bench's model (d_model 1856, 1,358 MB of model
and AdamW state), ``--steps`` steps without checkpoints. Reported per setting, over the
rounds: the median step (steps 4 onward, after the warm-up) and the minor page faults
of the whole run (torchrun and its workers, from ``getrusage(RUSAGE_CHILDREN)``), and
the ratio huge / 4 KiB. Results go in docs/BENCHMARKS.md ("Host memory").
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from goodput_bench import cmd, env, model_overrides  # noqa: E402

SETTINGS = {"4 KiB pages": "train.huge_pages=false", "huge pages": "train.huge_pages=true"}


def one_run(work: Path, setting: str, steps: int, d_model: int) -> dict[str, float]:
    run_dir = work / setting.replace(" ", "-")
    overrides = model_overrides(d_model) + [f"train.steps={steps}", "checkpoint.enabled=false", SETTINGS[setting]]
    extra = {"THP_MEM_ALLOC_ENABLE": "0"} if setting == "4 KiB pages" else {}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    t0 = time.monotonic()
    subprocess.run(cmd(2, run_dir, overrides), env=env(extra), cwd=REPO, check=True, capture_output=True)
    wall = time.monotonic() - t0
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    step_s = [e["seconds"] for e in events if e["event"] == "step" and e["step"] >= 4]
    return {"step_s": statistics.median(step_s), "faults": faults, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=1856)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="ftfleet-hostmem-") as tmp:
        for r in range(args.rounds):
            for setting in SETTINGS:
                out = one_run(Path(tmp), setting, args.steps, args.d_model)
                results[setting].append(out)
                print(f"round {r + 1} {setting}: {out}", file=sys.stderr, flush=True)
    print("| pages | median step (s) | minor faults per run | wall (s) |")
    print("| --- | --- | --- | --- |")
    summary = {}
    for setting, rows in results.items():
        step = statistics.median(x["step_s"] for x in rows)
        faults = statistics.median(x["faults"] for x in rows)
        wall = statistics.median(x["wall_s"] for x in rows)
        summary[setting] = (step, faults)
        print(f"| {setting} | {step:.3f} | {faults:,.0f} | {wall:.1f} |")
    (small_step, small_faults), (huge_step, huge_faults) = summary["4 KiB pages"], summary["huge pages"]
    print(f"\nhuge / 4 KiB: step {huge_step / small_step:.3f}, faults {huge_faults / small_faults:.3f}")


if __name__ == "__main__":
    main()
