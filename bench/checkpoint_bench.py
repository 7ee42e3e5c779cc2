"""Checkpoint benchmark: how long training is blocked and how long until a checkpoint is
committed, for one model + AdamW state of at least 1 GiB, by five methods, with the
floors measured in the same run.

    .venv/bin/python bench/checkpoint_bench.py --dir /tmp/ftfleet-bench --repeats 3

Methods: (a) torch.save + fsync, (b) dcp.save, (c) dcp.async_save with default options,
(d) torchtitan's CheckpointManager in its threaded async mode, when torchtitan imports (it
lives in its own venv beside the pinned torch: ``make bench-titan``, then ``make bench``
runs this script there), (e) ftfleet's CheckpointManager. Floors: copying the state into
preallocated buffers; ``dd`` with fsync of the same number of bytes; reading the
checkpoint's bytes back (page cache dropped with posix_fadvise). Prints a Markdown table
(medians over --repeats; the first save of each manager, (d) and (e), is reported on its
own row: ftfleet's allocates the staging buffers that later saves reuse), then
ftfleet's ratios to floors paired with each save (a copy just before, a dd just after),
which a shared machine's drifting load distorts less than floors taken minutes apart.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from ftfleet.trainer.checkpoint.manager import CheckpointManager  # noqa: E402
from ftfleet.trainer.checkpoint.state import AppState, TrainProgress  # noqa: E402
from ftfleet.trainer.config import CheckpointConfig, ParallelConfig  # noqa: E402
from ftfleet.trainer.distributed import init_distributed  # noqa: E402
from ftfleet.trainer.model import GPT  # noqa: E402
from ftfleet.trainer.schemas import GPTConfig  # noqa: E402


def build_state(vocab: int, d_model: int, layers: int, device: torch.device):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, seq_len=128, d_model=d_model, n_layers=layers, n_heads=16)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    one_step(model, opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def one_step(model, opt) -> None:
    """One optimizer step on random gradients, so AdamW has its two moments."""
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)


def tensors_of(sd) -> list[torch.Tensor]:
    out = []
    if isinstance(sd, dict):
        for v in sd.values():
            out += tensors_of(v)
    elif isinstance(sd, (list, tuple)):
        for v in sd:
            out += tensors_of(v)
    elif isinstance(sd, torch.Tensor):
        out.append(sd)
    return out


def evict(paths) -> None:
    """Drop files from the page cache, so reads come from the device."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.is_file()]


