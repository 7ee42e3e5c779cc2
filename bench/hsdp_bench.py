"""What replicated state costs (``parallel.replicas``): HSDP with R = 2 against FSDP over
every rank (R = 1), on the same ranks, the same model and the same global batch.

    .venv/bin/torchrun --standalone --nproc-per-node=4 bench/hsdp_bench.py --repeats 5

The reference GPT (``--d-model``, ``--layers``) is built by the trainer's own
``build_model`` for each R, then trains ``--steps`` steps of AdamW on synthetic tokens,
each rank its slice of the global batch; the two meshes alternate within each repeat (a
shared machine's drift hits both). Reported: the step time (the slower rank's, median
of the steps after the first of each repeat), the bytes of model and optimizer state one
rank holds (its shards: R = 2 holds each shard on 2 ranks, so twice as much), and the
bytes each rank sends per step beyond FSDP's (the all-reduce of its gradient shard across
the replicas: about twice the shard's fp32 bytes in a ring).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench import record  # noqa: E402
from bench.build_bench import slowest  # noqa: E402  (the slower rank's seconds)
from ftfleet.trainer import distributed  # noqa: E402
from ftfleet.trainer.config import load_config  # noqa: E402
from ftfleet.trainer.train import build_model, warm_up  # noqa: E402


def local_bytes(tensors) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor's local shard)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def steps(cfg, env, replicas: int, n: int, args) -> tuple[list[float], int, int]:
    """(step seconds, state bytes on this rank, gradient-shard bytes) of ``n`` steps at R."""
    cfg.parallel.replicas = replicas
    torch.manual_seed(0)
    model, _ = build_model(cfg, env, restoring=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    per_rank = args.global_batch // env.world_size
    times = []
    for i in range(n):
        g = torch.Generator().manual_seed(i * env.world_size + env.rank)
        tokens = torch.randint(0, args.vocab, (per_rank, args.seq + 1), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(slowest(time.perf_counter() - t0))
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    held, grads = local_bytes(params) + local_bytes(state), local_bytes(params)
    del model, optimizer
    return times, held, grads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6, help="steps per repeat and mesh (the first is dropped)")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=16)
    record.add_arguments(ap)
    args = ap.parse_args()
    overrides = [
        f"model.vocab_size={args.vocab}",
        f"model.seq_len={args.seq}",
        f"model.d_model={args.d_model}",
        f"model.n_layers={args.layers}",
        "model.n_heads=8",
        "model.dropout=0.0",
        "parallel.mode=fsdp",
    ]
    cfg = load_config(str(REPO / "trainer" / "configs" / "tiny.yaml"), overrides, environ={})
    env = distributed.init_distributed(cfg.parallel, 600)
    if env.world_size % 2 or args.global_batch % env.world_size:
        raise SystemExit("run on an even number of ranks that divides --global-batch")
    warm_up()
    rows: dict[int, dict] = {1: {"step_s": []}, 2: {"step_s": []}}
    for i in range(args.repeats):
        for r in (1, 2) if i % 2 == 0 else (2, 1):
            times, held, grads = steps(cfg, env, r, args.steps, args)
            rows[r]["step_s"] += times[1:]
            rows[r]["state_bytes_per_rank"] = held
            rows[r]["gradient_shard_bytes"] = grads
    if env.rank == 0:
        for r, row in rows.items():
            row["median_step_s"] = statistics.median(row["step_s"])
            # Beyond FSDP's own traffic: R = 2 all-reduces each gradient shard across the
            # two replicas (a ring of 2: each rank sends its shard once).
            row["extra_send_bytes_per_step"] = 0 if r == 1 else row["gradient_shard_bytes"]
        base = rows[1]
        print(
            f"GPT d_model {args.d_model}, {args.layers} layers, {env.world_size} ranks (gloo, CPU), global batch "
            f"{args.global_batch}, torch {torch.__version__}; medians of {args.repeats * (args.steps - 1)} steps:\n"
        )
        print("| mesh | step (s) | step / R=1 | state per rank (MB) | / R=1 | extra sent per step (MB) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r, row in rows.items():
            mesh = f"FSDP over {env.world_size}" if r == 1 else f"HSDP {r} x {env.world_size // r}"
            print(
                f"| {mesh} | {row['median_step_s']:.3f} | {row['median_step_s'] / base['median_step_s']:.2f}x "
                f"| {row['state_bytes_per_rank'] / 1e6:.1f} | "
                f"{row['state_bytes_per_rank'] / base['state_bytes_per_rank']:.2f}x | "
                f"{row['extra_send_bytes_per_step'] / 1e6:.1f} |"
            )
        figures = {
            "model": {k: getattr(args, k) for k in ("d_model", "layers", "vocab", "seq", "global_batch")},
            "world_size": env.world_size,
            "repeats": args.repeats,
            "steps": args.steps,
            "meshes": {str(r): row for r, row in rows.items()},
            "step_time_ratio": rows[2]["median_step_s"] / base["median_step_s"],
            "state_per_rank_ratio": rows[2]["state_bytes_per_rank"] / base["state_bytes_per_rank"],
        }
        record.write("hsdp", figures, args)
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
