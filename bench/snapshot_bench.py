"""The in-memory snapshot tier: what a snapshot costs training, end to end, and what a
restore from it costs, against baselines run in the same script.

Run under torchrun with 2 processes (each one "node": each holds the other's copy):

    .venv/bin/torchrun --standalone --nproc-per-node=2 bench/snapshot_bench.py --mb 64 679

For each state size (MB per rank: model-like float32 tensors), median of ``--repeat``:

* ``torch.save``: the baseline, ``torch.save`` of the state into a new file in
  ``/dev/shm`` (what a snapshot written the obvious way blocks training for, before any
  copy goes to a peer);
* ``blocked``: :meth:`Snapshots.take`, what the trainer's training thread waits for:
  the copy of the tensors into the stager's buffer (the previous snapshot is done);
* ``end to end``: ``take`` and its background part (CRC32C, the file, the manifest,
  the copy sent to the peer and the peer's received, checked and written);
* ``restore``: :meth:`MemoryTier.load` of the own snapshot (read once, each tensor into
  its own storage, CRC32C on the way), against ``read once``: the file's bytes read
  into a buffer kept between reads, no check (the floor: a restore must also give each
  tensor new memory, and the kernel's first touch of fresh pages can be most of the
  difference).

``--device cuda``: the state lives on the GPU (every rank on GPU 0); a snapshot copies it
into a pinned buffer on the training stream, and each timing waits for the stream, so
``blocked`` is what the stream is held for, not only the host's part.

New tensors are on transparent huge pages, as in the trainer (``train.huge_pages``;
``--small-pages``: 4 KiB pages, as before it). Each process re-executes itself once
with what the image's entrypoint gives a trainer (:func:`ftfleet.hostenv.host_memory_env`:
the host allocator, glibc's copy threshold), unless ``--as-started``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import record  # noqa: E402  (no torch)
from ftfleet.contract import ContractError  # noqa: E402  (no torch)
from ftfleet.hostenv import exec_with_host_memory  # noqa: E402  (no torch)

if "--as-started" not in sys.argv:
    try:
        exec_with_host_memory()
    except ContractError as exc:
        sys.exit(f"error: {exc}")

# Before torch is imported: it reads the variable at its first allocation.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "0" if "--small-pages" in sys.argv else "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ftfleet.trainer.checkpoint.comm import DistComm  # noqa: E402
from ftfleet.trainer.checkpoint.memory import MemoryTier, Ring  # noqa: E402
from ftfleet.trainer.checkpoint.memory.snapshots import Snapshots  # noqa: E402
from ftfleet.trainer.checkpoint.restore import Identity  # noqa: E402


class State:
    """A stand-in for AppState: tensors that change between snapshots, and a step."""

    def __init__(self, mb: float, device: str = "cpu") -> None:
        n = int(mb * (1 << 20) / 4)
        # Three groups of eight tensors, like weights and two Adam moments.
        self.tensors = {f"{g}.{i}": torch.randn(n // 24, device=device) for g in ("w", "m", "v") for i in range(8)}
        self.step = 0
        self.loading = False

    def state_dict(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "step": self.step}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.tensors, self.step = sd["tensors"], sd["step"]


def _sync() -> None:
    """On a GPU: until the work queued on the stream is done (a snapshot's copies run on
    the training stream: the time they hold it is what training loses)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median(fn: Any, repeat: int, between: Any = None) -> float:
    times = []
    for _ in range(repeat):
        if between is not None:
            between()
        _sync()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, nargs="+", default=[64, 679])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--as-started",
        action="store_true",
        help="no host allocator or glibc tunables of the entrypoint's: the environment as given",
    )
    parser.add_argument("--shm", default="/dev/shm")
    parser.add_argument(
        "--small-pages",
        action="store_true",
        help="4 KiB pages for new tensors (THP_MEM_ALLOC_ENABLE=0), not the huge pages the trainer asks for",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the state lives: cuda copies it into a pinned buffer on the stream (every rank on GPU 0)",
    )
    record.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gloo")
    box = [tempfile.mkdtemp(prefix="ftfleet-bench-", dir=args.shm) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    root = box[0]
    rows = []
    for mb in args.mb:
        state = State(mb, args.device)
        tier = MemoryTier(os.path.join(root, f"{mb:g}"), Ring(rank, world, 1), keep=2)
        snaps = Snapshots(tier, state, Identity("bench", ""), DistComm(group), group)

        def bump(state: State = state) -> None:
            state.step += 1
            for t in state.tensors.values():
                t.add_(1.0)  # the weights change between snapshots, as in training

        counter = [0]

        def naive(state: State = state, mb: float = mb, counter: list[int] = counter) -> None:
            counter[0] += 1
            path = os.path.join(root, f"naive-{mb:g}-{rank}-{counter[0]}.pt")
            torch.save(state.state_dict(), path)
            if counter[0] > 1:  # keep one, like the tier
                os.remove(os.path.join(root, f"naive-{mb:g}-{rank}-{counter[0] - 1}.pt"))

        baseline = _median(naive, args.repeat, bump)
        for _ in range(3):  # the files are created and mapped once, as in training
            bump()
            snaps.take(state.step)
            snaps.wait()

        def settled(snaps: Snapshots = snaps, bump: Any = bump) -> None:
            snaps.wait()  # in training the previous snapshot is long done by the next
            bump()

        blocked = _median(lambda snaps=snaps, state=state: snaps.take(state.step), args.repeat, settled)
        snaps.wait()

        def end_to_end(snaps: Snapshots = snaps, state: State = state) -> None:
            snaps.take(state.step)
            snaps.wait()

        whole = _median(end_to_end, args.repeat, bump)
        step = state.step
        path = tier.path(False, step)
        size = path.stat().st_size
        buf = torch.empty(size, dtype=torch.uint8)

        def read_once(path: Any = path, buf: torch.Tensor = buf) -> None:
            with open(path, "rb", buffering=0) as f:
                f.readinto(memoryview(buf.numpy()))

        read = _median(read_once, args.repeat)
        restore = _median(lambda tier=tier, step=step: tier.load(False, step), args.repeat)
        rows.append((mb, size, baseline, blocked, whole, read, restore))
        snaps.close()  # its thread ends and its files' mappings go
        shutil.rmtree(tier.root, ignore_errors=True)
    if rank == 0:
        where = f"state on {torch.cuda.get_device_name()}" if args.device == "cuda" else "state in host memory"
        print(f"{world} ranks (each holds the other's copy), {where}, median of {args.repeat}")
        print(
            "| MB per rank | torch.save to /dev/shm | take: blocked | take: end to end "
            "| blocked / torch.save | read once | restore (load + CRC) | restore / read once |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for mb, _size, base, blocked, whole, read, restore in rows:
            print(
                f"| {mb:g} | {base * 1e3:.0f} ms | {blocked * 1e3:.0f} ms | {whole * 1e3:.0f} ms | "
                f"{blocked / base:.3f} | {read * 1e3:.0f} ms | {restore * 1e3:.0f} ms | {restore / read:.2f} |"
            )
        figures = {
            "world_size": world,
            "device": args.device,
            "shm": args.shm,
            "repeats": args.repeat,
            "sizes": [
                {
                    "mb_per_rank": mb,
                    "file_bytes": size,
                    "torch_save_s": base,
                    "blocked_s": blocked,
                    "end_to_end_s": whole,
                    "blocked_vs_torch_save": blocked / base,
                    "read_once_s": read,
                    "restore_s": restore,
                    "restore_vs_read_once": restore / read,
                }
                for mb, size, base, blocked, whole, read, restore in rows
            ],
        }
        record.write("snapshot" if args.device == "cpu" else f"snapshot-{args.device}", figures, args)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