def timed(fn) -> float:
    os.sync()  # start each measurement without another one's dirty pages in flight
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fsync_tree(d: Path) -> None:
    for p in files_under(d):
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/ftfleet-bench", help="where checkpoints are written")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2, help="DCP writer threads for ftfleet")
    ap.add_argument(
        "--device",
        choices=("auto", "cpu"),
        default="auto",
        help="auto: the state on the GPU when there is one (pinned staging, device-to-host copies)",
    )
    record.add_arguments(ap)
    args = ap.parse_args()

    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = init_distributed(ParallelConfig(backend="auto" if args.device == "auto" else "gloo"), 3600)
    cuda = env.device.type == "cuda"
    model, opt, sched = build_state(args.vocab, args.d_model, args.layers, env.device)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    plain = dict(zip(("model", "optim"), get_state_dict(model, opt), strict=True))  # the live tensors
    src = tensors_of(plain)
    nbytes = sum(t.numel() * t.element_size() for t in src)
    gib = nbytes / 2**30
    print(f"state: {len(src)} tensors, {nbytes / 1e9:.3f} GB ({gib:.2f} GiB)", file=sys.stderr)
    R = args.repeats
    rows: dict[str, dict] = {}

    # --- floors ---------------------------------------------------------------
    # On a GPU the floor is the device-to-host copy into pinned host buffers.
    bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in src]

    def copy_all(bufs=bufs):
        for b, t in zip(bufs, src, strict=True):
            b.copy_(t, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()

    copy_all()  # fault the pages in once

    copy_floor = statistics.median(timed(copy_all) for _ in range(R))
    mib = max(1, round(nbytes / 2**20))

    def dd():
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={root / 'dd.bin'}", "bs=1M", f"count={mib}", "conv=fsync"],
            check=True,
            capture_output=True,
        )

    dd_s = statistics.median(timed(dd) for _ in range(R))
    (root / "dd.bin").unlink()

    # --- (a) torch.save + fsync ----------------------------------------------
    def torch_save():
        path = root / "a.pt"
        with open(path, "wb") as f:
            torch.save(plain, f)
            f.flush()
            os.fsync(f.fileno())

    t = statistics.median(timed(torch_save) for _ in range(R))
    rows["(a) torch.save + fsync"] = {"blocked": t, "commit": t}
    (root / "a.pt").unlink()

    # --- (b) dcp.save ----------------------------------------------------------
    saves = itertools.count(1)

    def dcp_save():
        dcp.save(plain, storage_writer=dcp.FileSystemWriter(root / f"b{next(saves)}"), process_group=env.ckpt_group)

    t = statistics.median(timed(dcp_save) for _ in range(R))
    rows["(b) dcp.save"] = {"blocked": t, "commit": t}
    for d in root.glob("b*"):
        shutil.rmtree(d)

    # --- (c) dcp.async_save, default options ---------------------------------
    blocked, commit = [], []
    for i in range(R):
        os.sync()
        t0 = time.perf_counter()
        fut = dcp.async_save(plain, storage_writer=dcp.FileSystemWriter(root / f"c{i}"), process_group=env.ckpt_group)
        blocked.append(time.perf_counter() - t0)
        fut.result()
        commit.append(time.perf_counter() - t0)
    rows["(c) dcp.async_save (defaults)"] = {"blocked": statistics.median(blocked), "commit": statistics.median(commit)}
    for d in root.glob("c*"):
        shutil.rmtree(d)
    if cuda:
        rows.update(measure_pinned_stager(plain, root, R, env.ckpt_group))

    # --- (d) torchtitan's CheckpointManager ------------------------------------
    titan_rows, titan_note = measure_torchtitan(model, root, R, nbytes)
    rows.update(titan_rows)

    # --- (e) ftfleet -------------------------------------------------------------
    cfg = CheckpointConfig(dir=str(root / "e"), keep=2, thread_count=args.threads)
    progress = TrainProgress()
    app = AppState(model, opt, sched, progress, rank=0, seed=0)
    mgr = CheckpointManager(cfg, app, run_id="bench", config_hash="bench", ckpt_group=env.ckpt_group)
    blocked, commit, paired = [], [], []
    for i in range(R + 1):
        progress.step = i + 1
        # On a shared machine the floors drift within one run; each steady-state save is
        # also compared with a copy timed just before it and a dd timed just after it.
        copy_before = timed(copy_all) if i else None
        os.sync()
        t0 = time.perf_counter()
        mgr.save(progress.step)
        mgr.wait_for_staging()
        b = time.perf_counter() - t0
        m = mgr.wait(raise_on_error=True)
        # Committed = manifest renamed into place; retention of the previous checkpoint
        # runs after that on the same thread and is not part of the commit.
        c = mgr.stats.last_commit_s
        blocked.append(b)
        commit.append(c)
        if i:
            dd_after = timed(dd)
            paired.append((b / copy_before, dd_after / c))
    (root / "dd.bin").unlink()
    del bufs
    ckpt_bytes = m.total_bytes
    rows.update(manager_rows("(e) ftfleet", blocked, commit))

    # --- restore vs reading the bytes --------------------------------------------
    last = root / "e" / f"step-{progress.step}"
    paths = files_under(last)

    def read_all():
        buf = bytearray(8 << 20)
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

    read_s, restore_s = [], []
    for _ in range(R):
        evict(paths)
        read_s.append(timed(read_all))
        evict(paths)
        progress.step = 0
        restore_s.append(timed(mgr.restore))
        assert progress.step == int(last.name.split("-")[1])
    mgr.close()

    figures = print_report(
        rows,
        copy_floor,
        dd_s,
        nbytes,
        ckpt_bytes,
        statistics.median(read_s),
        statistics.median(restore_s),
        titan_note,
        args,
        gib,
        paired,
    )
    figures["device"] = env.device.type
    record.write("checkpoint" if not cuda else "checkpoint-cuda", figures, args)
    return 0


def measure_pinned_stager(plain, root: Path, repeats: int, group) -> dict:
    """(f), on a GPU: dcp.async_save with DCP's own DefaultStager kept across saves,
    pinned buffers and non-blocking copies on a side stream, in a thread (the stager that
    torchtitan's ``async_with_pinned_mem`` mode builds; torchtitan runs the write in a
    separate process, which this does not). Blocked = until staging completes."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from ftfleet.trainer.checkpoint.staging import reopen

    options = StagingOptions(
        use_pinned_memory=True, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=True
    )
    stager = DefaultStager(options)
    blocked, commit = [], []
    for i in range(repeats + 1):
        os.sync()
        torch.cuda.synchronize()
        reopen(stager)  # torch 2.11 closes it after each stage (pytorch/pytorch#183413)
        t0 = time.perf_counter()
        response = dcp.async_save(
            plain, storage_writer=dcp.FileSystemWriter(root / f"f{i}"), process_group=group, async_stager=stager
        )
        response.staging_completion.result()
        blocked.append(time.perf_counter() - t0)
        response.upload_completion.result()
        commit.append(time.perf_counter() - t0)
    stager.close()
    for d in root.glob("f*"):
        shutil.rmtree(d)
    return manager_rows("(f) dcp.async_save + DefaultStager (pinned, kept)", blocked, commit)


def manager_rows(name: str, blocked: list[float], commit: list[float]) -> dict:
    """A manager's first save (which may allocate its buffers) on a row of its own, and
    the median of the later ones."""
    return {
        f"{name}, first save": {"blocked": blocked[0], "commit": commit[0]},
        name: {"blocked": statistics.median(blocked[1:]), "commit": statistics.median(commit[1:])},
    }


TITAN_SETUP = (
    "`make bench-titan` (a venv at .venv-titan: `pip install -c constraints.txt "
    "-e '.[trainer]'`, then `pip install --no-deps -c constraints.txt "
    "-r bench/requirements-titan.txt`), then `make bench`"
)


class TitanTrainState:
    """The ``train_state`` entry torchtitan's trainer registers with its manager (there,
    the trainer itself): the step, as a tensor."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, sd: dict) -> None:
        self.step = int(sd["step"])


