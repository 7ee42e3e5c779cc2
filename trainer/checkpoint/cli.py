"""``ftfleet ckpt list|verify|inspect TARGET``, ``ftfleet ckpt export TARGET STEP``

TARGET is a tier root (a directory holding ``step-N/``), one step directory, or a
bucket URI (``s3://bucket/prefix``, ``gs://bucket/prefix``). ``list`` checks that every
file of each checkpoint is present with its size; ``verify`` also checks every CRC32C;
``inspect`` shows one checkpoint's manifest and, with ``--tensors``, its contents and
``state_sha256`` (the same hash the trainer writes to summary.json); ``export`` writes
one checkpoint's model weights, unsharded, as a ``torch.save`` or safetensors file (and
a Hugging Face model's ``config.json`` beside it). A checkpoint that fails exits 1 and
names the bad file.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ftfleet.contract import parse_step_dir, step_dir_name
from ftfleet.errors import UserError
from ftfleet.trainer.checkpoint import retention
from ftfleet.trainer.checkpoint.export import FORMATS
from ftfleet.trainer.checkpoint.manifest import (
    Manifest,
    ManifestError,
    Milestone,
    checksum_stream,
    object_key,
    verify_dir,
)
from ftfleet.trainer.checkpoint.tiers import LocalTier, TierUnavailable, open_store


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ckpt", help="list, verify, inspect or export checkpoints", description=__doc__.split("\n\n")[1]
    )
    sub = parser.add_subparsers(dest="ckpt_command", metavar="ACTION", required=True)
    for name, fn, text in (
        ("list", cmd_list, "steps, sizes, world size, quick check"),
        ("verify", cmd_verify, "check every file's size and CRC32C"),
        ("inspect", cmd_inspect, "one checkpoint's manifest and contents"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("target", metavar="TARGET", help="directory, step directory or bucket URI")
        p.add_argument("--step", type=int, help="only this step")
        p.add_argument(
            "--endpoint-url",
            default=os.environ.get("AWS_ENDPOINT_URL"),
            help="S3 endpoint (default: $AWS_ENDPOINT_URL, else AWS)",
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "list":
            p.add_argument(
                "--retention",
                action="append",
                metavar="RULE",
                help="a rule of checkpoint.retention, repeated in order (default: the schedule the newest "
                "manifest records, else the default); the 'kept by' column names what keeps each checkpoint "
                "in a durable tier",
            )
        if name == "inspect":
            p.add_argument(
                "--tensors",
                action="store_true",
                help="load the checkpoint (safely) and list its entries and state_sha256",
            )
        p.set_defaults(func=fn)
    p = sub.add_parser(
        "export",
        help="one checkpoint's model weights as a torch or safetensors file, or the whole checkpoint",
        description="Write the model weights of step STEP (a number, or latest) of TARGET, unsharded, "
        "for inference or another framework, read as model.load_state_dict(torch.load(FILE)) or "
        "(safetensors.torch.load_file(FILE)). A Hugging Face model's config.json is written beside "
        "it: -o DIR/model.safetensors makes DIR loadable with from_pretrained(DIR). --to checkpoint "
        "copies the whole checkpoint to DIR/step-STEP (-o DIR, default ./export), self-contained: the "
        "files an incremental checkpoint references are copied in. The files are verified (size and "
        "CRC32C) first.",
    )
    p.add_argument("target", metavar="TARGET", help="directory, step directory or bucket URI")
    p.add_argument("step", metavar="STEP", help="the step, or latest (the newest committed)")
    p.add_argument("--to", dest="fmt", choices=FORMATS, required=True, help="output format")
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        help="output file (default: ./step-STEP.pt or .safetensors); for checkpoint, a directory (default: ./export)",
    )
    p.add_argument(
        "--endpoint-url",
        default=os.environ.get("AWS_ENDPOINT_URL"),
        help="S3 endpoint (default: $AWS_ENDPOINT_URL, else AWS)",
    )
    p.set_defaults(func=cmd_export)


# ---------------------------------------------------------------------------
# Targets: a local tier or an object store, seen the same way
# ---------------------------------------------------------------------------


class _Target:
    def __init__(self, spec: str, endpoint_url: str | None, step: int | None):
        self.step_filter = step
        if spec.startswith(("s3://", "gs://")):
            self.tier: Any = open_store(spec, endpoint_url=endpoint_url)
            self.local = False
            return
        path = Path(spec)
        if not path.is_dir():
            raise UserError(f"{spec}: no such directory; pass a checkpoint directory or a bucket URI")
        single = parse_step_dir(path.name)
        if single is not None:  # a step directory itself
            path, self.step_filter = path.parent, single if step is None else step
        self.tier = LocalTier(path)
        self.local = True

    def steps(self, committed: bool = False) -> list[int]:
        """Every step with a directory or objects; ``committed``: only those with a
        manifest.json, well-formed or not."""
        try:
            steps = self.tier.committed_steps() if committed else self.tier.all_steps()
        except TierUnavailable as exc:
            raise UserError(f"{exc}; check the URI and credentials") from None
        if self.step_filter is not None:
            steps = [s for s in steps if s == self.step_filter]
        return steps

    def manifest(self, step: int) -> Manifest | None:
        return self.tier.read_manifest(step)

    def problems(self, manifest: Manifest, full: bool) -> list[str]:
        if self.local:
            return verify_dir(self.tier.step_dir(manifest.step), manifest, full=full)
        out = []
        listings: dict[str, dict[str, int]] = {}
        for name, entry in sorted(manifest.every_file().items()):
            key = object_key(manifest.step, name)
            prefix = key.rpartition("/")[0]
            if prefix not in listings:
                listings[prefix] = self.tier.list(f"{prefix}/")
            size = listings[prefix].get(key)
            if size is None:
                out.append(f"{name}: missing")
            elif size != entry.size:
                out.append(f"{name}: size {size} bytes, manifest says {entry.size}")
            elif full:
                got = checksum_stream(self.tier.iter_object(key))
                if got.crc32c != entry.crc32c:
                    out.append(f"{name}: crc32c {got.crc32c}, manifest says {entry.crc32c} (corrupt)")
        return out

    def local_copy(self, manifest: Manifest, tmp: Path) -> Path:
        """The directory of checkpoint ``manifest``: in the tier when it is local, else a
        copy under ``tmp`` (its referenced files beside it, as in a tier)."""
        if self.local:
            return self.tier.step_dir(manifest.step)
        step_dir = tmp / step_dir_name(manifest.step)
        for name in manifest.every_file():
            (step_dir / name).parent.mkdir(parents=True, exist_ok=True)
            self.tier.download_file(object_key(manifest.step, name), step_dir / name)
        return step_dir

    def describe(self, step: int) -> str:
        return f"{self.tier.describe()}/{step_dir_name(step)}"


def newest_verified(uri: str, endpoint_url: str | None = None, check_files: bool = True) -> int | None:
    """The newest step under ``uri`` whose manifest reads and names it and (with
    ``check_files``) whose every file is there at its manifest's size; None if none."""
    target = _Target(uri, endpoint_url, None)
    for step in sorted(target.steps(committed=True), reverse=True):
        try:
            manifest = target.manifest(step)
        except ManifestError:
            continue
        if manifest is None or manifest.step != step:
            continue
        if not check_files or not target.problems(manifest, full=False):
            return step
    return None


