"""The durable tiers' retention schedule: which checkpoints each rule keeps, and a month
of hourly checkpoints pruned as the trainer prunes them, one upload at a time."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from ftfleet.errors import ConfigError
from ftfleet.trainer.checkpoint import retention
from ftfleet.trainer.checkpoint.retention import (
    DEFAULT_SCHEDULE,
    keep_reasons,
    parse_rule,
    parse_schedule,
    prune_by_schedule,
)

HOUR, DAY, WEEK = 3600.0, 86400.0, 7 * 86400.0
#: A Monday 00:00 UTC well after the epoch, so slots are easy to reason about.
START = 1_767_571_200.0


@dataclasses.dataclass
class Dated:
    created_at: float


class StandInTier:
    """A durable tier as retention sees it: committed steps with their manifests' times,
    removal manifest first (a removal recorded as the manifest going, then the files)."""

    def __init__(self) -> None:
        self.created: dict[int, float] = {}
        self.uncommitted: set[int] = set()
        self.removed: list[int] = []
        self.unreadable: set[int] = set()

    def commit(self, step: int, at: float) -> None:
        self.created[step] = at

    def committed_steps(self) -> list[int]:
        return sorted(self.created)

    def all_steps(self) -> list[int]:
        return sorted(set(self.created) | self.uncommitted)

    def read_manifest(self, step: int) -> Dated | None:
        if step in self.unreadable:
            raise ValueError("malformed manifest")
        return Dated(self.created[step]) if step in self.created else None

    def remove_step(self, step: int) -> None:
        self.created.pop(step, None)
        self.uncommitted.discard(step)
        self.removed.append(step)

    def describe(self) -> str:
        return "stand-in bucket"


def test_rules_parse_and_a_bad_one_is_one_line_naming_the_fix():
    assert parse_rule("all for 6h") == retention.Rule("all for 6h", None, 6 * HOUR)
    assert parse_rule(" 1d  for 7d ") == retention.Rule("1d for 7d", DAY, 7 * DAY)
    assert [r.every_s for r in parse_schedule(DEFAULT_SCHEDULE)] == [None, DAY, WEEK]
    for bad in ("daily for 7d", "1d for", "all for 0h", "1x for 2d", ""):
        with pytest.raises(ConfigError) as exc:
            parse_schedule(["all for 6h", bad])
        assert str(exc.value).startswith("checkpoint.retention[1]: ") and "\n" not in str(exc.value)


def test_the_newest_pinned_and_undated_checkpoints_are_kept_beyond_every_rule():
    created = {10: START, 20: START + 10 * DAY, 30: None, 40: START + 20 * DAY}
    reasons = keep_reasons(created, parse_schedule(["all for 1h"]), pinned=[10])
    assert reasons == {40: "newest", 10: "pinned", 30: "undated"}


def test_each_slot_keeps_its_newest_checkpoint_inside_the_window():
    created = {1: START + 1 * HOUR, 2: START + 23 * HOUR, 3: START + DAY + 2 * HOUR, 4: START + DAY + 5 * HOUR}
    assert keep_reasons(created, parse_schedule(["1d for 7d"])) == {4: "newest", 2: "1d for 7d"}
    # A window of 5 hours from the newest (day 1, 05:00) no longer reaches day 0.
    assert keep_reasons(created, parse_schedule(["1d for 5h"])) == {4: "newest"}


def expected_month_end(times: dict[int, float]) -> set[int]:
    """The default schedule's set, worked out independently: the last 6 h, the newest of
    each UTC day in the last 7 days, the newest of each epoch week in the last 13 weeks."""
    end = max(times.values())
    keep = {s for s, t in times.items() if t > end - 6 * HOUR}
    for period, window in ((DAY, 7 * DAY), (WEEK, 13 * WEEK)):
        slots: dict[int, int] = {}
        for s, t in times.items():
            if t > end - window:
                slot = math.floor(t / period)
                if slot not in slots or t > times[slots[slot]]:
                    slots[slot] = s
        keep |= set(slots.values())
    return keep | {max(times)}


def test_a_month_of_hourly_checkpoints_pruned_after_each_upload_keeps_exactly_the_schedules_set():
    tier, rules = StandInTier(), parse_schedule(DEFAULT_SCHEDULE)
    times = {}
    for hour in range(31 * 24):
        step = (hour + 1) * 100
        times[step] = START + hour * HOUR
        tier.commit(step, times[step])
        prune_by_schedule(tier, rules, protected=[step])
    kept = set(tier.committed_steps())
    assert kept == expected_month_end(times)
    # 6 of the last hours (+ the day and week slots they also hold), 7 days, ~5 weeks.
    assert 6 + 6 + 3 <= len(kept) <= 6 + 7 + 6
    assert len(tier.removed) == len(set(tier.removed)) == len(times) - len(kept)


def test_a_run_that_stopped_long_ago_keeps_its_last_weeks_windows_end_at_its_newest_checkpoint():
    tier = StandInTier()
    for hour in range(10 * 24):
        tier.commit(hour + 1, START + hour * HOUR)
    rules = parse_schedule(DEFAULT_SCHEDULE)
    prune_by_schedule(tier, rules)
    first = set(tier.committed_steps())
    prune_by_schedule(tier, rules)  # swept again, a year later: nothing more goes
    assert set(tier.committed_steps()) == first and len(first) > 7


def test_pinned_protected_and_undatable_checkpoints_survive_and_debris_goes():
    tier = StandInTier()
    for hour in range(48):
        tier.commit(hour + 1, START + hour * HOUR * 30)
    tier.unreadable.add(5)
    tier.uncommitted |= {3000, 2}  # a crashed save older than the newest, one still being written
    tier.created.pop(2)
    prune_by_schedule(tier, parse_schedule(["all for 1h"]), pinned=[7], protected=[9])
    assert set(tier.committed_steps()) == {5, 7, 9, 48}
    assert 2 in tier.removed and 3000 not in tier.removed


def test_a_failing_listing_deletes_nothing_and_does_not_raise(caplog):
    class Broken(StandInTier):
        def committed_steps(self) -> list[int]:
            raise OSError("503 Slow Down")

    tier = Broken()
    tier.commit(1, START)
    assert prune_by_schedule(tier, parse_schedule(DEFAULT_SCHEDULE)) == []
    assert "cannot list" in caplog.text


def test_random_schedules_never_delete_the_newest_or_a_pinned_step():
    rng = random.Random(7)
    for _ in range(200):
        tier = StandInTier()
        steps = sorted(rng.sample(range(1, 10_000), rng.randint(1, 40)))
        for s in steps:
            tier.commit(s, START + rng.uniform(0, 60 * DAY))
        pinned = rng.sample(steps, min(len(steps), rng.randint(0, 3)))
        rules = parse_schedule(rng.sample(["all for 2h", "1h for 1d", "1d for 7d", "1w for 4w"], rng.randint(0, 4)))
        prune_by_schedule(tier, rules, pinned=pinned)
        kept = set(tier.committed_steps())
        assert max(steps) in kept and set(pinned) <= kept


def test_ckpt_list_names_the_rule_that_keeps_each_checkpoint(tmp_path, capsys):
    from ftfleet.cli import main
    from ftfleet.trainer.checkpoint.manifest import Manifest, checksum_file

    for step, at in ((10, START), (20, START + 2 * DAY), (30, START + 2 * DAY + HOUR)):
        d = tmp_path / f"step-{step}"
        d.mkdir()
        (d / "a.bin").write_bytes(b"x" * step)
        files = {"a.bin": checksum_file(d / "a.bin")}
        (d / "manifest.json").write_text(Manifest(step, "r", "c", 1, files, "t", created_at=at).to_json())
    assert main(["ckpt", "list", str(tmp_path), "--json", "--retention", "all for 2h"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["step"]: r["kept_by"] for r in rows} == {10: None, 20: "all for 2h", 30: "newest"}
    assert main(["ckpt", "list", str(tmp_path), "--retention", "daily"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --retention[0]: 'daily' is not a rule")
