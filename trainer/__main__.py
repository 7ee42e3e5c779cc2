"""``torchrun [...] -m ftfleet.trainer --config FILE [key.sub=value ...]``

The config is required (``--config`` or ``FTFLEET_CONFIG``): a run without one would
train defaults into a directory nobody chose.

Exit codes are those of ftfleet.contract: 0 done, 2 bad config or environment (a
restart will not help), others as the stop request says. torchrun itself exits 1 after
any of them; ``ftfleet torchrun`` (same arguments) exits with the trainer's code.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ftfleet.contract import AGENT_STOP_EXITS, EXIT_CODES
from ftfleet.errors import ConfigError, UserError
from ftfleet.trainer.agent import first_on_node, stop_agent
from ftfleet.trainer.environment import LOG_FORMATS, TrainerEnvironment
from ftfleet.trainer.resilience.fencing import bind_to_launcher
from ftfleet.trainer.resilience.fencing.lease import LeaseError

#: Builds extra callbacks for the loop from the overrides it claims (returning the rest),
#: e.g. ``python -m drill.worker``'s injected faults. Runs inside the error handling, so
#: a bad value is one line and exit 2 like any other config error.
CallbackFactory = Callable[[list[str]], tuple[Sequence[Any], list[str]]]


def main(argv: list[str] | None = None, *, callbacks: CallbackFactory | None = None, prog: str = "") -> int:
    env = TrainerEnvironment()
    parser = argparse.ArgumentParser(prog=prog or "python -m ftfleet.trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=env.config_file, help="YAML config (default: $FTFLEET_CONFIG)")
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="json: one JSON object per line (default: $FTFLEET_LOG_FORMAT, else text)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print every config key as this run would have it (defaults included) as YAML, and exit",
    )
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value")
    args = parser.parse_args(argv)
    if args.log_format is None:
        try:
            args.log_format = env.log_format
        except ConfigError as exc:
            parser.error(str(exc))
    if args.print_config:
        return _print_config(args, callbacks)
    rank = int(os.environ.get("RANK", "0"))
    level = logging.INFO if rank == 0 else logging.WARNING
    if args.log_format == "json":
        from ftfleet.trainer.resilience.observability.metrics import configure_json_logging

        configure_json_logging(level, static={"rank": rank, "node": env.node_id})
    else:
        logging.basicConfig(level=level, stream=sys.stderr, format=f"%(asctime)s [rank{rank}] %(name)s: %(message)s")
    bind_to_launcher()  # a worker whose torchrun agent dies ends too (exit 78)
    code, agent_told = _run(args, rank, callbacks)
    if code in NOT_RESTARTABLE and not agent_told:
        # torchrun would restart the workers into the same failure (trainer/agent.py).
        stop_agent(code, EXIT_CODES[code])
    return code


def exit_quickly(code: int) -> NoReturn:
    """The end of a process that loaded torch: what the interpreter's shutdown does
    that a caller can rely on, in its order, then ``os._exit(code)``.

    1. ``threading._shutdown``: the exit hooks of ``concurrent.futures`` (a commit in
       flight on the manager's pool finishes), then the join of every non-daemon thread.
    2. The ``atexit`` handlers: ``logging.shutdown``, ``weakref.finalize`` (temporary
       directories), multiprocessing's reaping of its children.
    3. The flush of ``sys.stdout`` and ``sys.stderr``, and of the C library's streams
       (what C and C++ code printed).

    What is skipped is the teardown of the modules and the C++ static destructors. On
    that teardown gloo's worker threads (``pt_gloo_runloop``) killed the process: a
    thread that destroys a finished collective's work object needs the GIL to release
    its tensors, and a thread that asks for the GIL while the interpreter finalizes is
    ended with ``pthread_exit``, whose unwind through the C++ destructor calls
    ``std::terminate`` ("terminate called without an active exception"; the process
    dies of SIGABRT, at times of SIGSEGV), so that a trainer stopping with 77 could
    die with a signal instead, which an agent restarts (tests/trainer/test_config.py
    reproduces the crash).
    pytorch/pytorch#190489 is the same crash without ``destroy_process_group``, which a
    rank cannot always call before it exits: a peer may hold a collective open, and a
    failed run's process groups stay referenced from its traceback. The teardown's
    collector pass, a large part of a plain exit's time, is skipped too.
    Objects still alive get no ``__del__``, as Python allows at exit; the trainer's own
    files are closed or flushed line by line before this.

    Under a profiler, a tracer or a debugger (``python -m cProfile``, ``trace``, pdb)
    this is ``sys.exit(code)``: they write their reports on the way out, past this
    call."""
    if _observed():
        sys.exit(code)
    try:
        try:
            threading._shutdown()  # CPython's own first step (what sys.exit would run)
        except BaseException:  # noqa: BLE001 - e.g. ^C while a commit finishes: say so, keep the code
            traceback.print_exc()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said
                pass
        try:
            ctypes.CDLL(None).fflush(None)  # os._exit skips the C library's own flush
        except (OSError, AttributeError):
            pass
    finally:  # whatever interrupts the steps above, never the teardown
        os._exit(code)


def _observed() -> bool:
    """Whether a profiler, a tracer or a debugger watches this process: the legacy
    hooks, or (Python 3.12+, where cProfile uses it) a ``sys.monitoring`` tool."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))


#: Exit codes a restart of the workers on this node cannot fix. (A preempted node's 75
#: stops the agent only on that node: see Preemption.release_node.)
NOT_RESTARTABLE = AGENT_STOP_EXITS


def _run(args: argparse.Namespace, rank: int, callbacks: CallbackFactory | None) -> tuple[int, bool]:
    """The training program's exit code, and whether its torchrun agent was already told
    it (a bad config, which every local rank finds at once: :func:`first_on_node`)."""
    cfg = None
    try:
        if not args.config:
            raise ConfigError("no config: pass --config FILE (or set FTFLEET_CONFIG), e.g. trainer/configs/tiny.yaml")
        from ftfleet.trainer.config import load_config

        extra, overrides = callbacks(list(args.overrides)) if callbacks else ((), args.overrides)
        cfg = load_config(args.config, overrides)
        if cfg.train.huge_pages:  # before torch allocates anything (train() asks again)
            from ftfleet.trainer.hostmem import use_huge_pages

            use_huge_pages()
        from ftfleet.trainer.data.workers import start_for

        start_for(cfg)  # the loader workers' server imports torch while this process does
        from ftfleet.trainer.train import train  # torch is imported here, after the config is valid

        return int(train(cfg, extra)["exit_code"]), False
    except (ConfigError, LeaseError) as exc:  # bad input, or another region's run: nothing is written
        why = "bad configuration" if isinstance(exc, ConfigError) else "the run lease"
        if first_on_node(exc.exit_code, why):  # the same answer on every rank: one line a node
            print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code, True
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _failed_summary(cfg, rank, str(exc))
        return exc.exit_code, False
    except Exception as exc:
        traceback.print_exc()
        _failed_summary(cfg, rank, f"{type(exc).__name__}: {exc}")
        return 1, False


def _print_config(args: argparse.Namespace, callbacks: CallbackFactory | None) -> int:
    """``--print-config``: the effective config on stdout (no torch, no process group)."""
    try:
        if not args.config:
            raise ConfigError("no config: pass --config FILE (or set FTFLEET_CONFIG), e.g. trainer/configs/tiny.yaml")
        import yaml

        from ftfleet.trainer.config import load_config

        _, overrides = callbacks(list(args.overrides)) if callbacks else ((), args.overrides)
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write(yaml.safe_dump(cfg.effective(), sort_keys=False, default_flow_style=False))
    return 0


def _failed_summary(cfg, rank: int, error: str) -> None:
    """Best effort: a failed run still leaves a summary saying why (no state hash)."""
    if cfg is None or rank != 0:
        return
    try:
        run_dir = Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(
            json.dumps({"status": "failed", "error": error, "run_id": cfg.run_id, "state_sha256": None}, indent=1)
            + "\n"
        )
    except OSError:
        pass


if __name__ == "__main__":
    exit_quickly(main())
