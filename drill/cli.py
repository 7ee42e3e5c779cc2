"""``python -m drill``: the trainer under fire, locally, with no cloud account.

It runs the reference trainer under torchrun with a local fast tier, an S3 server on
127.0.0.1 (moto) holding a primary and a replica bucket, and a fake instance metadata
service; first uninterrupted, then again while it injects, in turn: a spot
interruption notice, a rebalance recommendation, a SIGKILL of one worker, a corrupted
newest checkpoint, a NaN batch, a hang, and the loss of the primary bucket. It prints,
for each fault, the time to detect, the work lost and the time to resume, then the
goodput and whether the final state_sha256 equals the uninterrupted run's. Exit 0 when
every recovery succeeded, 1 otherwise (with a one-line reason).

With ``--cloud gcp`` the cloud is GCP's: a GCS emulator holds the one dual-region
bucket, the notices are a preemption (``instance/preempted``) and a live-migration
maintenance event, and the lost location takes the node and its zonal fast tier (the
restore reads the bucket).

``--faults capacity_loss`` (alone) plays a spot region running out of capacity
instead: the standby's capacity watch function moves the run to the standby region by
itself (drill/capacity.py; with ``--cloud gcp``, drill/capacity_gcp.py). Exit 0 when the run completes there with the
reference's state and its first step came within 180 s of the failover decision.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from ftfleet.errors import UserError

EPILOG = """\
examples:
  python -m drill                                # every fault, ~3 minutes on 2 cores
  python -m drill --faults notice,sigkill        # a short drill
  python -m drill --cloud gcp                    # GCP: preemption, maintenance, GCS emulator
  python -m drill --json drill.json --markdown drill.md --workdir /tmp/drill
  python -m drill --nodes 3 --spares 1           # the fleet drill: 3 simulated nodes and a spare node
  python -m drill --faults capacity_loss         # the home region loses its spot capacity: failover, ~1 minute
