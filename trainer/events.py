"""The run's event log: ``<run_dir>/events.jsonl``, one JSON object per line, appended
by rank 0 of every attempt (a restarted or resumed run appends to the same file).

It is how a drill, a benchmark or an operator reconstructs what happened without
parsing log text. Every line has ``t`` (epoch seconds), ``event``, ``attempt``
(TORCHELASTIC_RESTART_COUNT), ``pid`` and the fields below:

| event | fields | when |
| --- | --- | --- |
| ``start`` | world_size, pids | the process group is up, before restore (pids: every rank's process) |
| ``restored`` | step, tier, source, world_size_written, seconds | a checkpoint was loaded (or a snapshot) |
| ``fresh`` | | no checkpoint: step 0 |
| ``first_step`` | step | the first step after start (or restore) finished |
| ``step`` | step, loss, seconds, saving, snapshotting | each step (``train.step_events``); a save, snapshot in flight |
| ``notice`` | kind, source, received_at, deadline, terminal, step | ranks agreed on a notice |
| ``save`` | step, reason, blocking, mode | a save began (reason: interval, notice, ...; mode: async or sync) |
| ``snapshot`` | step, blocked_s | an in-memory snapshot was taken (``checkpoint.memory``): the state is copied |
| ``snapshotted`` | step, background_s, slowdown_s, counted | its copy is done (slowdown_s: lost; counted: a sample) |
| ``committed`` | step, reason, blocked_s, commit_s, deadline, within_deadline | its manifest landed |
| ``interval`` | steps, why, cost_s | the adaptive interval chose the next save (cost_s: C) |
| ``anomaly`` | step, action, reason | a step was skipped or rolled back |
| ``rollback`` | from_step, to_step | the state was reloaded from a checkpoint |
| ``marker`` | step, reason, path, uploaded | the commit marker was written |
| ``exit`` | code, reason, step | the run ends normally or after a notice |
| ``agent_stopped`` | pid | the preempted node stopped its torchrun agent (no restart) |
| ``fenced`` | why, launcher_pid or refused, generation | the process left its run, exit 78 (refused: its last commit) |

A process killed by a signal or by the hang watchdog writes no ``exit`` line: its
absence, with the process's exit status, is the record.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILENAME = "events.jsonl"


class EventLog:
    """Appends events; a no-op on ranks other than 0 (``enabled=False``)."""

    def __init__(self, run_dir: str | os.PathLike[str], enabled: bool = True) -> None:
        self.path = Path(run_dir) / FILENAME
        self.enabled = enabled
        self._attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self._file = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    def emit(self, event: str, every_rank: bool = False, **fields: Any) -> None:
        """Append one event. ``every_rank``: on a rank whose log is off too, for what the
        first rank to see it must say before the others are stopped (one ``O_APPEND``
        write of the whole line, which does not interleave with rank 0's lines)."""
        if self._file is None and not (every_rank and self.path.parent.is_dir()):
            return
        record = {"t": round(time.time(), 4), "event": event, "attempt": self._attempt, "pid": os.getpid(), **fields}
        line = json.dumps(record, default=str) + "\n"
        if self._file is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
            return
        # One write per line, flushed: a killed process leaves whole lines behind.
        self._file.write(line)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The events so far; a torn last line (a process killed mid-write) is skipped."""
    path = Path(run_dir) / FILENAME
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue
