"""Which samples a run's final state was trained on, from its sample trace
(``data.trace_samples``: one file per process, ``samples/rank<r>-pid<p>.txt``, a line
``step first last`` per step it trained) and its event log, and whether that is every
sample once, in order.

A run restarted in place, in new rounds or at another world size traces steps that a
later attempt rolled back. Each attempt (a ``start`` event, resumed from the step its
``restored`` event names, or 0 when ``fresh``) keeps what it trained up to the step the
next attempt resumed from. A process's file holds its attempts in order, each one a
segment that starts at a step not above the one before it; a segment is matched to the
first attempt after the previous segment's that resumed where it starts.
"""

from __future__ import annotations

from pathlib import Path

from ftfleet.trainer.events import read_events

Trace = dict[int, list[tuple[int, int]]]


def final_trace(run_dir: Path) -> Trace:
    """step -> the ``(first, last)`` samples each rank trained it on, for the steps
    behind the final state."""
    resumes: list[int] = []
    for event in read_events(run_dir):
        if event["event"] == "restored":
            resumes.append(int(event["step"]))
        elif event["event"] == "fresh":
            resumes.append(0)
    out: Trace = {}
    for path in sorted((run_dir / "samples").glob("*.txt")):
        lines = [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line.strip()]
        segments: list[list[tuple[int, ...]]] = []
        for line in lines:
            if not segments or line[0] <= segments[-1][-1][0]:
                segments.append([])
            segments[-1].append(line)
        attempt = -1
        for segment in segments:
            first = segment[0][0]
            attempt = next((k for k in range(attempt + 1, len(resumes)) if resumes[k] == first - 1), -2)
            if attempt == -2:
                raise ValueError(f"{path.name}: steps from {first} follow no attempt that resumed from {first - 1}")
            cut = resumes[attempt + 1] if attempt + 1 < len(resumes) else None
            for step, lo, hi in segment:
                if cut is None or step <= cut:
                    out.setdefault(step, []).append((lo, hi))
    return out


def each_sample_once(trace: Trace, steps: int, batch: int) -> str | None:
    """None when steps 1..``steps`` each consumed the next ``batch`` samples, every
    sample once and in order; else what is wrong, in one line."""
    for step in range(1, steps + 1):
        if step not in trace:
            return f"no rank trained step {step}"
        ids = sorted(i for first, last in trace[step] for i in range(first, last + 1))
        if ids != list(range((step - 1) * batch, step * batch)):
            return f"step {step} consumed samples {ids}"
    extra = sorted(set(trace) - set(range(1, steps + 1)))
    return f"extra steps traced: {extra}" if extra else None
