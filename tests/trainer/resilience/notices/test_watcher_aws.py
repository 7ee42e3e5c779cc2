import calendar
import json
import logging
import socket
import time
import urllib.error
import urllib.request

import pytest

from drill.fake_metadata import FakeMetadataServer
from ftfleet.errors import ConfigError
from ftfleet.trainer.resilience.notices.notice import NoticeKind, NoticeSource
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher, WatcherConfig
from tests.trainer.resilience.helpers import wait_for


@pytest.fixture
def aws_watcher(fake_metadata, fast_config):
    watcher = NoticeWatcher("aws", fake_metadata.url, fast_config).start()
    yield watcher
    watcher.stop()


def test_the_fake_refuses_metadata_without_an_imdsv2_token(fake_metadata):
    url = fake_metadata.url + "/latest/meta-data/spot/instance-action"
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url, timeout=5)
    assert exc.value.code == 401
    put = urllib.request.Request(fake_metadata.url + "/latest/api/token", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(put, timeout=5)
    assert exc.value.code == 400


def test_no_notice_while_the_instance_is_not_interrupted(fake_metadata, aws_watcher):
    wait_for(
        lambda: fake_metadata.requests.count(("GET", "/latest/meta-data/spot/instance-action")) >= 3, what="three polls"
    )
    assert aws_watcher.pending() is None


def test_the_watcher_fetches_a_token_with_a_ttl_before_reading_metadata(fake_metadata, aws_watcher):
    wait_for(lambda: len(fake_metadata.requests) >= 3, what="first poll")
    assert fake_metadata.requests[0] == ("PUT", "/latest/api/token")
    assert fake_metadata.state()["tokens_issued"] == 1  # reused, not one per request


def test_a_spot_interruption_becomes_a_terminal_notice_with_the_clouds_deadline(fake_metadata, aws_watcher):
    before = time.time()
    item = fake_metadata.schedule_spot_interruption("terminate", in_seconds=40)
    notice = wait_for(aws_watcher.pending, what="termination notice")
    assert notice.received_at >= before
    assert notice.kind is NoticeKind.TERMINATION and notice.terminal
    assert notice.source is NoticeSource.AWS_SPOT
    named = calendar.timegm(time.strptime(item["time"], "%Y-%m-%dT%H:%M:%SZ"))
    assert notice.deadline == pytest.approx(named)
    assert notice.deadline < notice.received_at + 120


def test_a_spot_interruption_further_away_than_two_minutes_gets_the_aws_budget(fake_metadata, aws_watcher):
    fake_metadata.schedule_spot_interruption("stop", in_seconds=600)
    notice = wait_for(aws_watcher.pending, what="termination notice")
    assert notice.deadline == pytest.approx(notice.received_at + 120.0)


def test_an_expired_token_is_replaced_and_notices_still_arrive(fake_metadata, aws_watcher):
    wait_for(lambda: fake_metadata.state()["tokens_issued"] == 1, what="first token")
    fake_metadata.expire_tokens()
    fake_metadata.schedule_spot_interruption(in_seconds=120)
    assert wait_for(aws_watcher.pending, what="notice after token expiry").terminal
    assert fake_metadata.requests.count(("PUT", "/latest/api/token")) >= 2


def test_a_rebalance_recommendation_is_advisory_and_handled_once(fake_metadata, aws_watcher):
    fake_metadata.recommend_rebalance()
    notice = wait_for(aws_watcher.pending, what="rebalance notice")
    assert notice.kind is NoticeKind.REBALANCE and not notice.terminal
    assert notice.deadline == pytest.approx(notice.received_at + 120.0)
    aws_watcher.acknowledge(notice)
    polls = fake_metadata.requests.count(("GET", "/latest/meta-data/events/recommendations/rebalance"))
    wait_for(
        lambda: (
            fake_metadata.requests.count(("GET", "/latest/meta-data/events/recommendations/rebalance")) >= polls + 3
        ),
        what="more polls",
    )
    assert aws_watcher.pending() is None


def test_an_acknowledged_rebalance_does_not_hide_a_termination(fake_metadata, aws_watcher):
    fake_metadata.recommend_rebalance()
    aws_watcher.acknowledge(wait_for(aws_watcher.pending, what="rebalance"))
    fake_metadata.schedule_spot_interruption(in_seconds=120)
    notice = wait_for(aws_watcher.pending, what="termination")
    assert notice.kind is NoticeKind.TERMINATION


def test_an_unreachable_endpoint_is_logged_once_and_polling_goes_on(fast_config, caplog):
    with socket.socket() as probe:  # a free port with nobody listening yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level(logging.INFO, logger="ftfleet.trainer.resilience")
    watcher = NoticeWatcher("aws", f"http://127.0.0.1:{port}", fast_config).start()
    try:
        wait_for(lambda: watcher._threads[0]._failures >= 4, what="failed polls")
        unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(unreachable) == 1
        with FakeMetadataServer(port=port) as server:
            server.schedule_spot_interruption(in_seconds=120)
            assert wait_for(watcher.pending, what="notice after recovery").terminal
            # Inside the server's block: the poll that reports the notice goes on to
            # read two more items, and only a poll that completes logs the recovery.
            wait_for(lambda: any("answers again" in r.getMessage() for r in caplog.records), what="'answers again'")
    finally:
        watcher.stop()


def test_pending_answers_while_a_poll_is_stuck_on_a_silent_endpoint():
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        config = WatcherConfig(poll_interval_s=0.05, request_timeout_s=30.0)
        watcher = NoticeWatcher("aws", f"http://127.0.0.1:{silent.getsockname()[1]}", config).start()
        try:
            time.sleep(0.2)  # let the poller block in its request
            assert watcher.pending() is None
            assert watcher._threads[0].is_alive()
        finally:
            watcher.stop(timeout_s=0.1)


def test_from_env_reads_the_contract_names(fake_metadata):
    watcher = NoticeWatcher.from_env(environ={"FTFLEET_CLOUD": "gcp", "FTFLEET_METADATA_ENDPOINT": fake_metadata.url})
    assert (watcher.cloud, watcher.endpoint) == ("gcp", fake_metadata.url)
    default = NoticeWatcher.from_env(environ={"FTFLEET_CLOUD": "aws"})
    assert default.endpoint == "http://169.254.169.254"
    assert NoticeWatcher.from_env(environ={}).cloud == "none"
    with pytest.raises(ConfigError, match="FTFLEET_CLOUD='azure'"):
        NoticeWatcher.from_env(environ={"FTFLEET_CLOUD": "azure"})


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("poll_interval_s", 0, "positive number of seconds"),
        ("aws_token_ttl_s", 50000, "1 to 21600"),
        ("signals", ("SIGKILL",), "cannot be caught"),
        ("signals", ("SIGNOPE",), "not a signal name"),
    ],
)
def test_bad_watcher_settings_name_the_field_and_the_fix(field, value, fix):
    with pytest.raises(ConfigError, match=fix) as exc:
        WatcherConfig(**{field: value})
    assert f"resilience.watcher.{field}" in str(exc.value)


