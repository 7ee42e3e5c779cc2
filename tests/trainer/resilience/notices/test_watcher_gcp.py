import threading
import time
import urllib.error
import urllib.request

import pytest

from ftfleet.trainer.resilience.notices.notice import NoticeKind, NoticeSource
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher
from tests.trainer.resilience.helpers import wait_for

PREEMPTED = "/computeMetadata/v1/instance/preempted"
MAINTENANCE = "/computeMetadata/v1/instance/maintenance-event"


def _get(url, headers=None, timeout=10):
    request = urllib.request.Request(url, headers=headers or {"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode(), response.headers["ETag"]


@pytest.fixture
def gcp_watcher(fake_metadata, fast_config):
    watcher = NoticeWatcher("gcp", fake_metadata.url, fast_config).start()
    # Both pollers have read the current values and are long-polling.
    wait_for(
        lambda: all(fake_metadata.requests.count(("GET", p)) >= 2 for p in (PREEMPTED, MAINTENANCE)), what="long polls"
    )
    yield watcher
    watcher.stop()


def test_the_fake_requires_the_metadata_flavor_header(fake_metadata):
    with pytest.raises(urllib.error.HTTPError) as exc:
        _get(fake_metadata.url + PREEMPTED, headers={"X": "y"})
    assert exc.value.code == 403
    assert _get(fake_metadata.url + PREEMPTED)[0] == "FALSE"
    assert _get(fake_metadata.url + MAINTENANCE)[0] == "NONE"


def test_the_fakes_wait_for_change_returns_when_the_value_changes(fake_metadata):
    _, etag = _get(fake_metadata.url + PREEMPTED)
    answers = []
    poll = threading.Thread(
        target=lambda: answers.append(
            _get(f"{fake_metadata.url}{PREEMPTED}?wait_for_change=true&last_etag={etag}&timeout_sec=20", timeout=30)
        )
    )
    poll.start()
    wait_for(lambda: fake_metadata.requests.count(("GET", PREEMPTED)) >= 2, what="long poll")
    fake_metadata.preempt()
    poll.join(30)
    assert answers and answers[0][0] == "TRUE" and answers[0][1] != etag


def test_the_fakes_wait_for_change_times_out_with_the_unchanged_value(fake_metadata):
    value, etag = _get(f"{fake_metadata.url}{MAINTENANCE}")
    again = _get(f"{fake_metadata.url}{MAINTENANCE}?wait_for_change=true&last_etag={etag}&timeout_sec=0.1")
    assert again == (value, etag)


def test_preemption_becomes_a_terminal_notice_with_thirty_seconds(fake_metadata, gcp_watcher):
    assert gcp_watcher.pending() is None
    time.sleep(0.2)  # the long polls have been waiting a while
    before = time.time()
    fake_metadata.preempt()
    notice = wait_for(gcp_watcher.pending, what="preemption notice")
    assert notice.received_at >= before  # the answer's time, not the request's
    assert (notice.kind, notice.source, notice.terminal) == (NoticeKind.TERMINATION, NoticeSource.GCP_PREEMPTED, True)
    assert notice.deadline == pytest.approx(notice.received_at + 30.0)


def test_terminate_on_host_maintenance_is_terminal(fake_metadata, gcp_watcher):
    fake_metadata.maintenance("TERMINATE_ON_HOST_MAINTENANCE")
    notice = wait_for(gcp_watcher.pending, what="maintenance notice")
    assert notice.kind is NoticeKind.MAINTENANCE and notice.terminal
    assert notice.deadline == pytest.approx(notice.received_at + 60.0)


def test_a_live_migration_is_advisory_and_withdrawn_when_maintenance_ends(fake_metadata, gcp_watcher):
    fake_metadata.maintenance("MIGRATE_ON_HOST_MAINTENANCE")
    notice = wait_for(gcp_watcher.pending, what="maintenance notice")
    assert notice.kind is NoticeKind.MAINTENANCE and not notice.terminal
    fake_metadata.maintenance("NONE")
    wait_for(lambda: gcp_watcher.pending() is None, what="withdrawal")


def test_a_preemption_before_the_watcher_starts_is_still_seen(fake_metadata, fast_config):
    fake_metadata.preempt()
    with NoticeWatcher("gcp", fake_metadata.url, fast_config) as watcher:
        assert wait_for(watcher.pending, what="notice").source is NoticeSource.GCP_PREEMPTED


def test_stop_cuts_a_long_poll_in_flight(fake_metadata, fast_config):
    config = type(fast_config)(poll_interval_s=0.05, gcp_wait_timeout_s=60.0)
    watcher = NoticeWatcher("gcp", fake_metadata.url, config).start()
    threads = list(watcher._threads)
    wait_for(
        lambda: all(fake_metadata.requests.count(("GET", p)) >= 2 for p in (PREEMPTED, MAINTENANCE)), what="long polls"
    )
    watcher.stop(timeout_s=2.0)  # the fake would hold each poll for 5 s
    assert not any(t.is_alive() for t in threads)


def test_the_preemption_deadline_follows_ftfleet_preemption_notice_s(fake_metadata):
    """An extended preemption notice (the GCP stack's gcpPreemptionNoticeSeconds) reaches
    the watcher through the contract variable, via the trainer config."""
    import dataclasses

    from ftfleet.trainer.config import load_config
    from tests.trainer.resilience.helpers import REPO

    config = load_config(REPO / "trainer/configs/tiny.yaml", [], environ={"FTFLEET_PREEMPTION_NOTICE_S": "90"})
    watcher_config = dataclasses.replace(
        config.resilience.watcher, poll_interval_s=0.05, gcp_wait_timeout_s=2.0, max_backoff_s=0.2
    )
    with NoticeWatcher("gcp", fake_metadata.url, watcher_config) as watcher:
        fake_metadata.preempt()
        notice = wait_for(watcher.pending, what="preemption notice")
    assert notice.deadline == pytest.approx(notice.received_at + 90.0)


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan"])
def test_a_bad_ftfleet_preemption_notice_s_is_refused_in_one_line_naming_it(value):
    from ftfleet import contract

    env = {v.name: v.example for v in contract.TRAINER_ENV if v.required}
    contract.check_env(env)
    with pytest.raises(contract.ContractError, match="FTFLEET_PREEMPTION_NOTICE_S") as err:
        contract.check_env({**env, "FTFLEET_PREEMPTION_NOTICE_S": value})
    assert "\n" not in str(err.value) and "positive number" in str(err.value)