def measure_torchtitan(model, root: Path, repeats: int, nbytes: int) -> tuple[dict, str]:
    """(d): torchtitan's own CheckpointManager, in its threaded async mode, over the same
    model. Returns the table rows (none when torchtitan does not import) and a note."""
    try:
        import torchtitan
        from torchtitan.components.checkpoint import CheckpointManager as TitanManager
        from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, default_adamw
    except Exception as exc:  # noqa: BLE001
        return {}, (
            f"not installed here (`import torchtitan.components.checkpoint`: "
            f"{type(exc).__name__}: {exc}). To measure it: {TITAN_SETUP}."
        )

    # torchtitan saves the optimizer through its OptimizersContainer, which keys the state by
    # parameter name and builds its own AdamW for that; it cannot wrap the bench's AdamW.
    # So (d) gets an AdamW of its own over the same parameters, stepped once like the
    # bench's: the same model, and optimizer state of the same shapes and bytes.
    ocfg = default_adamw(lr=1e-4)
    ocfg.implementation = "for-loop"  # like the bench's AdamW on CPU; no effect on saving
    optimizers = OptimizersContainer(ocfg, model_parts=[model])
    one_step(model, optimizers)
    schedulers = LRSchedulersContainer(optimizers, lambda step: 1.0)
    train_state = TitanTrainState()
    titan_bytes = sum(t.numel() * t.element_size() for t in tensors_of([model.state_dict(), optimizers.state_dict()]))
    # "async": dcp.async_save in a thread, on a gloo group the manager creates. Its other
    # async mode, "async_with_pinned_mem", builds a DefaultStager with pinned memory and
    # non-blocking copies, which fails on CPU ("Non-blocking copy requires that the current
    # accelerator is available"), so it is not measured here.
    cfg = TitanManager.Config(enable=True, folder="d", interval=1, keep_latest_k=2, async_mode="async")
    mgr = TitanManager(
        cfg,
        dataloader=None,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=str(root),
    )
    blocked, commit = [], []
    for i in range(repeats + 1):
        train_state.step = i + 1
        os.sync()
        t0 = time.perf_counter()
        mgr.save(train_state.step)
        mgr.maybe_wait_for_staging()  # what its trainer calls before the next step
        blocked.append(time.perf_counter() - t0)
        mgr.maybe_wait_for_saving()  # the async_save future: every file written and fsynced
        commit.append(time.perf_counter() - t0)
    last = train_state.step
    train_state.step = 0
    assert mgr.load() and train_state.step == last, "torchtitan did not load its own save"
    mgr.close()
    shutil.rmtree(root / "d")
    version = getattr(torchtitan, "__version__", "?")
    note = (
        f'torchtitan {version}\'s `CheckpointManager` with `async_mode="async"` '
        f"(dcp.async_save in a thread, DCP's default writer), keep_latest_k=2; blocked = "
        f"`save()` + `maybe_wait_for_staging()`, committed = until "
        f"`maybe_wait_for_saving()` returns; the newest save loaded back with "
        f"`load()`. Its state: {titan_bytes / 1e9:.3f} GB of tensors "
        f"(the others: {nbytes / 1e9:.3f} GB). `async_with_pinned_mem` fails on CPU: its "
        f'DefaultStager asks for pinned memory and non-blocking copies ("Non-blocking copy '
        f'requires that the current accelerator is available").'
    )
    name = f"(d) torchtitan {version} CheckpointManager (async)"
    return manager_rows(name, blocked, commit), note