def _check_all(args: argparse.Namespace, full: bool) -> int:
    target = _Target(args.target, args.endpoint_url, args.step)
    steps = target.steps()
    rows, bad = [], 0
    for step in steps:
        row: dict[str, Any] = {"step": step, "location": target.describe(step)}
        try:
            manifest = target.manifest(step)
        except ManifestError as exc:
            row.update(status="CORRUPT", problems=[f"manifest.json: malformed ({exc})"])
            bad += 1
            rows.append(row)
            continue
        if manifest is None:
            row.update(status="uncommitted", problems=["no manifest.json: ignored by every loader"])
            rows.append(row)
            continue
        problems = target.problems(manifest, full)
        if manifest.step != step:
            problems.insert(0, f"manifest.json: describes step {manifest.step}")
        bad += bool(problems)
        row.update(
            status="CORRUPT" if problems else ("ok" if full else "ok (sizes)"),
            problems=problems,
            files=len(manifest.files),
            bytes=manifest.total_bytes,
            world_size=manifest.world_size,
            run_id=manifest.run_id,
            created=_when(manifest.created_at),
            created_at=manifest.created_at,
            validation=manifest.validation,
            milestone=dataclasses.asdict(manifest.milestone) if manifest.milestone else None,
            retention=manifest.retention.to_json() if manifest.retention else None,
            references=sorted(manifest.references),
            reused_bytes=manifest.reused_bytes,
        )
        rows.append(row)
    if not full:
        _kept_by(rows, getattr(args, "retention", None))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        kept = "  kept by" if not full else ""
        print(f"{'step':>8}  {'status':<11} {'files':>5} {'size':>10}  {'ranks':>5}  {'created':<19}  run{kept}")
        for r in rows:
            print(
                f"{r['step']:>8}  {r['status']:<11} {r.get('files', '-'):>5} "
                f"{_size(r.get('bytes')):>10}  {r.get('world_size', '-'):>5}  "
                f"{r.get('created', '-'):<19}  {r.get('run_id', '-')}"
                + (f"  {r.get('kept_by') or '-'}" if not full else "")
            )
            for p in r["problems"]:
                print(f"{'':>10}{'!' if r['status'] == 'CORRUPT' else '-'} {p}")
    if not steps:
        print(f"no checkpoint in {target.tier.describe()}", file=sys.stderr)
        return 1
    if bad:
        print(f"{bad} corrupt checkpoint(s) in {target.tier.describe()}", file=sys.stderr)
        return 1
    return 0


