"""Synthetic event logs in trainer/events.py's format, for the drill's tests."""

from __future__ import annotations


def ev(t, event, pid=100, attempt=0, **fields):
    return {"t": t, "event": event, "attempt": attempt, "pid": pid, **fields}


def life(pid, t0, *, attempt=0, restored=None, tier="local", first=1, last=30, dt=0.1):
    """start at t0, restore (or fresh) 0.5 s later, first step 1 s after t0, then a step
    every dt seconds up to ``last``."""
    out = [ev(t0, "start", pid, attempt, world_size=2)]
    if restored is None:
        out.append(ev(t0 + 0.5, "fresh", pid, attempt))
    else:
        out.append(
            ev(t0 + 0.5, "restored", pid, attempt, step=restored, tier=tier, source="/fast", world_size_written=2)
        )
    out.append(ev(t0 + 1.0, "first_step", pid, attempt, step=first))
    for i, step in enumerate(range(first + 1, last + 1), start=1):
        out.append(ev(t0 + 1.0 + i * dt, "step", pid, attempt, step=step, loss=1.0, seconds=dt))
    return out


def t_of(events, step, pid=100):
    return next(
        e["t"] for e in events if e["pid"] == pid and e.get("step") == step and e["event"] in ("step", "first_step")
    )


def restart_run():
    """A life killed after step 45 and the one torchrun restarted from step 40."""
    a = life(100, 0.0, last=45)  # step 45 at t=5.4
    b = life(101, 7.0, attempt=1, restored=40, first=41, last=60)
    return a + b
