"""``python -m ftfleet.trainer.inprocess --worker drill.inprocess_worker ...``: the
in-process-restartable worker with the faults named by ``faults.*`` injected
(:mod:`drill.inject`), as ``drill.worker`` is for torchrun."""

from __future__ import annotations

from ftfleet.trainer.__main__ import exit_quickly
from ftfleet.trainer.inprocess.worker import main as worker_main


def main(argv: list[str] | None = None) -> int:
    from drill.inject import callbacks_from

    return worker_main(argv, callbacks=callbacks_from)


if __name__ == "__main__":
    exit_quickly(main())
