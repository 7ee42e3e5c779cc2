"""The durable tiers' retention schedule: which checkpoints each rule keeps, and a month
of hourly checkpoints pruned as the trainer prunes them, one upload at a time."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from ftfleet import retention as core
from ftfleet.errors import ConfigError
from ftfleet.trainer.checkpoint import retention
from ftfleet.trainer.checkpoint.manifest import Milestone
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
    milestone: Milestone | None = None


class StandInTier:
    """A durable tier as retention sees it: committed steps with their manifests' times,
    removal manifest first (a removal recorded as the manifest going, then the files)."""

    def __init__(self) -> None:
        self.created: dict[int, float] = {}
        self.uncommitted: set[int] = set()
        self.removed: list[int] = []
        self.unreadable: set[int] = set()
        self.milestones: dict[int, Milestone] = {}

    def commit(self, step: int, at: float, milestone: Milestone | None = None) -> None:
        self.created[step] = at
        if milestone is not None:
            self.milestones[step] = milestone

    def committed_steps(self) -> list[int]:
        return sorted(self.created)

    def all_steps(self) -> list[int]:
        return sorted(set(self.created) | self.uncommitted)

    def read_manifest(self, step: int) -> Dated | None:
        if step in self.unreadable:
            raise ValueError("malformed manifest")
        return Dated(self.created[step], self.milestones.get(step)) if step in self.created else None

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
    tier.unreadable.add(1)  # kept (undated); it could name no earlier step here
    tier.uncommitted |= {3000, 2}  # a crashed save older than the newest, one still being written
    tier.created.pop(2)
    prune_by_schedule(tier, parse_schedule(["all for 1h"]), pinned=[7], protected=[9])
    assert set(tier.committed_steps()) == {1, 7, 9, 48}
    assert 2 in tier.removed and 3000 not in tier.removed
    # A manifest that does not read may reference any earlier step: they all stay.
    tier = StandInTier()
    for day in range(5):
        tier.commit(day + 1, START + day * DAY)
    tier.unreadable.add(4)
    prune_by_schedule(tier, parse_schedule(["all for 1h"]))
    assert set(tier.committed_steps()) == {1, 2, 3, 4, 5}


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


def loss(value: float, keep: str = "best") -> Milestone:
    return Milestone("loss", "min", value, keep)


def test_the_best_milestone_of_each_metric_is_kept_and_marked_ones_as_marked():
    marks = {
        10: loss(3.0),
        20: loss(2.0),
        30: None,
        40: loss(2.0),  # a tie: the newer is the best
        50: Milestone("acc", "max", 0.5, "all"),
        60: Milestone("acc", "max", 0.7, "best"),
        70: loss(2.5, "all"),
    }
    assert retention.milestone_reasons(marks) == {
        40: "milestone (loss 2)",
        50: "milestone (acc 0.5)",
        60: "milestone (acc 0.7)",
        70: "milestone (loss 2.5)",
    }
    assert set(retention.milestone_reasons(marks, retention.BEST_ONLY)) == {40, 60}
    assert retention.milestone_reasons({}) == {}


def test_a_surpassed_milestone_goes_from_a_bucket_one_kept_for_good_does_not_and_the_best_outlives_the_schedule():
    tier, rules = StandInTier(), parse_schedule(["all for 1h"])
    tier.commit(100, START, loss(3.0))
    tier.commit(200, START + 1 * DAY, loss(2.0, "all"))
    tier.commit(300, START + 2 * DAY, loss(1.5))
    tier.commit(400, START + 3 * DAY, loss(1.8))  # saved as the best by a run that rolled back
    tier.commit(500, START + 4 * DAY)
    prune_by_schedule(tier, rules)
    assert tier.committed_steps() == [200, 300, 500]
    reasons = keep_reasons(
        {s: tier.created[s] for s in tier.created}, rules, milestones=retention.milestone_reasons(tier.milestones)
    )
    assert reasons == {200: "milestone (loss 2)", 300: "milestone (loss 1.5)", 500: "newest"}


def test_the_fast_tier_keeps_its_newest_and_the_best_milestone_and_all_as_marked_when_it_is_the_only_tier():
    tier = StandInTier()
    for step, value in ((1, 4.0), (2, 3.0), (3, 3.5), (4, None), (5, None), (6, None)):
        tier.commit(step, START + step, loss(value, "all") if value is not None else None)
    only = StandInTier()
    only.created, only.milestones = dict(tier.created), dict(tier.milestones)
    retention.prune(tier, 2, milestones=retention.BEST_ONLY)
    assert tier.committed_steps() == [2, 5, 6]
    retention.prune(only, 2, milestones=retention.AS_MARKED)
    assert only.committed_steps() == [1, 2, 3, 5, 6]


def test_random_milestone_histories_always_keep_the_best_of_each_metric():
    rng = random.Random(11)
    for _ in range(200):
        tier = StandInTier()
        steps = sorted(rng.sample(range(1, 5_000), rng.randint(1, 30)))
        for s in steps:
            mark = None
            if rng.random() < 0.5:
                metric, mode = rng.choice([("loss", "min"), ("acc", "max")])
                mark = Milestone(metric, mode, rng.choice([1.0, 2.0, 3.0]), rng.choice(["best", "all"]))
            tier.commit(s, START + rng.uniform(0, 60 * DAY), mark)
        marks = dict(tier.milestones)
        prune_by_schedule(tier, parse_schedule(rng.sample(["all for 2h", "1d for 7d"], rng.randint(0, 2))))
        kept = set(tier.committed_steps())
        for metric, mode in (("loss", "min"), ("acc", "max")):
            group = {s: m for s, m in marks.items() if m.metric == metric}
            if group:
                best = (min if mode == "min" else max)(m.value for m in group.values())
                assert max(s for s, m in group.items() if m.value == best) in kept
        assert {s for s, m in marks.items() if m.keep == "all"} <= kept


def test_a_policy_round_trips_and_a_bad_one_names_what_is_wrong():
    policy = core.Policy(("all for 1h", "1d for 7d"), (5, 3))
    assert core.Policy.from_json(policy.to_json()) == core.Policy(("all for 1h", "1d for 7d"), (3, 5))
    for bad, words in (
        ([], "not an object"),
        ({"rules": "all for 1h"}, "must be lists"),
        ({"rules": ["daily"]}, "'daily' is not a rule"),
        ({"rules": [], "pinned": [-1]}, "integers >= 0"),
        ({"rules": [], "pinned": [True]}, "integers >= 0"),
    ):
        with pytest.raises(ValueError, match=words):
            core.Policy.from_json(bad)


def test_what_a_sweep_reads_in_a_manifest_and_refuses():
    from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest

    m = Manifest(
        3, "r", "c", 1, {"a": FileEntry(1, "00000000")}, "t", created_at=START,
        milestone=Milestone("loss", "min", 1.0, "all"), retention=core.Policy(("all for 1h",), (2,)),
    )  # fmt: skip
    assert core.Recorded.parse(m.to_json()) == core.Recorded(START, m.milestone, m.retention)
    assert core.Recorded.parse(json.dumps({"created_at": 5})) == core.Recorded(5.0)
    for bad in ("{", "[]", json.dumps({"created_at": "x"}), json.dumps({"created_at": 1, "milestone": {"metric": 1}})):
        with pytest.raises(ValueError):
            core.Recorded.parse(bad)


def test_a_sweep_plan_applies_the_newest_recorded_policy_and_keeps_the_newest_complete_checkpoint():
    rec = core.Recorded
    recorded = {
        1: rec(START, policy=core.Policy(("all for 30d",))),
        2: rec(START + DAY),
        3: None,  # does not read
        4: rec(START + 2 * DAY, policy=core.Policy(("all for 1h",), (1,))),
        5: rec(START + 3 * DAY),  # newest; its files not all there yet
    }
    now = START + 3 * DAY
    plan = core.plan_sweep(recorded, complete={1, 2, 4}, uncommitted={0: 0.0, 9: 0.0}, now=now)
    assert plan.policy == core.Policy(("all for 1h",), (1,))
    # 3 does not read: it may reference 2 (and the debris at 0), which stay with it.
    assert plan.kept == {5: "newest", 1: "pinned", 3: "undated", 4: "newest", 2: core.BELOW_UNREADABLE}
    assert plan.delete == [] and plan.debris == []  # 9 is newer than the newest checkpoint
    readable = core.plan_sweep({**recorded, 3: rec(START + DAY)}, {1, 2, 3, 4}, {0: 0.0, 9: 0.0}, now=now)
    assert readable.delete == [2, 3] and readable.debris == [0]
    young = core.plan_sweep(recorded, {4}, {0: now - 60}, now=now)
    assert young.debris == []
    # A manifest dated a year ahead (a skewed clock) is kept as undated, and moves no window.
    ahead = {**recorded, 6: core.Recorded(START + 365 * DAY)}
    skewed = core.plan_sweep(ahead, {1, 2, 4, 6}, {}, now=now)
    assert skewed.kept[6] == "newest" and skewed.kept[5] == "all for 1h" and skewed.delete == [4]
    fallback = core.plan_sweep({1: rec(START), 2: rec(START + DAY)}, {1, 2}, {}, START, core.Policy(()))
    assert fallback.delete == [1] and fallback.policy == core.Policy(())


def test_ckpt_list_applies_the_schedule_and_pins_the_newest_manifest_records(tmp_path, capsys):
    from ftfleet.cli import main
    from ftfleet.trainer.checkpoint.manifest import Manifest, checksum_file

    policy = core.Policy(("all for 2h",), (10,))
    for step, at in ((10, START), (20, START + 2 * DAY), (30, START + 2 * DAY + HOUR)):
        d = tmp_path / f"step-{step}"
        d.mkdir()
        (d / "a.bin").write_bytes(b"x" * step)
        files = {"a.bin": checksum_file(d / "a.bin")}
        m = Manifest(step, "r", "c", 1, files, "t", created_at=at, retention=policy if step == 30 else None)
        (d / "manifest.json").write_text(m.to_json())
    assert main(["ckpt", "list", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["step"]: r["kept_by"] for r in rows} == {10: "pinned", 20: "all for 2h", 30: "newest"}
