"""What building the model costs a restart: the usual build (the factory's init, then
FSDP2's copy into shards) against the build for a restore (parameters made on the meta
device and allocated without values; ``train.build_model(restoring=True)``), and the
deferred init a run pays instead when it restores nothing. The goodput bench's model by
default (d_model 1856: 113M parameters), 2 ranks on gloo.

    .venv/bin/torchrun --standalone --nproc-per-node=2 bench/build_bench.py --repeats 5

The two builds alternate within each repeat (a shared machine's drift hits both); each
figure is the slower rank's, medians over the repeats. The first repeat is dropped: it
pays the process's one-time imports (``torch._dynamo``, which a warm spare imports
while it waits).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench import record  # noqa: E402
from ftfleet.trainer import distributed  # noqa: E402
from ftfleet.trainer.config import load_config  # noqa: E402
from ftfleet.trainer.train import build_model, warm_up  # noqa: E402


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def timed(fn) -> tuple[float, object]:
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    return slowest(time.perf_counter() - t0), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--d-model", type=int, default=1856)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--parallel", default="fsdp", choices=("fsdp", "ddp"))
    record.add_arguments(ap)
    args = ap.parse_args()
    overrides = [
        f"model.vocab_size={args.vocab}",
        "model.seq_len=16",
        f"model.d_model={args.d_model}",
        f"model.n_layers={args.layers}",
        "model.n_heads=8",
        f"parallel.mode={args.parallel}",
    ]
    cfg = load_config(str(REPO / "trainer" / "configs" / "tiny.yaml"), overrides, environ={})
    env = distributed.init_distributed(cfg.parallel, 600)
    warm_up()
    rows: dict[str, list[float]] = {"usual build": [], "build for a restore": [], "deferred init": []}
    for i in range(args.repeats + 1):
        usual, (model, _) = timed(lambda: build_model(cfg, env, restoring=False))
        del model
        lazy, (model, init) = timed(lambda: build_model(cfg, env, restoring=True))
        assert init is not None, "the model could not be built for a restore"
        late, _ = timed(init)
        params = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the whole tensor's
        del model
        if i:  # the first pays one-time imports
            rows["usual build"].append(usual)
            rows["build for a restore"].append(lazy)
            rows["deferred init"].append(late)
    if env.rank == 0:
        print(
            f"{params / 1e6:.0f}M parameters ({args.parallel}, {env.world_size} ranks, {os.cpu_count()} CPUs), "
            f"torch {torch.__version__}, medians of {args.repeats}, the slower rank:\n"
        )
        print("| phase | s | x usual build |")
        print("| --- | ---: | ---: |")
        base = statistics.median(rows["usual build"])
        for name, ts in rows.items():
            print(f"| {name} | {statistics.median(ts):.3f} | {statistics.median(ts) / base:.3f}x |")
        figures = {
            "parameters": params,
            "parallel": args.parallel,
            "world_size": env.world_size,
            "repeats": args.repeats,
            "phases": {
                name: {
                    "median_s": statistics.median(ts),
                    "vs_usual_build": statistics.median(ts) / base,
                    "samples_s": ts,
                }
                for name, ts in rows.items()
            },
        }
        record.write("build", figures, args)
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
