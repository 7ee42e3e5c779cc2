"""``ftfleet torchrun [torchrun's arguments]``: torchrun that exits with the trainer's code.

Plain torchrun ends every failure the same way: exit 1 and a traceback of its own (a
``ChildFailedError`` table, or the ``SignalException`` of a SIGTERM it was sent), so
that a clean preemption (the trainer's 75) or a bad config (2, with one line naming the
fix) reads as a crash to whoever launched it. This is torchrun itself
(``torch.distributed.run``, the same arguments and behaviour), run in this process, that
instead exits with the code the training program left or exited with, as the image's
entrypoint does (``ftfleet.contract``: 0 done, 2 bad config, 75 preempted, 76 hung, 77
needs a human), and prints one line for a non-zero one (but 2: the trainer's error is
that line) instead of torchrun's traceback and its warnings:

* the code local rank 0 left in ``agent_exit_file`` (:mod:`ftfleet.trainer.agent`), when
  there is one: the trainer's word for the node (75 after a notice, 2, 77);
* else the exit code of the first rank that failed (128 + N for a signal N);
* else, torchrun itself stopped by signal N (its workers stopped with it): 128 + N.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

from ftfleet.contract import EXIT_CODES, EXIT_CONFIG, EXIT_OK, agent_exit_file

PROG = "ftfleet torchrun"

#: torchrun's loggers and the level they keep here: the ``OMP_NUM_THREADS`` banner,
#: "Received 15 death signal", "Sending process ... closing signal", and "failed
#: (exitcode: N)" say what the one line says.
QUIETED = {
    "torch.distributed.run": logging.ERROR,
    "torch.distributed.elastic.agent.server.api": logging.ERROR,
    "torch.distributed.elastic.multiprocessing.api": logging.CRITICAL,
}


def register(subparsers: Any) -> None:
    """For ``ftfleet --help`` only: ``ftfleet torchrun`` takes torchrun's own arguments,
    which ftfleet/cli.py hands to :func:`main` unparsed."""
    subparsers.add_parser(PROG.split()[1], help="torchrun, exiting with the trainer's code (0, 2, 75, 76, 77)")


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    parser = get_args_parser()
    parser.prog = PROG
    args = parser.parse_args(argv)
    for name, level in QUIETED.items():
        logging.getLogger(name).setLevel(level)
    exit_file = agent_exit_file(os.getpid())
    try:
        run(args)
        code, what = EXIT_OK, ""
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = failure.exitcode if failure.exitcode >= 0 else 128 - failure.exitcode
        what = f"rank {rank} exited {code}"
    except SignalException as exc:
        code = 128 + int(exc.sigval)
        what = f"stopped by {signal.Signals(exc.sigval).name}"
    left = _take(exit_file)
    if left is not None:
        code, what = left, f"the trainer left {left}"
    if code not in (EXIT_OK, EXIT_CONFIG):  # a bad config's one line is the trainer's
        meaning = EXIT_CODES.get(code, "failed: see the ranks' output above")
        print(f"{PROG}: exit {code}, {meaning} ({what})", file=sys.stderr)
    return code


def _take(path: str) -> int | None:
    """The code in ``path``, which is removed; None when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
        os.unlink(path)
    except OSError:
        return None
    return int(text) if text.isdigit() else None
