"""The run's event log (trainer/events.py): rank 0's, and the one line another rank may add."""

from __future__ import annotations

from ftfleet.trainer.events import EventLog, read_events


def test_only_rank_0_writes_unless_every_rank_must_be_heard(tmp_path):
    rank0, rank1 = EventLog(tmp_path), EventLog(tmp_path, enabled=False)
    rank0.emit("step", step=1)
    rank1.emit("step", step=1)  # off on rank 1
    rank1.emit("fenced", every_rank=True, generation=3)  # the first rank out says it
    rank0.emit("step", step=2)
    rank0.close()
    assert [(e["event"], e.get("step", e.get("generation"))) for e in read_events(tmp_path)] == [
        ("step", 1),
        ("fenced", 3),
        ("step", 2),
    ]
    EventLog(tmp_path / "gone", enabled=False).emit("fenced", every_rank=True)  # no run directory: nothing
    assert not (tmp_path / "gone").exists()
