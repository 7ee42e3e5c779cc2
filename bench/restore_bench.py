"""Restore benchmark: the fast tier's restore against reading the checkpoint's bytes once,
in the same run (issue 13: "restore from the fast tier <= 1.2x the time to read the
bytes once").

    .venv/bin/python bench/restore_bench.py --dir /tmp/ftfleet-restore-bench --repeats 5

One model + AdamW state (default 1.02 GiB, the checkpoint bench's), saved once by
ftfleet's CheckpointManager. Then, --repeats times, each with the page cache of the
checkpoint's files dropped (posix_fadvise) first:

* read once: every file read sequentially into an 8 MiB buffer, nothing else;
* restart: what a restarted trainer does, ``CheckpointManager.restore(blank=True)`` into
  a state built for a restore (the parameters newly allocated without values, the
  optimizer without state; made before the clock starts): each file's CRC32C is taken
  piece by piece and each piece copied into the tensors as it is checked (one pass);
* restart, two phases: the same state made the same way, restored without ``blank``:
  every file checked, then the tensors copied from the cached pages (the restore
  before the one-pass read; the A/B for it);
* live state: ``CheckpointManager.restore()`` into a state that holds values (a
  rollback), two phases as above;
* two passes (the restore before issue 13): a CRC32C pass over every file, then DCP's
  own read and parse (``load_into`` with the safe reader, no check).

The three alternate within each repeat, so that a shared machine's drifting load hits
them alike; the ratios are medians of the per-repeat ratios. New tensors are on
transparent huge pages, as in the trainer (``--small-pages``: 4 KiB pages). The bench
runs under the host allocator the image gives its trainers (``FTFLEET_HOST_ALLOCATOR``:
jemalloc where installed, re-executing itself with it preloaded), so a restart's new
tensors come from the memory the previous state freed, as in an in-process restart;
``FTFLEET_HOST_ALLOCATOR=system`` gives glibc's malloc, whose large blocks are new pages
each time, as in a newly started process.
``--device cuda``: the state on the GPU, each timing ending once the device's copies
are done.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402  (no torch)
from ftfleet.contract import ContractError  # noqa: E402
from ftfleet.hostenv import exec_with_host_memory  # noqa: E402

try:  # the trainers' host allocator and glibc tunables, before torch loads
    exec_with_host_memory()
except ContractError as exc:
    sys.exit(f"error: {exc}")
# Before torch is imported: it reads the variable at its first allocation.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "0" if "--small-pages" in sys.argv else "1")

import torch  # noqa: E402
from checkpoint_bench import build_state, evict, files_under, timed  # noqa: E402

from ftfleet.trainer.checkpoint.manager import CheckpointManager  # noqa: E402
from ftfleet.trainer.checkpoint.restore import find_and_prepare  # noqa: E402
from ftfleet.trainer.checkpoint.safe_load import load_into  # noqa: E402
from ftfleet.trainer.checkpoint.state import AppState, TrainProgress  # noqa: E402
from ftfleet.trainer.config import CheckpointConfig, ParallelConfig  # noqa: E402
from ftfleet.trainer.distributed import init_distributed  # noqa: E402
from ftfleet.trainer.hostmem import active_allocator  # noqa: E402


def synced(fn):
    """``fn``, then wait for the device's queued work (copies into device tensors)."""

    def run() -> None:
        fn()
        torch.cuda.synchronize()

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/ftfleet-restore-bench", help="where the checkpoint is written")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2, help="DCP writer threads (files per rank)")
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the state lives (cuda: the restore copies into device tensors through pinned buffers)",
    )
    ap.add_argument(
        "--small-pages",
        action="store_true",
        help="4 KiB pages for new tensors (THP_MEM_ALLOC_ENABLE=0), not the huge pages the trainer asks for",
    )
    record.add_arguments(ap)
    args = ap.parse_args()

    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = init_distributed(ParallelConfig(), 3600)
    device = torch.device(args.device)
    model, opt, sched = build_state(args.vocab, args.d_model, args.layers, device)
    progress = TrainProgress()
    app = AppState(model, opt, sched, progress, rank=0, seed=0)
    cfg = CheckpointConfig(dir=str(root), keep=2, thread_count=args.threads)
    mgr = CheckpointManager(cfg, app, run_id="bench", config_hash="bench", ckpt_group=env.ckpt_group)
    progress.step = 1
    manifest = mgr.save(1, blocking=True)
    paths = files_under(root / "step-1")

    def read_once() -> None:
        buf = bytearray(8 << 20)
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

    def blank() -> None:
        """Untimed: what a restart's build gives the restore."""
        for p in model.parameters():
            p.data = torch.empty_like(p)
        opt.state.clear()
        if device.type == "cuda":
            torch.cuda.synchronize()

    def restart() -> None:
        progress.step = 0
        assert mgr.restore(blank=True).step == 1 and progress.step == 1

    def restart_two_phases() -> None:
        progress.step = 0
        assert mgr.restore().step == 1 and progress.step == 1

    def live() -> None:
        progress.step = 0
        assert mgr.restore().step == 1 and progress.step == 1

    def two_passes() -> None:
        progress.step = 0
        found = find_and_prepare(mgr.comm, mgr.local, [], mgr.identity, local_crc=True)
        app.loading = True
        try:
            load_into({"app": app}, mgr.local.step_dir(found.step), env.ckpt_group)
        finally:
            app.loading = False
        assert progress.step == 1

    fns = {
        "read once": read_once,
        "restart": restart,
        "restart, two phases": restart_two_phases,
        "live state": live,
        "two passes": two_passes,
    }
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            if fn in (restart, restart_two_phases):
                blank()
            evict(paths)
            times[name].append(timed(fn if device.type == "cpu" else synced(fn)))
    mgr.close()

    nbytes = manifest.total_bytes
    read = times["read once"]
    print(
        f"checkpoint {nbytes / 1e9:.3f} GB in {len(paths) - 1} files + manifest, "
        f"{os.cpu_count()} CPUs, state on {device.type}, host allocator {active_allocator()}, medians of "
        f"{args.repeats} (page cache dropped before each):\n"
    )
    print("| restore path | time (s) | x read once |")
    print("| --- | ---: | ---: |")
    paths_out = {}
    for name, ts in times.items():
        ratio = statistics.median(t / r for t, r in zip(ts, read, strict=True))
        print(f"| {name} | {statistics.median(ts):.3f} | {ratio:.2f}x |")
        paths_out[name] = {"median_s": statistics.median(ts), "vs_read_once": ratio, "samples_s": ts}
    ours = statistics.median(t / r for t, r in zip(times["restart"], read, strict=True))
    print(f"\nTarget (a restart's restore <= 1.2x read once): {'met' if ours <= 1.2 else 'NOT met'} ({ours:.2f}x)")
    figures = {
        "checkpoint_bytes": nbytes,
        "files": len(paths) - 1,
        "device": device.type,
        "host_allocator": active_allocator(),
        "repeats": args.repeats,
        "paths": paths_out,
        "target": {"restart_vs_read_once_at_most": 1.2, "met": ours <= 1.2},
    }
    record.write(f"restore-{device.type}" if device.type != "cpu" else "restore", figures, args)
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