"""


def add_overrides_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE`` (repeatable): trainer overrides, collected in ``overrides``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from drill.scenario import FAULTS

    parser.add_argument(
        "--faults",
        default="all",
        metavar="LIST",
        help=f"all, or a comma-separated subset of: {', '.join(FAULTS)} (always injected in that order); "
        "or capacity_loss alone: the home region runs out of spot capacity and the run moves to its standby",
    )
    parser.add_argument(
        "--cloud",
        choices=("aws", "gcp"),
        default="aws",
        help="aws: moto S3 (primary + replica bucket) and IMDSv2; gcp: a GCS emulator (one dual-region "
        "bucket) and the GCP metadata server: preemption, maintenance event, loss of a location (default aws)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the runs, logs and checkpoints here (default: a temporary directory, deleted afterwards)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the report as JSON")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write the report as a Markdown table")
    parser.add_argument("--nproc", type=int, default=2, help="processes per node (default 2)")
    parser.add_argument(
        "--spacing",
        type=int,
        default=None,
        metavar="STEPS",
        help="steps between two faults, and after the last (default 20; capacity_loss: 40)",
    )
    parser.add_argument(
        "--first-step", type=int, default=20, metavar="STEP", help="step of the first fault (default 20)"
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.05,
        metavar="S",
        help="seconds added to every step, pacing the tiny model like a real "
        "one (default 0.05; does not change the trajectory)",
    )
    parser.add_argument(
        "--nan-policy",
        choices=("skip", "rollback"),
        default="rollback",
        help="what the trainer does with the NaN batch (default rollback)",
    )
    parser.add_argument(
        "--interval",
        default=None,
        metavar="adaptive|STEPS",
        help="checkpoint interval: adaptive (Daly, capped at half the "
        "spacing) or a fixed number of steps (default adaptive; capacity_loss: 5 steps, fixed)",
    )
    parser.add_argument(
        "--capacity-loss-s",
        type=float,
        default=10.0,
        metavar="S",
        help="capacity_loss: how long the home's workers are short for want of capacity before the standby's "
        "capacity_watch moves the run (a deployment's capacityLossMinutes; default 10)",
    )
    parser.add_argument(
        "--watchdog", type=float, default=5.0, metavar="S", help="hang watchdog timeout of the faulted run (default 5)"
    )
    parser.add_argument(
        "--node-timeout", type=float, default=180.0, metavar="S", help="give up on a node after this long (default 180)"
    )
    parser.add_argument(
        "--launcher",
        choices=("torchrun", "inprocess"),
        default="torchrun",
        help="torchrun: a failed worker restarts the whole group; inprocess: the survivors restart in place, "
        "a warm spare takes a dead rank's place, state from the in-memory snapshots (default torchrun)",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=1,
        metavar="N",
        help="inprocess: warm spare processes per node; with --nodes: spare nodes (default 1)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="the fleet drill instead: an in-process job across N simulated nodes (network namespaces) and "
        "--spares spare nodes, one run per fault of: lose-node, sigkill, notice, partition, slow-link, "
        "shrink-grow (drill/fleet.py)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="R",
        help="with --nodes: HSDP's replica groups (parallel.replicas; must divide --nodes): at 2 or more a lost "
        "rank heals from its live replica's snapshot and no peer copies are sent (default 1)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=None,
        metavar="S",
        help="inprocess and --nodes: seconds a collective waits for a hung peer before the survivors restart "
        "(default 1; with --nodes 2: ten and twenty times the drill's step; the slowest collective of a real job "
        "sets it)",
    )
    parser.add_argument("--config", type=Path, help="trainer config (default: the package's tiny.yaml)")
    add_overrides_option(parser, "extra trainer override, repeatable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def options(args: argparse.Namespace, workdir: Path) -> Any:
    from drill.run import DEFAULT_CONFIG, DrillOptions
    from drill.scenario import build_plan, parse_faults

    interval = (args.interval or "adaptive").strip().lower()
    if interval != "adaptive" and not (interval.isdigit() and int(interval) > 0):
        raise UserError(f"--interval {args.interval}: use adaptive or a positive number of steps")
    if args.nproc < 1:
        raise UserError(f"--nproc {args.nproc}: use 1 or more")
    if args.spares < 0:
        raise UserError(f"--spares {args.spares}: use 0 or more")
    if args.collective_timeout is None:
        args.collective_timeout = 1.0
    if args.launcher == "inprocess" and not args.collective_timeout < args.watchdog:
        raise UserError(
            f"--collective-timeout {args.collective_timeout}: use less than --watchdog {args.watchdog} "
            "(the watchdog ends a process; the failed collective restarts it in place)"
        )
    spacing = 20 if args.spacing is None else args.spacing
    faults = parse_faults(args.faults)
    if "sigkill" in faults and args.nproc < 2:
        raise UserError("--faults sigkill needs --nproc 2 or more (one worker dies, one survives)")
    build_plan(faults, first_step=args.first_step, spacing=spacing)  # raises on a bad plan
    return DrillOptions(
        faults=faults,
        workdir=workdir,
        cloud=args.cloud,
        nproc=args.nproc,
        first_step=args.first_step,
        spacing=spacing,
        step_delay_s=args.step_delay,
        nan_policy=args.nan_policy,
        interval=interval,
        watchdog_s=args.watchdog,
        node_timeout_s=args.node_timeout,
        launcher=args.launcher,
        spares=args.spares,
        collective_timeout_s=args.collective_timeout,
        config=args.config or DEFAULT_CONFIG,
        overrides=list(args.overrides),
    )


def run_fleet(args: argparse.Namespace) -> int:
    from drill.fleet import FLEET_FAULTS, FleetOptions, render, run_fleet_drill

    if args.nodes < 2 or args.spares < 0:
        raise UserError(f"--nodes {args.nodes} --spares {args.spares}: use 2 or more nodes and 0 or more spare nodes")
    faults = list(FLEET_FAULTS) if args.faults == "all" else [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FLEET_FAULTS]
    if unknown or not faults:
        raise UserError(f"--faults {args.faults}: with --nodes use all or some of {', '.join(FLEET_FAULTS)}")
    if args.replicas < 1 or args.nodes % args.replicas:
        raise UserError(f"--replicas {args.replicas}: use a divisor of --nodes {args.nodes} (1: no replicas)")
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ftfleet-fleet-drill-")
        workdir = Path(tmp.name)
    else:
        workdir = args.workdir.resolve()
    opts = FleetOptions(
        nodes=args.nodes,
        spare_nodes=args.spares,
        replicas=args.replicas,
        faults=faults,
        workdir=workdir,
        **({} if args.collective_timeout is None else {"collective_timeout_s": args.collective_timeout}),
        step_delay_s=args.step_delay,
        config=args.config or FleetOptions.__dataclass_fields__["config"].default,
        overrides=list(args.overrides),
    )
    try:
        rows, want = run_fleet_drill(opts)
    finally:
        if tmp is not None:
            tmp.cleanup()
    table = render(rows, opts)
    print(table)
    if args.json:
        import dataclasses
        import json

        record = {
            "options": {
                "nodes": opts.nodes,
                "spare_nodes": opts.spare_nodes,
                "replicas": opts.replicas,
                "collective_timeout_s": opts.collective_timeout_s,
                "steps": opts.steps,
            }
        }
        record["reference_state_sha256"] = want
        record["rows"] = [dataclasses.asdict(r) for r in rows]
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table + "\n")
    failed = [r for r in rows if not r.ok]
    if failed:
        print(f"drill failed: {', '.join(r.fault for r in failed)}", file=sys.stderr)
        return 1
    return 0


def capacity_options(args: argparse.Namespace) -> Any:
    """The capacity_loss drill's options; raises UserError naming the fix."""
    from drill.capacity import FAULT, CapacityOptions
    from drill.run import DEFAULT_CONFIG

    if [f.strip().replace("-", "_") for f in args.faults.split(",") if f.strip()] != [FAULT]:
        raise UserError(f"--faults {args.faults}: {FAULT} runs alone; drill the other faults in a run of their own")
    if args.launcher != "torchrun":
        raise UserError(f"--launcher {args.launcher}: {FAULT} runs its nodes under torchrun; leave --launcher out")
    if args.nproc < 1:
        raise UserError(f"--nproc {args.nproc}: use 1 or more")
    spacing = 40 if args.spacing is None else args.spacing
    if args.first_step < 2 or spacing < 2:
        raise UserError(
            f"--first-step {args.first_step} --spacing {spacing}: use 2 or more for each (a checkpoint before "
            "the loss, steps for the standby after it)"
        )
    interval = (args.interval or "5").strip()
    if not (interval.isdigit() and int(interval) > 0):
        raise UserError(f"--interval {args.interval}: {FAULT} takes a fixed number of steps (default 5)")
    if not args.capacity_loss_s > 0:
        raise UserError(f"--capacity-loss-s {args.capacity_loss_s:g}: use seconds > 0")
    return CapacityOptions(
        workdir=Path(),
        cloud=args.cloud,
        nproc=args.nproc,
        loss_step=args.first_step,
        steps=args.first_step + spacing,
        step_delay_s=args.step_delay,
        interval_steps=int(interval),
        loss_s=args.capacity_loss_s,
        watchdog_s=args.watchdog,
        node_timeout_s=args.node_timeout,
        config=args.config or DEFAULT_CONFIG,
        overrides=list(args.overrides),
    )


