"""The checkpoint writer as it is (shards with ``O_DIRECT``, torch.save's zip CRC32 left
out) against itself buffered through the page cache, and buffered with the zip CRC32
taken (the writer before either change), in the same run.

    .venv/bin/python bench/writer_bench.py --mb 680 --repeats 9

``dcp.save`` of one rank's state (``--mb`` of float32 tensors in 24 pieces, like
weights and two Adam moments) through :class:`ChecksummingWriter` into a new directory
(the previous one removed first, as the retention does, then ``--idle`` seconds without
I/O, as between a trainer's saves), with ``fsync``, ``--threads`` writer threads. The
three alternate within each repeat, so that a shared machine's drifting load hits them
alike. Wall time, and CPU time (every thread of the process: on a machine whose cores
train, a background save's CPU time is what training loses). The zip-CRC baseline swaps
:func:`~ftfleet.trainer.checkpoint.writer.without_zip_crc32` for a context that changes
nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from ftfleet.trainer.checkpoint import writer as writer_module  # noqa: E402
from ftfleet.trainer.checkpoint.writer import ChecksummingWriter  # noqa: E402


def save_once(
    state: dict[str, torch.Tensor], where: Path, threads: int, idle_s: float, direct: bool
) -> tuple[float, float]:
    shutil.rmtree(where, ignore_errors=True)
    time.sleep(idle_s)
    writer = ChecksummingWriter(
        where, single_file_per_rank=True, sync_files=True, thread_count=threads, direct_io=direct
    )
    t0, c0 = time.perf_counter(), time.process_time()
    dcp.save(state, storage_writer=writer, no_dist=True)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=680.0, help="MB of state (default: a goodput-bench rank's)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2, help="writer threads (checkpoint.thread_count)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ftfleet-writer-bench"))
    ap.add_argument(
        "--idle",
        type=float,
        default=5.0,
        help="seconds between removing the last save and the next (default 5; memory freed that long "
        "ago is what a trainer's next save finds)",
    )
    record.add_arguments(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = int(args.mb * (1 << 20) / 4) // 24
    state = {f"{g}.{i}": torch.randn(n) for g in ("w", "m", "v") for i in range(8)}
    without = writer_module.without_zip_crc32
    names = ("direct (as it is)", "buffered", "buffered, zip CRC32 taken")
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    try:
        for _ in range(args.repeats):
            writer_module.without_zip_crc32 = without
            runs[names[0]].append(save_once(state, args.dir, args.threads, args.idle, True))
            runs[names[1]].append(save_once(state, args.dir, args.threads, args.idle, False))
            writer_module.without_zip_crc32 = contextlib.nullcontext
            runs[names[2]].append(save_once(state, args.dir, args.threads, args.idle, False))
    finally:
        writer_module.without_zip_crc32 = without
        shutil.rmtree(args.dir, ignore_errors=True)
    size = sum(t.numel() * t.element_size() for t in state.values())
    print(
        f"dcp.save of {size / 1e6:.0f} MB, {args.threads} writer threads, fsync, {args.idle:g} s idle before "
        f"each, median of {args.repeats}"
    )
    print("| writer | wall | CPU | wall / as it is | CPU / as it is |")
    print("| --- | --- | --- | --- | --- |")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    w0, c0 = med[names[0]]
    for name, (wall, cpu) in med.items():
        print(f"| {name} | {wall:.3f} s | {cpu:.3f} s | {wall / w0:.2f} | {cpu / c0:.2f} |")
    figures = {
        "state_bytes": size,
        "threads": args.threads,
        "idle_s": args.idle,
        "repeats": args.repeats,
        "writers": {
            name: {
                "wall_s": wall,
                "cpu_s": cpu,
                "wall_vs_direct": wall / w0,
                "cpu_vs_direct": cpu / c0,
                "samples": [{"wall_s": w, "cpu_s": c} for w, c in runs[name]],
            }
            for name, (wall, cpu) in med.items()
        },
    }
    record.write("writer", figures, args)


if __name__ == "__main__":
    main()