def _kept_by(rows: list[dict[str, Any]], rules: list[str] | None) -> None:
    """Set each committed row's ``kept_by``: what keeps it in a durable tier (a milestone,
    the newest, a pinned step, or a rule of ``rules`` or else the schedule the newest
    manifest records:
    :func:`~ftfleet.trainer.checkpoint.retention.keep_reasons`; else a checkpoint that
    references it), or None where the schedule would delete it."""
    written = [r["retention"] for r in sorted(rows, key=lambda r: r["step"]) if r.get("retention")]
    policy = retention.Policy(**{k: tuple(v) for k, v in written[-1].items()}) if written else retention.Policy()
    schedule = retention.parse_schedule(rules, key="--retention") if rules else policy.schedule()
    created = {r["step"]: r["created_at"] for r in rows if "created_at" in r}
    marks = {r["step"]: Milestone(**r["milestone"]) for r in rows if r.get("milestone")}
    reasons = retention.keep_reasons(created, schedule, policy.pinned, retention.milestone_reasons(marks))
    for r in sorted(rows, key=lambda r: r["step"]):  # a step is kept while a checkpoint references it
        for step in r.get("references", ()):
            if step in created:
                reasons.setdefault(step, f"{retention.REFERENCED} by step-{r['step']}")
    for r in rows:
        if "created_at" in r:
            r["kept_by"] = reasons.get(r["step"])


def cmd_list(args: argparse.Namespace) -> int:
    return _check_all(args, full=False)


def cmd_verify(args: argparse.Namespace) -> int:
    return _check_all(args, full=True)


