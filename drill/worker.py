"""``torchrun [...] -m drill.worker --config FILE [key.sub=value ...] [faults.key=value ...]``

The reference trainer (``python -m ftfleet.trainer``, same arguments, same exit codes)
with the faults named by ``faults.*`` injected through its callbacks
(:mod:`drill.inject`). What the drill and the fault-injection tests run.
"""

from __future__ import annotations

from ftfleet.trainer.__main__ import exit_quickly
from ftfleet.trainer.__main__ import main as trainer_main


def main(argv: list[str] | None = None) -> int:
    from drill.inject import callbacks_from

    return trainer_main(argv, callbacks=callbacks_from, prog="python -m drill.worker")


if __name__ == "__main__":
    exit_quickly(main())
