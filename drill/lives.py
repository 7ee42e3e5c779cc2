"""The run's event log (:mod:`ftfleet.trainer.events`) cut into **lives**: one worker group of
one torchrun attempt, seen through the events its rank 0 wrote (one ``pid``). A SIGKILL
or a hang ends a life and torchrun starts the next; a preempted node's replacement is
a new torchrun, hence a new life.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

#: The events that mark a finished training step.
STEP_EVENTS = ("first_step", "step")


@dataclasses.dataclass
class Life:
    """One worker group's life: the events of one rank-0 process."""

    pid: int
    attempt: int
    events: list[dict[str, Any]]

    @property
    def t_start(self) -> float:
        return self.events[0]["t"]

    @property
    def t_end(self) -> float:
        return self.events[-1]["t"]

    def first(self, name: str, after: float = -math.inf, **match: Any) -> dict[str, Any] | None:
        for e in self.events:
            if e["event"] == name and e["t"] >= after and all(e.get(k) == v for k, v in match.items()):
                return e
        return None

    @property
    def restored(self) -> dict[str, Any] | None:
        return self.first("restored")

    @property
    def resumed_from(self) -> int:
        """The step this life started from (0 when it started fresh)."""
        r = self.restored
        return int(r["step"]) if r else 0

    @property
    def first_step(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] in STEP_EVENTS), None)

    def progress(self, before: float = math.inf) -> tuple[int, float | None]:
        """(step, t) of the last step event before ``before``; the resumed-from step when
        there is none. After a rollback this is where the run is, not the furthest step."""
        last = None
        for e in self.events:
            if e["event"] in STEP_EVENTS and e["t"] <= before:
                last = e
        if last is None:
            return self.resumed_from, None
        return int(last["step"]), last["t"]

    def step_after(self, t: float, min_step: int = 0) -> dict[str, Any] | None:
        """The first step event after ``t`` whose step is at least ``min_step``."""
        return next(
            (e for e in self.events if e["event"] in STEP_EVENTS and e["t"] > t and int(e["step"]) >= min_step), None
        )

    @property
    def exit_code(self) -> int | None:
        e = self.first("exit")
        return None if e is None else int(e["code"])


def split_lives(events: Iterable[dict[str, Any]]) -> list[Life]:
    """Group events by the rank-0 process that wrote them, in order of appearance."""
    lives: list[Life] = []
    by_pid: dict[int, Life] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        pid = int(e.get("pid", 0))
        life = by_pid.get(pid)
        if life is None or e["event"] == "start" and life.first("start") is not None:
            life = Life(pid, int(e.get("attempt", 0)), [])
            by_pid[pid] = life
            lives.append(life)
        life.events.append(e)
    return lives


def life_at(lives: Sequence[Life], t: float) -> Life | None:
    """The life that was running at ``t``: the last one started at or before it."""
    running = [life for life in lives if life.t_start <= t]
    return running[-1] if running else None


def life_after(lives: Sequence[Life], t: float) -> Life | None:
    """The first life started after ``t``."""
    return next((life for life in lives if life.t_start > t), None)


def steady_step_time(events: Iterable[dict[str, Any]]) -> float | None:
    """Seconds per step of a run in steady state: the time between its first and last
    step event, over the steps in between, summed over its lives (start-up and restore
    excluded; periodic saves, skipped and rolled-back steps included)."""
    seconds, steps = 0.0, 0
    for life in split_lives(events):
        marks = [e for e in life.events if e["event"] in STEP_EVENTS]
        if len(marks) >= 2:
            seconds += marks[-1]["t"] - marks[0]["t"]
            steps += int(marks[-1]["step"]) - int(marks[0]["step"])
    return seconds / steps if steps > 0 and seconds > 0 else None