def cmd_inspect(args: argparse.Namespace) -> int:
    target = _Target(args.target, args.endpoint_url, args.step)
    # The newest step with a manifest: a malformed one is reported below, by name.
    committed = target.steps(committed=True)
    if not committed:
        raise UserError(
            f"no committed checkpoint in {target.tier.describe()}"
            + (f" for step {args.step}" if args.step is not None else "")
        )
    step = committed[-1]
    try:
        manifest = target.manifest(step)
    except ManifestError as exc:
        print(f"step-{step}: CORRUPT manifest.json: malformed ({exc})", file=sys.stderr)
        return 1
    if manifest is None:  # deleted since it was listed
        raise UserError(
            f"step-{step} of {target.tier.describe()} lost its manifest.json "
            "while being inspected; run the command again"
        )
    problems = target.problems(manifest, full=True)
    out: dict[str, Any] = {
        "location": target.describe(step),
        "step": step,
        "run_id": manifest.run_id,
        "config_hash": manifest.config_hash,
        "world_size": manifest.world_size,
        "torch_version": manifest.torch_version,
        "ftfleet_version": manifest.ftfleet_version,
        "created": _when(manifest.created_at),
        "bytes": manifest.total_bytes,
        "files": {n: {"size": e.size, "crc32c": e.crc32c} for n, e in sorted(manifest.every_file().items())},
        "verified": not problems,
        "problems": problems,
    }
    if args.tensors and not problems:
        out.update(_tensors(target, manifest))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            if key == "files":
                print("files:")
                for n, e in value.items():
                    print(f"  {n:<20} {_size(e['size']):>10}  crc32c {e['crc32c']}")
            elif key == "entries":
                print("entries:")
                for n, desc in value.items():
                    print(f"  {n}: {desc}")
            else:
                print(f"{key}: {value}")
    if problems:
        for p in problems:
            print(f"step-{step}: CORRUPT {p}", file=sys.stderr)
        return 1
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ftfleet.trainer.checkpoint.export import (
        HF_NAMES,
        SUFFIX,
        hf_config,
        model_weights,
        write_checkpoint,
        write_weights,
    )

    wanted = None if args.step == "latest" else _step_number(args.step)
    target = _Target(args.target, args.endpoint_url, None)
    if target.step_filter is not None:  # TARGET is a step directory
        wanted = target.step_filter if wanted is None else wanted
    every, committed = target.steps(), set(target.steps(committed=True))
    step = wanted if wanted is not None else max(committed, default=None)
    # A step directory without a manifest is being written, or debris: say so, never skip it silently.
    for s in every:
        if s not in committed and (step is None or s >= step):
            print(f"step-{s}: no manifest.json (uncommitted): skipped", file=sys.stderr)
    if step is None:
        raise UserError(f"no committed checkpoint in {target.tier.describe()}")
    if step not in committed:
        raise UserError(
            f"step-{step} of {target.tier.describe()} is not a committed checkpoint; "
            "pick one from `ftfleet ckpt list`, or latest"
        )
    manifest = target.manifest(step)
    if manifest is None:
        raise UserError(f"step-{step} lost its manifest.json while being exported; run the command again")
    with tempfile.TemporaryDirectory(prefix="ftfleet-export-") as tmp:
        step_dir = target.local_copy(manifest, Path(tmp))
        problems = verify_dir(step_dir, manifest)
        if problems:
            for p in problems:
                print(f"step-{step}: CORRUPT {p}", file=sys.stderr)
            return 1
        if args.fmt == "checkpoint":
            root = args.out or Path("export")
            copy = write_checkpoint(step_dir, manifest, root)
            where = root / step_dir_name(step)
            print(f"exported step-{step}: {len(copy.files)} files, {_size(copy.total_bytes)} -> {where}")
            return 0
        weights, config = model_weights(step_dir), hf_config(step_dir)
    out = args.out or Path(f"step-{step}{SUFFIX[args.fmt]}")
    meta = {"step": str(step), "run_id": manifest.run_id, "config_hash": manifest.config_hash}
    beside = write_weights(weights, out, args.fmt, meta, config)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"exported step-{step}: {len(weights)} tensors, {_size(size)} -> {out}")
    if beside is not None:
        print(f"and its Hugging Face config -> {beside} (from_pretrained reads the directory as {HF_NAMES[args.fmt]})")
    return 0


def _step_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise UserError(f"STEP {text!r}: use a step number or latest")
    return int(text)


def _tensors(target: _Target, manifest: Manifest) -> dict[str, Any]:
    """Load the checkpoint offline (tensors weights_only, metadata through an allowlist)
    and describe it. A bucket checkpoint is downloaded to a temporary directory."""
    from ftfleet.trainer.checkpoint.safe_load import load_offline
    from ftfleet.trainer.checkpoint.state import checkpoint_state, state_sha256

    with tempfile.TemporaryDirectory(prefix="ftfleet-inspect-") as tmp:
        state = load_offline(target.local_copy(manifest, Path(tmp)))
    app = state.get("app", state)
    entries = {}
    _describe(app, "", entries)
    return {
        "entries": entries,
        "progress": {k: int(v) for k, v in app.get("progress", {}).items()},
        "state_sha256": state_sha256(checkpoint_state(app)),
    }


def _describe(node: Any, prefix: str, out: dict[str, str]) -> None:
    import torch

    if isinstance(node, dict):
        for k, v in node.items():
            _describe(v, f"{prefix}{k}.", out)
    elif isinstance(node, torch.Tensor):
        out[prefix[:-1]] = f"{str(node.dtype).replace('torch.', '')}{list(node.shape)}"
    else:
        out[prefix[:-1]] = repr(node)[:60]


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _when(ts: float) -> str:
    """A manifest's time; one no calendar holds (a manifest says what it likes) as "?"."""
    try:
        return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, OSError):
        return "?"