def test_fake_serves_instance_action_as_json(fake_metadata):
    token_req = urllib.request.Request(
        fake_metadata.url + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    token = urllib.request.urlopen(token_req, timeout=5).read().decode()
    fake_metadata.schedule_spot_interruption("hibernate", in_seconds=10)
    get = urllib.request.Request(
        fake_metadata.url + "/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token}
    )
    body = json.loads(urllib.request.urlopen(get, timeout=5).read())
    assert body["action"] == "hibernate" and body["time"].endswith("Z")


def test_only_local_rank_zero_polls_the_metadata_service_by_default():
    env = {"FTFLEET_CLOUD": "aws"}
    assert NoticeWatcher.from_env(environ={**env, "LOCAL_RANK": "0"}).cloud == "aws"
    assert NoticeWatcher.from_env(environ={**env, "LOCAL_RANK": "3"}).cloud == "none"
    forced = NoticeWatcher.from_env(environ={**env, "LOCAL_RANK": "3"}, poll_metadata=True)
    assert forced.cloud == "aws"


def test_a_watcher_cannot_be_started_twice(fast_config):
    watcher = NoticeWatcher("none", config=fast_config)
    watcher.start()
    try:
        with pytest.raises(RuntimeError, match="twice"):
            watcher.start()
    finally:
        watcher.stop()


def test_the_groups_termination_becomes_a_terminal_notice_with_the_hooks_budget(fake_metadata, aws_watcher):
    wait_for(
        lambda: ("GET", "/latest/meta-data/autoscaling/target-lifecycle-state") in fake_metadata.requests,
        what="a poll of target-lifecycle-state",
    )
    assert aws_watcher.pending() is None, "InService is no notice"
    before = time.time()
    fake_metadata.terminate_in_group()
    notice = wait_for(aws_watcher.pending, what="group termination notice")
    assert notice.kind is NoticeKind.TERMINATION and notice.terminal
    assert notice.source is NoticeSource.AWS_LIFECYCLE
    assert notice.received_at >= before
    assert notice.deadline == pytest.approx(notice.received_at + aws_watcher.config.aws_lifecycle_notice_s)


def test_the_fake_posts_a_group_termination_for_a_client_in_another_process(fake_metadata):
    from drill.fake_metadata import FakeMetadataClient

    assert FakeMetadataClient(fake_metadata.url).terminate_in_group() == "Terminated"
    assert fake_metadata.state()["lifecycle_state"] == "Terminated"
