"""The checkpoint writer's cost with torch.save's zip CRC32 left out (what it does) and
taken (what it did before), in the same run.

    .venv/bin/python bench/writer_bench.py --mb 680 --repeats 9

``dcp.save`` of one rank's state (``--mb`` of float32 tensors in 24 pieces, like
weights and two Adam moments) through :class:`ChecksummingWriter` into a new directory
(the previous one removed first, as the retention does), with ``fsync``, ``--threads``
writer threads. The two alternate within each repeat, so that a shared machine's
drifting load hits them alike. Wall time, and CPU time (every thread of the process:
on a machine whose cores train, a background save's CPU time is what training loses).
The baseline swaps :func:`~ftfleet.trainer.checkpoint.writer.without_zip_crc32` for a
context that changes nothing.
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

from ftfleet.trainer.checkpoint import writer as writer_module  # noqa: E402
from ftfleet.trainer.checkpoint.writer import ChecksummingWriter  # noqa: E402


def save_once(state: dict[str, torch.Tensor], where: Path, threads: int) -> tuple[float, float]:
    shutil.rmtree(where, ignore_errors=True)
    writer = ChecksummingWriter(where, single_file_per_rank=True, sync_files=True, thread_count=threads)
    t0, c0 = time.perf_counter(), time.process_time()
    dcp.save(state, storage_writer=writer, no_dist=True)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=680.0, help="MB of state (default: a goodput-bench rank's)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2, help="writer threads (checkpoint.thread_count)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ftfleet-writer-bench"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = int(args.mb * (1 << 20) / 4) // 24
    state = {f"{g}.{i}": torch.randn(n) for g in ("w", "m", "v") for i in range(8)}
    without = writer_module.without_zip_crc32
    runs: dict[str, list[tuple[float, float]]] = {"zip CRC32 left out": [], "zip CRC32 taken": []}
    try:
        for _ in range(args.repeats):
            writer_module.without_zip_crc32 = without
            runs["zip CRC32 left out"].append(save_once(state, args.dir, args.threads))
            writer_module.without_zip_crc32 = contextlib.nullcontext
            runs["zip CRC32 taken"].append(save_once(state, args.dir, args.threads))
    finally:
        writer_module.without_zip_crc32 = without
        shutil.rmtree(args.dir, ignore_errors=True)
    size = sum(t.numel() * t.element_size() for t in state.values())
    print(f"dcp.save of {size / 1e6:.0f} MB, {args.threads} writer threads, fsync, median of {args.repeats}")
    print("| writer | wall | CPU |")
    print("| --- | --- | --- |")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    for name, (wall, cpu) in med.items():
        print(f"| {name} | {wall:.3f} s | {cpu:.3f} s |")
    (w1, c1), (w0, c0) = med["zip CRC32 left out"], med["zip CRC32 taken"]
    print(f"left out / taken: wall {w1 / w0:.2f}, CPU {c1 / c0:.2f}")


if __name__ == "__main__":
    main()