def print_report(rows, copy_floor, dd_s, nbytes, ckpt_bytes, read_s, restore_s, titan_note, args, gib, paired) -> dict:
    """Print the report; the same figures as a dict, for the raw results."""
    b_dcp = rows["(b) dcp.save"]["blocked"]
    dd_bw = nbytes / dd_s
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor() or platform.machine()
    gpu = f", state on {torch.cuda.get_device_name()}" if torch.cuda.is_available() and args.device == "auto" else ""
    print(
        f"Measured {now} on {os.cpu_count()} CPUs ({cpu}){gpu}, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM, "
        f"torch {torch.__version__}; state {nbytes / 1e9:.3f} GB ({gib:.2f} GiB: GPT "
        f"d_model={args.d_model} layers={args.layers} vocab={args.vocab} + AdamW), "
        f"medians of {args.repeats}.\n"
    )
    print(
        f"Floors: copy into preallocated buffers **{copy_floor:.3f} s** "
        f"({nbytes / copy_floor / 1e6:,.0f} MB/s); `dd conv=fsync` of the same bytes "
        f"**{dd_s:.3f} s** ({dd_bw / 1e6:,.0f} MB/s); reading ftfleet's checkpoint back "
        f"(page cache dropped) **{read_s:.3f} s** ({ckpt_bytes / read_s / 1e6:,.0f} MB/s).\n"
    )
    print(
        "| method | blocked (s) | blocked / copy floor | blocked / (b) | committed (s) | persist MB/s | persist / dd |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        bw = nbytes / r["commit"]
        print(
            f"| {name} | {r['blocked']:.3f} | {r['blocked'] / copy_floor:.2f}x | "
            f"{r['blocked'] / b_dcp:.3f}x | {r['commit']:.3f} | {bw / 1e6:,.0f} | "
            f"{bw / dd_bw:.2f}x |"
        )
    if not any(name.startswith("(d)") for name in rows):
        print("| (d) torchtitan CheckpointManager | not installed | - | - | - | - | - |")
    print(f"\n(d): {titan_note}\n")
    print(
        f"Restore (ftfleet: find, load through the reader that checks each CRC32C as it reads): **{restore_s:.3f} s**, "
        f"{restore_s / read_s:.2f}x the time to read the bytes.\n"
    )
    e = rows["(e) ftfleet"]
    checks = [
        ("blocked <= 1.5x copy floor", e["blocked"] <= 1.5 * copy_floor, f"{e['blocked'] / copy_floor:.2f}x"),
        ("blocked <= 0.10x dcp.save", e["blocked"] <= 0.10 * b_dcp, f"{e['blocked'] / b_dcp:.3f}x"),
        ("persist >= 0.8x dd", nbytes / e["commit"] >= 0.8 * dd_bw, f"{nbytes / e['commit'] / dd_bw:.2f}x"),
    ]
    print(
        "Targets (steady-state ftfleet save): "
        + "; ".join(f"{name}: {'met' if ok else 'NOT met'} ({val})" for name, ok, val in checks)
        + "\n"
    )
    copy_r = sorted(r for r, _ in paired)
    dd_r = sorted(r for _, r in paired)
    print(
        f"Paired floors (a copy timed just before and a dd just after each steady-state "
        f"ftfleet save, medians of {len(paired)}): blocked / copy "
        f"**{statistics.median(copy_r):.2f}x** ({copy_r[0]:.2f}-{copy_r[-1]:.2f}x), "
        f"{'met' if statistics.median(copy_r) <= 1.5 else 'NOT met'}; persist / dd "
        f"**{statistics.median(dd_r):.2f}x** ({dd_r[0]:.2f}-{dd_r[-1]:.2f}x), "
        f"{'met' if statistics.median(dd_r) >= 0.8 else 'NOT met'}."
    )
    return {
        "state_bytes": nbytes,
        "checkpoint_bytes": ckpt_bytes,
        "model": {"d_model": args.d_model, "layers": args.layers, "vocab": args.vocab},
        "threads": args.threads,
        "repeats": args.repeats,
        "floors": {"copy_s": copy_floor, "dd_fsync_s": dd_s, "read_back_s": read_s},
        "methods": {
            name: {
                "blocked_s": r["blocked"],
                "committed_s": r["commit"],
                "blocked_vs_copy_floor": r["blocked"] / copy_floor,
                "blocked_vs_dcp_save": r["blocked"] / b_dcp,
                "persist_mb_s": nbytes / r["commit"] / 1e6,
                "persist_vs_dd": nbytes / r["commit"] / dd_bw,
            }
            for name, r in rows.items()
        },
        "torchtitan": titan_note,
        "restore_s": restore_s,
        "restore_vs_read_back": restore_s / read_s,
        "targets": {name: {"met": ok, "value": val} for name, ok, val in checks},
        "paired": [{"blocked_vs_copy_before": c, "persist_vs_dd_after": d} for c, d in paired],
    }


if __name__ == "__main__":
    sys.exit(main())
