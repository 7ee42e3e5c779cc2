"""Host memory: the goodput bench's model trained with 4 KiB pages and with transparent
huge pages (``train.huge_pages``, trainer/hostmem.py), alternating, in one script.

    .venv/bin/python bench/hostmem_bench.py --rounds 2

Each run: torchrun, 2 ranks, the goodput bench's model (d_model 1856, 1,358 MB of model
and AdamW state), ``--steps`` steps without checkpoints. Reported per setting, over the
rounds: the median step (steps 4 onward, after the warm-up) and the minor page faults
of the whole run (torchrun and its workers, from ``getrusage(RUSAGE_CHILDREN)``), and
the ratio huge / 4 KiB.

    .venv/bin/python bench/hostmem_bench.py --files /dev/shm /run/ftfleet-shm

only measures what a new in-memory snapshot file costs in each RAM file system (a
tmpfs mounted with ``huge=within_size``, as the fleet's boot scripts do, against
/dev/shm): the file created, allocated, mapped and populated the way
:meth:`~ftfleet.trainer.checkpoint.memory.MemoryTier.mapped` does it, then the state's
bytes copied in, alternating between the directories, ``--repeats`` times, medians.

    .venv/bin/python bench/hostmem_bench.py --saves --rounds 2

the host allocator and the shards' writes: the same model, ``--steps`` steps with a
synchronous save every ``--every``, with glibc's malloc and buffered shards (before),
jemalloc and buffered shards, and jemalloc with ``O_DIRECT`` shards (as it is),
alternating. Reported, medians over the rounds: the median step without a save beside
it, the step right after each save above that median, and each save's blocked time.
jemalloc is preloaded the way the image's entrypoint does it (``FTFLEET_HOST_ALLOCATOR``;
``apt-get install libjemalloc2``). The other modes run with the allocator the
environment gives (:func:`goodput_bench.env`: jemalloc where installed;
``FTFLEET_HOST_ALLOCATOR=system`` runs them on glibc's malloc).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from goodput_bench import cmd, env, model_overrides  # noqa: E402

from bench import record  # noqa: E402
from ftfleet.hostenv import allocator_env, find_jemalloc  # noqa: E402
from ftfleet.trainer.checkpoint.memory import MemoryTier, Ring  # noqa: E402

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


def new_file(directory: Path, source: torch.Tensor) -> dict[str, float]:
    """One new snapshot file of ``source``'s size in ``directory``: (allocate, map) as the
    memory tier does, then the copy of the bytes; seconds each. The file goes after."""
    tier = MemoryTier(directory / f"ftfleet-hostmem-{os.getpid()}", Ring(0, 1, 1))
    try:
        t0 = time.monotonic()
        view = tier.mapped(False, 1, source.numel())
        t1 = time.monotonic()
        view.copy_(source)
        t2 = time.monotonic()
    finally:
        tier.close()
        shutil.rmtree(tier.root, ignore_errors=True)
    return {"create_s": t1 - t0, "copy_s": t2 - t1}


def files(dirs: list[Path], repeats: int, nbytes: int) -> dict:
    source = torch.ones(nbytes, dtype=torch.uint8)
    rows: dict[Path, list[dict[str, float]]] = {d: [] for d in dirs}
    for _ in range(repeats):
        for d in dirs:
            rows[d].append(new_file(d, source))
    print(f"| file system ({nbytes / 1e6:.0f} MB file) | create + map (s) | copy in (s) |")
    print("| --- | --- | --- |")
    base = None
    out = {}
    for d, samples in rows.items():
        create = statistics.median(x["create_s"] for x in samples)
        copy = statistics.median(x["copy_s"] for x in samples)
        base = base or create
        print(f"| {d} | {create:.3f} ({create / base:.2f}x) | {copy:.3f} |")
        out[str(d)] = {"create_s": create, "create_vs_first": create / base, "copy_s": copy, "samples": samples}
    return {"file_bytes": nbytes, "repeats": repeats, "file_systems": out}


#: --saves: (FTFLEET_HOST_ALLOCATOR, checkpoint.direct_io) of each variant.
SAVE_VARIANTS = {
    "glibc, buffered (before)": ("system", False),
    "jemalloc, buffered": ("jemalloc", False),
    "jemalloc, O_DIRECT (as it is)": ("jemalloc", True),
}


def save_run(work: Path, name: str, args: argparse.Namespace) -> dict[str, float]:
    allocator, direct = SAVE_VARIANTS[name]
    run_dir = work / name.split(" (")[0].replace(", ", "-")
    overrides = model_overrides(args.d_model) + [
        f"train.steps={args.steps}",
        "resilience.interval.mode=fixed",
        f"resilience.interval.fixed_steps={args.every}",
        "checkpoint.async_save=false",
        f"checkpoint.direct_io={str(direct).lower()}",
    ]
    # Only the allocator differs between the variants (glibc's tunables: env()'s, in each).
    environ = {k: v for k, v in env().items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    environ.update(allocator_env({"FTFLEET_HOST_ALLOCATOR": allocator}))
    subprocess.run(cmd(2, run_dir, overrides), env=environ, cwd=REPO, check=True, capture_output=True)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = {e["step"]: e["seconds"] for e in events if e["event"] == "step"}
    after = {s + 1 for s in range(args.every, args.steps, args.every)}
    quiet = statistics.median(t for s, t in steps.items() if s not in after and s > 1)
    blocked = [e["blocked_s"] for e in events if e["event"] == "committed" and e.get("reason") == "interval"]
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "step_s": quiet,
        "after_save_s": statistics.median(steps[s] - quiet for s in after if s in steps),
        "blocked_s": statistics.median(blocked),
    }


def saves(args: argparse.Namespace) -> dict:
    if find_jemalloc() is None:
        sys.exit("error: no libjemalloc.so.2 found: install it (apt-get install libjemalloc2)")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in SAVE_VARIANTS}
    with tempfile.TemporaryDirectory(prefix="ftfleet-hostmem-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            for name in SAVE_VARIANTS:
                rows[name].append(save_run(Path(tmp), name, args))
                print(f"round {r + 1} {name}: {rows[name][-1]}", file=sys.stderr, flush=True)
    keys = ("step_s", "after_save_s", "blocked_s")
    med = {name: {k: statistics.median(x[k] for x in samples) for k in keys} for name, samples in rows.items()}

    def per_interval(m: dict[str, float]) -> float:  # training's time per save interval
        return args.every * m["step_s"] + m["after_save_s"] + m["blocked_s"]

    base = per_interval(med[next(iter(SAVE_VARIANTS))])
    print(f"2 ranks, d_model {args.d_model}, a synchronous save every {args.every} steps, medians of {args.rounds}")
    print("| variant | step (s) | step after a save, above it (s) | save blocked (s) | per interval / before |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in med.items():
        print(
            f"| {name} | {m['step_s']:.3f} | {m['after_save_s']:+.3f} | {m['blocked_s']:.3f} "
            f"| {per_interval(m) / base:.2f} |"
        )
    return {
        "d_model": args.d_model,
        "steps": args.steps,
        "save_every": args.every,
        "rounds": args.rounds,
        "variants": {
            name: {**m, "per_interval_vs_first": per_interval(m) / base, "rounds": rows[name]}
            for name, m in med.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=1856)
    parser.add_argument("--files", type=Path, nargs="+", metavar="DIR", help="only time new snapshot files in each")
    parser.add_argument("--repeats", type=int, default=7, help="with --files (default 7)")
    parser.add_argument("--mb", type=int, default=679, help="with --files: the file's size (default 679: a rank's)")
    parser.add_argument("--saves", action="store_true", help="only the allocator and shard-write variants")
    parser.add_argument("--every", type=int, default=5, help="with --saves: steps between saves (default 5)")
    parser.add_argument("--dir", type=Path, default=None, help="with --saves: where the runs go (default: TMPDIR)")
    record.add_arguments(parser)
    args = parser.parse_args()
    if args.saves:
        args.steps = max(args.steps, 5 * args.every + 1)
        record.write("hostmem-saves", saves(args), args)
        return
    if args.files:
        record.write("hostmem-files", files(args.files, args.repeats, args.mb * 10**6), args)
        return
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
    figures = {
        "d_model": args.d_model,
        "steps": args.steps,
        "rounds": args.rounds,
        "settings": {
            setting: {
                "median_step_s": statistics.median(x["step_s"] for x in rows),
                "minor_faults": statistics.median(x["faults"] for x in rows),
                "wall_s": statistics.median(x["wall_s"] for x in rows),
                "rounds": rows,
            }
            for setting, rows in results.items()
        },
        "huge_vs_small": {"step": huge_step / small_step, "faults": huge_faults / small_faults},
    }
    record.write("hostmem-pages", figures, args)


if __name__ == "__main__":
    main()
