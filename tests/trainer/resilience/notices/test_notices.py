import time

import pytest

from ftfleet.trainer.resilience.notices.notice import (
    AWS_TERMINATION_NOTICE_S,
    GCP_PREEMPTION_NOTICE_S,
    Notice,
    NoticeKind,
    NoticeSource,
    most_urgent,
)


def test_defaults_are_the_clouds_documented_notice_periods():
    assert AWS_TERMINATION_NOTICE_S == 120.0
    assert GCP_PREEMPTION_NOTICE_S == 30.0


def test_a_notice_gets_its_budget_when_the_cloud_names_no_moment():
    n = Notice.create(NoticeKind.TERMINATION, NoticeSource.GCP_PREEMPTED, 30.0, received_at=1000.0)
    assert (n.received_at, n.deadline, n.terminal) == (1000.0, 1030.0, True)
    assert n.remaining(now=1010.0) == 20.0


def test_the_moment_the_cloud_names_wins_when_it_is_earlier_than_the_budget():
    n = Notice.create(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, 120.0, received_at=1000.0, deadline=1090.0)
    assert n.deadline == 1090.0


def test_a_named_moment_later_than_the_budget_is_not_believed():
    n = Notice.create(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, 120.0, received_at=1000.0, deadline=5000.0)
    assert n.deadline == 1120.0


def test_a_named_moment_in_the_past_means_no_time_left():
    n = Notice.create(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, 120.0, received_at=1000.0, deadline=900.0)
    assert n.deadline == 1000.0 and n.remaining(now=1000.0) == 0.0


def test_a_rebalance_recommendation_is_never_terminal():
    n = Notice.create(NoticeKind.REBALANCE, NoticeSource.AWS_REBALANCE, 120.0, terminal=True)
    assert not n.terminal
    with pytest.raises(ValueError, match="cannot be terminal"):
        Notice(NoticeKind.REBALANCE, NoticeSource.AWS_REBALANCE, 0.0, 1.0, True)


def test_a_deadline_before_receipt_is_rejected():
    with pytest.raises(ValueError, match="before its received_at"):
        Notice(NoticeKind.SIGNAL, NoticeSource.SIGNAL, 10.0, 5.0, True)


def test_kind_values_are_the_commit_marker_reasons_and_a_resize():
    assert {k.value for k in NoticeKind if not Notice.create(k, NoticeSource.INJECTED, 1.0).node_stays} == {
        "termination",
        "rebalance",
        "maintenance",
        "signal",
    }
    assert Notice.create(NoticeKind.RESIZE, NoticeSource.ROUND, 1.0).node_stays  # it writes no marker


def test_terminal_notices_outrank_advisory_ones_even_with_a_later_deadline():
    advisory = Notice(NoticeKind.MAINTENANCE, NoticeSource.GCP_MAINTENANCE, 0.0, 10.0, False)
    terminal = Notice(NoticeKind.TERMINATION, NoticeSource.GCP_PREEMPTED, 0.0, 30.0, True)
    assert most_urgent([advisory, None, terminal]) is terminal


def test_among_terminal_notices_the_earliest_deadline_wins():
    aws = Notice(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, 0.0, 120.0, True)
    sig = Notice(NoticeKind.SIGNAL, NoticeSource.SIGNAL, 5.0, 35.0, True)
    assert most_urgent([aws, sig]) is sig
    assert most_urgent([None, None]) is None


def test_an_added_source_reports_through_the_same_watcher():
    """The seam for new notice sources (e.g. an autoscaling lifecycle poller): a thread
    built from the watcher's report callable, whose notices agreement treats like any
    other."""
    import threading

    from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher

    class OneShot(threading.Thread):
        def __init__(self, report, stop):
            super().__init__(daemon=True)
            self.report, self.stop_event = report, stop

        def run(self):
            self.report(Notice.create(NoticeKind.TERMINATION, NoticeSource.INJECTED, 90.0))

        def abort(self):
            pass

    watcher = NoticeWatcher("none", sources=[lambda report, clear, stop: OneShot(report, stop)])
    with watcher:
        deadline = time.monotonic() + 5
        while watcher.pending() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        notice = watcher.pending()
    assert notice is not None and (notice.kind, notice.source, notice.terminal) == (
        NoticeKind.TERMINATION,
        NoticeSource.INJECTED,
        True,
    )