def run_capacity(args: argparse.Namespace) -> int:
    from drill.capacity import run_capacity_drill
    from drill.run import DrillError

    opts = capacity_options(args)  # validate before anything is created
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ftfleet-capacity-drill-")
        opts.workdir = Path(tmp.name)
    else:
        opts.workdir = args.workdir.resolve()
        opts.workdir.mkdir(parents=True, exist_ok=True)
    try:
        report = run_capacity_drill(opts, say=lambda line: print(line, file=sys.stderr, flush=True))
    except DrillError as exc:
        raise UserError(f"drill aborted: {exc}") from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    return emit(report, args)


def emit(report: Any, args: argparse.Namespace) -> int:
    """Print ``report`` (a drill report: ``to_text``, ``dumps``, ``to_markdown``, ``ok``,
    ``reason``), write its JSON and Markdown where asked; the exit status."""
    print(report.to_text(), end="")
    if args.json:
        args.json.write_text(report.dumps())
    if args.markdown:
        args.markdown.write_text(report.to_markdown())
    if not report.ok:
        print(f"drill failed: {report.reason}", file=sys.stderr)
        return 1
    return 0


def is_capacity_drill(faults: str) -> bool:
    return "capacity_loss" in {f.strip().replace("-", "_") for f in faults.split(",")}


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.collective_timeout is not None and not args.collective_timeout > 0:
        raise UserError(f"--collective-timeout {args.collective_timeout}: use seconds > 0")
    if args.nodes is not None:
        return run_fleet(args)
    if args.replicas != 1:
        raise UserError(f"--replicas {args.replicas}: replica groups are the fleet drill's; add --nodes N")
    if is_capacity_drill(args.faults):
        return run_capacity(args)

    from drill.run import DrillError, run_drill

    opts = options(args, Path())  # validate before anything is created
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ftfleet-drill-")
        opts.workdir = Path(tmp.name)
    else:
        opts.workdir = args.workdir.resolve()
        opts.workdir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(
        total=0,
        unit="step",
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=True if args.no_progress else None,
        bar_format="{desc}: step {n}/{total} {bar} {elapsed}",
    )

    def say(line: str) -> None:
        tqdm.write(line, file=sys.stderr)

    try:
        report = run_drill(opts, say=say, bar=bar)
    except DrillError as exc:
        raise UserError(f"drill aborted: {exc}") from None
    finally:
        bar.close()
        if tmp is not None:
            tmp.cleanup()
    return emit(report, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m drill",
        description=__doc__.split("\n\n")[1],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
