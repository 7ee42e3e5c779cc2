"""Incremental checkpoints (``checkpoint.incremental``) against full ones, in the same run:
what a fine-tuning run with a frozen base writes per checkpoint, and what incremental
costs a full-training run, whose every tensor changes between saves.

    .venv/bin/python bench/incremental_bench.py

A Hugging Face Llama (``--hidden``, ``--layers``; built from a config, nothing is
downloaded) trains on random tokens with AdamW on one process, and two checkpoint
managers save the same state at the same steps, one with ``checkpoint.incremental`` and
one without, alternating which goes first (blocking saves: the whole write, fsync and
commit are timed). Two phases:

* **fine-tuning**: every parameter but the last layer's MLP frozen (``model.freeze``);
  per save, the bytes the incremental save wrote against the full save of the same
  state, then a restore of the newest incremental checkpoint into a fresh model whose
  state hash must equal the trained one's;
* **full training**: every parameter trains; the median save time with incremental
  against without (the price of the fingerprints, and of a comparison read where a
  fingerprint matches).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from ftfleet.trainer.checkpoint.config import CheckpointConfig  # noqa: E402
from ftfleet.trainer.checkpoint.manager import CheckpointManager  # noqa: E402
from ftfleet.trainer.checkpoint.state import AppState, TrainProgress, checkpoint_state, state_sha256  # noqa: E402
from ftfleet.trainer.train import freeze  # noqa: E402


def build(args: argparse.Namespace, frozen: list[str]) -> tuple[torch.nn.Module, AppState]:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config)
    freeze(model, frozen)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, AppState(model, optimizer, None, TrainProgress(), rank=0, seed=args.seed)


def manager(root: Path, app: AppState, incremental: bool) -> CheckpointManager:
    shutil.rmtree(root, ignore_errors=True)
    cfg = CheckpointConfig(dir=str(root), incremental=incremental, async_save=False, keep=3, upload="none")
    return CheckpointManager(cfg, app, run_id="bench", config_hash="bench")


def train(model: torch.nn.Module, app: AppState, steps: int, args: argparse.Namespace) -> None:
    for _ in range(steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
        model(input_ids=tokens, labels=tokens).loss.backward()
        app.optimizer.step()
        app.optimizer.zero_grad(set_to_none=True)
        app.progress.step += 1


def saved(mgr: CheckpointManager, step: int) -> tuple[float, int, int]:
    """A blocking save: (wall seconds, bytes written, bytes referenced)."""
    t0 = time.perf_counter()
    manifest = mgr.save(step, blocking=True)
    return time.perf_counter() - t0, manifest.total_bytes, manifest.reused_bytes


def phase(args: argparse.Namespace, frozen: list[str], tag: str) -> dict:
    model, app = build(args, frozen)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    inc = manager(args.dir / f"{tag}-incremental", app, True)
    full = manager(args.dir / f"{tag}-full", app, False)
    rows = []
    for i in range(args.saves):
        train(model, app, args.steps_between, args)
        step = app.progress.step
        order = [("incremental", inc), ("full", full)]
        if i % 2:
            order.reverse()
        got = {name: saved(mgr, step) for name, mgr in order}
        rows.append(
            {
                "step": step,
                "incremental_s": got["incremental"][0],
                "full_s": got["full"][0],
                "written_bytes": got["incremental"][1],
                "reused_bytes": got["incremental"][2],
                "full_bytes": got["full"][1],
                "written_vs_full": got["incremental"][1] / got["full"][1],
            }
        )
        print(
            f"{tag} step {step}: incremental {got['incremental'][0]:.3f} s wrote "
            f"{got['incremental'][1] / 1e6:.1f} MB ({rows[-1]['written_vs_full']:.3f} of the full save's "
            f"{got['full'][1] / 1e6:.1f} MB, {got['full'][0]:.3f} s)",
            flush=True,
        )
    expected = state_sha256(checkpoint_state(app.state_dict()))
    inc.close()
    full.close()
    # A restore through the references, into a model that trained nothing.
    fresh_model, fresh_app = build(args, frozen)
    again = CheckpointManager(
        CheckpointConfig(dir=str(args.dir / f"{tag}-incremental"), incremental=True, upload="none"),
        fresh_app,
        run_id="bench",
        config_hash="bench",
    )
    restored = again.restore()
    identical = restored is not None and state_sha256(checkpoint_state(fresh_app.state_dict())) == expected
    again.close()
    later = rows[1:]  # the first save of a process writes every tensor
    return {
        "parameters": params,
        "trainable": trainable,
        "frozen_share": 1 - trainable / params,
        "saves": rows,
        "written_vs_full_median": statistics.median(r["written_vs_full"] for r in later),
        "written_vs_full_max": max(r["written_vs_full"] for r in later),
        "save_s_incremental_median": statistics.median(r["incremental_s"] for r in later),
        "save_s_full_median": statistics.median(r["full_s"] for r in later),
        "save_time_ratio": statistics.median(r["incremental_s"] / r["full_s"] for r in later),
        "restore_identical": identical,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--saves", type=int, default=12, help="saves per phase (the first writes everything)")
    ap.add_argument("--steps-between", type=int, default=2, help="training steps between saves")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ftfleet-incremental-bench"))
    record.add_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    last = args.layers - 1
    frozen = [
        "model.embed_tokens.*",
        "lm_head.*",
        "model.norm.*",
        *(f"model.layers.{i}.*" for i in range(last)),
        f"model.layers.{last}.self_attn.*",
        f"model.layers.{last}.*layernorm*",
    ]
    try:
        figures = {
            "fine_tuning": phase(args, frozen, "fine-tuning"),
            "full_training": phase(args, [], "full-training"),
        }
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    ft, full = figures["fine_tuning"], figures["full_training"]
    print("| case | frozen | written / full save (median, max) | save time incremental / full | restore |")
    print("| --- | --- | --- | --- | --- |")
    for name, f in (("fine-tuning", ft), ("full training", full)):
        print(
            f"| {name} | {f['frozen_share']:.1%} | {f['written_vs_full_median']:.3f}, {f['written_vs_full_max']:.3f} "
            f"| {f['save_time_ratio']:.3f} | {'bit-identical' if f['restore_identical'] else 'DIFFERS'} |"
        )
    figures["model"] = {k: getattr(args, k) for k in ("hidden", "layers", "vocab", "seq", "batch")}
    figures["torch"] = torch.__version__
    record.write("incremental", figures, args)
    if not (ft["restore_identical"] and full["restore_identical"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
