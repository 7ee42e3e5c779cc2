import json
import subprocess
import sys

import pytest

from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource
from ftfleet.trainer.resilience.preemption.agreement import agree, decode, encode
from tests.trainer.resilience import dist_worker
from tests.trainer.resilience.helpers import REPO, subprocess_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def agreed(tmp_path_factory):
    """Run the scenarios on two gloo processes; {rank: {scenario: notice dict}}."""
    init_file = tmp_path_factory.mktemp("dist") / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests/trainer/resilience/dist_worker.py"), str(rank), "2", str(init_file)],
            cwd=REPO,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = {}
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results[rank] = json.loads(out.strip().splitlines()[-1])
    return results


def as_dict(notice):
    return {
        "kind": notice.kind.value,
        "source": notice.source.value,
        "received_at": notice.received_at,
        "deadline": notice.deadline,
        "terminal": notice.terminal,
    }


def test_every_rank_gets_the_same_answer_in_every_scenario(agreed):
    assert set(agreed[0]) == set(dist_worker.SCENARIOS)
    assert agreed[0] == agreed[1]


def test_no_notice_anywhere_agrees_on_none(agreed):
    assert agreed[0]["nothing"] is None


def test_a_notice_seen_by_one_rank_reaches_every_rank_intact(agreed):
    assert agreed[0]["one_rank_is_terminated"] == as_dict(dist_worker.SPOT)


def test_a_terminal_notice_beats_an_advisory_one_with_an_earlier_deadline(agreed):
    assert agreed[1]["terminal_beats_advisory"] == as_dict(dist_worker.SIGTERM)


def test_ranks_agree_on_the_earliest_deadline_and_the_first_receipt(agreed):
    got = agreed[0]["earliest_deadline"]
    assert got["deadline"] == dist_worker.SPOT_SOONER.deadline
    assert got["received_at"] == dist_worker.SPOT_LATER.received_at


def test_a_terminating_maintenance_on_one_rank_makes_the_agreed_one_terminal(agreed):
    assert agreed[1]["terminal_maintenance_wins"]["terminal"] is True
    assert agreed[1]["terminal_maintenance_wins"]["kind"] == "maintenance"


def test_an_advisory_notice_alone_stays_advisory(agreed):
    assert agreed[0]["advisory_only"] == as_dict(dist_worker.REBALANCE)


def test_without_a_process_group_the_local_notice_is_the_answer():
    n = Notice(NoticeKind.TERMINATION, NoticeSource.GCP_PREEMPTED, 10.0, 40.0, True)
    assert agree(n) == n
    assert agree(None) is None


def test_the_encoding_round_trips_every_kind_and_source():
    for kind in NoticeKind:
        for source in NoticeSource:
            terminal = kind is not NoticeKind.REBALANCE
            n = Notice(kind, source, 1_800_000_000.25, 1_800_000_030.5, terminal)
            assert decode(encode(n)) == n
