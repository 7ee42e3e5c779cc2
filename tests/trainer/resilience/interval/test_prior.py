"""The fleet's interruption prior (contract.INTERRUPTION_PRIOR_KEY) becomes the
checkpoint interval's MTBF prior; anything wrong with it leaves the configured one."""

from __future__ import annotations

import logging

import boto3
import pytest
from moto import mock_aws

from ftfleet.contract import INTERRUPTION_PRIOR_KEY, Interruption, InterruptionPrior
from ftfleet.trainer.checkpoint.tiers.s3 import S3Store
from ftfleet.trainer.resilience.interval.adaptive import IntervalConfig
from ftfleet.trainer.resilience.interval.prior import with_fleet_prior

NOW = 1_800_000_000.0
CONFIGURED = IntervalConfig(mtbf_s=14400.0)


def prior_json(*hours_ago: float) -> str:
    prior = InterruptionPrior("aws", "run-a", NOW)
    for i, h in enumerate(hours_ago):
        prior, _ = prior.with_interruption(Interruption(f"i-{i}", NOW - h * 3600, "us-east-1a", "p5.48xlarge"), NOW)
    return prior.to_json()


@pytest.fixture
def store(monkeypatch):
    for k, v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="ckpt")
        yield S3Store("s3://ckpt/checkpoints/run-a", client=client)


def put(store: S3Store, body: str) -> None:
    store.client.put_object(Bucket="ckpt", Key=store.key(INTERRUPTION_PRIOR_KEY), Body=body.encode())


def test_the_fleets_mean_time_between_job_interruptions_becomes_the_mtbf_prior(store):
    put(store, prior_json(30, 20, 10))  # three job interruptions, the first 30 h ago
    cfg = with_fleet_prior(CONFIGURED, store, None, now=NOW)
    assert cfg.mtbf_s == pytest.approx(15 * 3600)
    assert cfg.mode == CONFIGURED.mode and cfg.fixed_steps == CONFIGURED.fixed_steps


def test_the_prior_on_the_fast_tier_is_read_without_a_durable_tier(tmp_path):
    (tmp_path / INTERRUPTION_PRIOR_KEY).parent.mkdir(parents=True)
    (tmp_path / INTERRUPTION_PRIOR_KEY).write_text(prior_json(4, 2))
    assert with_fleet_prior(CONFIGURED, None, tmp_path, now=NOW).mtbf_s == pytest.approx(4 * 3600)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (None, "none at"),
        ("{not json", "ignored"),
        ('{"format": "something-else/9"}', "ignored"),
        (prior_json(5), "fewer than two"),
    ],
    ids=["missing", "not-json", "wrong-format", "one-interruption"],
)
def test_a_missing_malformed_or_thin_prior_is_one_line_and_the_configured_prior_stays(store, caplog, body, says):
    if body is not None:
        put(store, body)
    with caplog.at_level(logging.DEBUG, logger="ftfleet.prior"):  # "none": for debugging only
        cfg = with_fleet_prior(CONFIGURED, store, None, now=NOW)
    assert cfg.mtbf_s == CONFIGURED.mtbf_s
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ftfleet.prior"]
    assert says in line and "14400" in line


def test_an_unreachable_bucket_is_one_warning_and_the_configured_prior_stays(caplog):
    class Broken:
        uri = "s3://ckpt/run"

        def get_bytes(self, rel):
            raise ConnectionError("endpoint unreachable")

    with caplog.at_level(logging.INFO, logger="ftfleet.prior"):
        cfg = with_fleet_prior(CONFIGURED, Broken(), None, now=NOW)  # type: ignore[arg-type]
    assert cfg is CONFIGURED
    (record,) = [r for r in caplog.records if r.name == "ftfleet.prior"]
    assert record.levelno == logging.WARNING and "unreadable" in record.getMessage()


def test_an_in_process_restart_uses_the_prior_its_process_read_instead_of_reading_it_again(tmp_path, monkeypatch):
    from ftfleet.trainer.resilience.interval import prior as prior_module

    (tmp_path / INTERRUPTION_PRIOR_KEY).parent.mkdir(parents=True)
    (tmp_path / INTERRUPTION_PRIOR_KEY).write_text(prior_json(4, 2))
    reads = []
    real = prior_module.read_prior_bytes
    monkeypatch.setattr(prior_module, "read_prior_bytes", lambda *a: (reads.append(a), real(*a))[1])
    try:
        prior_module.reuse_reads(600)
        first = with_fleet_prior(CONFIGURED, None, tmp_path, now=NOW)
        (tmp_path / INTERRUPTION_PRIOR_KEY).write_text(prior_json(9, 6, 3))  # updated since
        again = with_fleet_prior(CONFIGURED, None, tmp_path, now=NOW)
        assert len(reads) == 1 and first.mtbf_s == again.mtbf_s == pytest.approx(4 * 3600)
        prior_module.reuse_reads(0)  # the default: every start reads it
        assert with_fleet_prior(CONFIGURED, None, tmp_path, now=NOW).mtbf_s == pytest.approx(4.5 * 3600)
        assert len(reads) == 2
    finally:
        prior_module.reuse_reads(0)
