"""The in-memory snapshot tier: what a snapshot costs, and the two ways of moving a
peer's copy between ranks (issue 13, part 3).

Run under torchrun with 2 processes (each one "node"); results go in docs/BENCHMARKS.md:

    .venv/bin/torchrun --standalone --nproc-per-node=2 bench/snapshot_bench.py --mb 1 16 64

For each payload size it measures, median of ``--repeat`` runs:

* ``gloo p2p``: the copy as the trainer moves it (:func:`memory.exchange`: sizes, then
  bytes, batched isend/irecv on a gloo group) — every rank sends and receives one;
* ``store``: the same bytes through the TCPStore (set by the sender, get by the
  receiver), the alternative that needs no process group; it refuses values over
  8 MiB;
* ``shm write``: writing the payload and its manifest into shared memory
  (:meth:`MemoryTier.write`), and ``shm read+crc``: reading it back verified.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from ftfleet.trainer.checkpoint.manifest import Crc32c, Manifest
from ftfleet.trainer.checkpoint.memory import MemoryTier, Ring, exchange

STORE_MAX = 8 << 20


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--shm", default="/dev/shm")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gloo")
    store = dist.distributed_c10d._get_default_store()
    ring = Ring(rank, world, 1)
    holder, peer = ring.holder_of(rank), ring.peer_of(rank)
    transfers = [(r, ring.holder_of(r)) for r in range(world)]
    root = tempfile.mkdtemp(prefix="ftfleet-bench-", dir=args.shm) if rank == 0 else None
    box = [root]
    dist.broadcast_object_list(box, src=0)
    tier = MemoryTier(box[0], ring, keep=1)
    rows = []
    for mb in args.mb:
        payload = os.urandom(int(mb * (1 << 20)))
        crc = Crc32c()
        crc.update(payload)
        manifest = Manifest(
            step=1,
            run_id="bench",
            config_hash="",
            world_size=world,
            files={f"__{rank}.pt": crc.entry()},
            torch_version=torch.__version__,
        )
        counter = [0]

        def via_store(payload=payload, counter=counter, mb=mb):
            counter[0] += 1
            store.set(f"bench/{mb}/{counter[0]}/{rank}", payload)
            got = store.get(f"bench/{mb}/{counter[0]}/{peer}")
            assert len(got) == len(payload)

        def via_p2p(payload=payload):
            got = exchange(transfers, rank, {holder: payload}, group)
            assert len(got[peer]) == len(payload)

        p2p = _median(via_p2p, args.repeat)
        # The TCPStore's libuv server refuses a value over 8 MiB (measured: "Invalid
        # payload size. size: 16777216, max: 8388608"): a copy of any real model's
        # state cannot go that way in one piece.
        st = _median(via_store, args.repeat) if len(payload) < STORE_MAX else None
        write = _median(lambda payload=payload, manifest=manifest: tier.write(False, rank, 1, payload, manifest), 3)
        read = _median(lambda: tier.read(False, 1), 3)
        rows.append((mb, p2p, st, write, read))
    if rank == 0:
        print(f"{world} ranks, median of {args.repeat}")
        print("| MB per rank | gloo p2p | store | shm write | shm read+crc |")
        print("| --- | --- | --- | --- | --- |")
        for mb, p2p, st, write, read in rows:
            store = "refused (> 8 MiB)" if st is None else f"{st * 1e3:.1f} ms"
            print(f"| {mb:g} | {p2p * 1e3:.1f} ms | {store} | {write * 1e3:.1f} ms | {read * 1e3:.1f} ms |")
    dist.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(box[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
