"""`ftfleet plan --state-gib`: the goodput prediction's arithmetic, its inputs and its
refusals (infra/goodput.py)."""

from __future__ import annotations

import json
import math

import pytest

from ftfleet.cli import main
from ftfleet.errors import ConfigError
from ftfleet.infra import catalog, estimate, goodput, settings, stackfile
from ftfleet.trainer.resilience.interval.adaptive import daly_goodput, daly_interval


def settings_and_estimate(stack: str):
    s = stackfile.load(stack).settings()
    return s, estimate.estimate(s)


def advisor_file(tmp_path, bands: dict[str, int], region: str = "us-east-1"):
    """The Spot Instance Advisor's JSON shape: ranges, and per region and OS each type's
    savings (s) and band index (r)."""
    data = {
        "ranges": [
            {"index": 0, "label": "<5%", "dots": 0, "max": 5},
            {"index": 1, "label": "5-10%", "dots": 1, "max": 11},
            {"index": 2, "label": "10-15%", "dots": 2, "max": 16},
            {"index": 3, "label": "15-20%", "dots": 3, "max": 22},
            {"index": 4, "label": ">20%", "dots": 4, "max": 100},
        ],
        "spot_advisor": {region: {"Linux": {t: {"s": 60, "r": r} for t, r in bands.items()}}},
    }
    path = tmp_path / "spot-advisor-data.json"
    path.write_text(json.dumps(data))
    return path


def test_a_monthly_share_is_a_constant_hourly_rate():
    rate = goodput.node_rate_per_hour(0.05)
    assert math.exp(-rate * goodput.HOURS_PER_MONTH) == pytest.approx(0.95)
    assert goodput.node_rate_per_hour(0.0) == 0.0
    with pytest.raises(ConfigError, match="a fraction from 0 to below 1"):
        goodput.node_rate_per_hour(1.0)


def test_the_prediction_is_dalys_model_with_the_fast_tiers_write_time():
    s, est = settings_and_estimate("aws-prod")
    pred = goodput.predict(s, est, state_gib=2000, restart_s=45, monthly_share=0.1)
    mb_s = 19200 / 1024 * 500  # FSx: capacity in TiB x MB/s per TiB
    cost = 2000 * 2**30 / 1e6 / mb_s
    assert pred["checkpoint_s"] == pytest.approx(cost, abs=0.01)
    (row,) = pred["rows"]
    per_hour = goodput.node_rate_per_hour(0.1) * est["nodes"]["workers_spot"]
    mtbf = 3600 / per_hour
    assert row["interval_s"] == pytest.approx(daly_interval(cost, mtbf), abs=0.1)
    assert row["goodput"] == pytest.approx(daly_goodput(daly_interval(cost, mtbf), cost, 45, mtbf), abs=1e-4)
    gpus = est["nodes"]["gpus"]
    assert row["usd_per_useful_gpu_hour"] == pytest.approx(
        est["fleet_usd_per_hour"]["with_spot"] / (gpus * row["goodput"]), abs=0.002
    )
    assert pred["usd_per_useful_gpu_hour_on_demand"] == pytest.approx(
        est["fleet_usd_per_hour"]["all_on_demand"] / gpus, abs=0.002
    )


def test_without_a_share_the_advisors_band_edges_are_scenarios_and_more_interruptions_cost_more():
    s, est = settings_and_estimate("aws-prod-standby")  # us-west-2: the catalog has no bands there
    rows = goodput.predict(s, est, state_gib=500)["rows"]
    assert [r["monthly_share"] for r in rows] == list(goodput.SCENARIOS)
    assert rows[0]["goodput"] > rows[1]["goodput"] > rows[2]["goodput"]
    assert rows[0]["usd_per_useful_gpu_hour"] < rows[2]["usd_per_useful_gpu_hour"]
    assert all("scenario" in r["source"] for r in rows)


def test_the_advisors_bands_give_each_types_share_and_the_fleet_takes_their_mean(tmp_path):
    s, est = settings_and_estimate("aws-prod")  # p5, p5e, p5en
    path = advisor_file(tmp_path, {"p5.48xlarge": 0, "p5e.48xlarge": 2, "p5en.48xlarge": 4})
    shares = goodput.advisor_shares(path, "us-east-1", goodput.spot_types(s))
    assert shares == {"p5.48xlarge": ("<5%", 0.05), "p5e.48xlarge": ("10-15%", 0.16), "p5en.48xlarge": (">20%", 0.20)}
    (row,) = goodput.predict(s, est, state_gib=500, advisor=path)["rows"]
    assert row["monthly_share"] == pytest.approx((0.05 + 0.16 + 0.20) / 3, abs=1e-4)
    assert "p5en.48xlarge >20%" in row["source"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("{not json", "not the Spot Instance Advisor's data for us-east-1"),
        (json.dumps({"ranges": [], "spot_advisor": {}}), "not the Spot Instance Advisor's data"),
    ],
)
def test_a_file_that_is_not_the_advisors_is_one_line(tmp_path, body, says):
    path = tmp_path / "advisor.json"
    path.write_text(body)
    with pytest.raises(ConfigError, match=says):
        goodput.advisor_shares(path, "us-east-1", ("p5.48xlarge",))


def test_a_type_the_advisor_does_not_list_names_the_other_way(tmp_path):
    path = advisor_file(tmp_path, {"p5.48xlarge": 1})
    with pytest.raises(ConfigError, match="no band for p5e.48xlarge in us-east-1; give --spot-monthly-share"):
        goodput.advisor_shares(path, "us-east-1", ("p5.48xlarge", "p5e.48xlarge"))


def test_gcp_has_no_advisor_and_parallelstore_needs_a_measured_save(tmp_path):
    s, est = settings_and_estimate("gcp-prod")
    with pytest.raises(ConfigError, match="on GCP give --spot-monthly-share"):
        goodput.predict(s, est, state_gib=100, advisor=advisor_file(tmp_path, {}))
    assert goodput.predict(s, est, state_gib=100, monthly_share=0.05)["checkpoint_from"].endswith("MB/s")
    raw = {**stackfile.load("gcp-dev").project_config(), "gcpStorageKind": "parallelstore"}
    for key in ("lustreCapacityGiB", "lustreThroughputPerTiB"):
        raw.pop(key, None)
    dev = settings.parse(raw, stack="gcp-dev", region=stackfile.load("gcp-dev").region())
    with pytest.raises(ConfigError, match="give --checkpoint-s"):
        goodput.predict(dev, estimate.estimate(dev), state_gib=100)
    assert goodput.predict(dev, estimate.estimate(dev), state_gib=100, checkpoint_s=12)["checkpoint_s"] == 12


def test_plan_prints_the_prediction_and_refuses_its_flags_without_the_state(capsys):
    assert main(["plan", "aws-prod", "--state-gib", "2000", "--spot-monthly-share", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "Goodput (PREDICTION, Daly's model)" in out and "per useful GPU-hour" in out
    assert main(["plan", "aws-prod", "--json", "--state-gib", "2000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["estimate"]["goodput"]["rows"]) == len(goodput.SCENARIOS) + 1  # the catalog's prior first
    assert main(["plan", "aws-prod", "--restart-s", "30"]) == 2
    assert "--restart-s needs --state-gib" in capsys.readouterr().err
    assert main(["plan", "aws-prod"]) == 0
    assert "Goodput" not in capsys.readouterr().out


def record(tmp_path, s, hours_between: list[float], now: float, **fields) -> object:
    """The fleet's interruption record with job interruptions ``hours_between`` apart,
    the last one an hour before ``now``."""
    from ftfleet import contract

    times = [now - 3600]
    for gap in reversed(hours_between):
        times.append(times[-1] - gap * 3600)
    prior = contract.InterruptionPrior(
        cloud=fields.get("cloud", s.cloud),
        run_id=fields.get("run_id", s.trainer.run_id),
        updated_at=now,
        interruptions=tuple(
            contract.Interruption(f"node-{i}", at, "us-east-1a", "p5.48xlarge") for i, at in enumerate(sorted(times))
        ),
    )
    path = tmp_path / "interruptions.json"
    path.write_text(prior.to_json())
    return path


def test_the_fleets_observed_record_gives_the_jobs_own_rate(tmp_path):
    s, est = settings_and_estimate("aws-prod")
    now = 1_800_000_000.0
    path = record(tmp_path, s, [10.0, 20.0], now)  # 3 job interruptions, 30 h apart in all
    pred = goodput.predict(s, est, state_gib=2000, observed=path, now=now)
    (row,) = pred["rows"]
    # The job's MTBF runs from its first interruption to now, over the gaps between them.
    mtbf = (30 * 3600 + 3600) / 2
    assert row["interruptions_per_hour"] == pytest.approx(3600 / mtbf, abs=1e-4)
    assert row["source"] == "observed: 3 job interruptions in 1.3 days"
    assert row["mtbf_s"] == pytest.approx(mtbf, abs=0.1)
    # The monthly share per node that rate means, shown beside it.
    per_node = 3600 / mtbf / est["nodes"]["workers_spot"]
    assert goodput.node_rate_per_hour(row["monthly_share"]) == pytest.approx(per_node, rel=1e-3)


@pytest.mark.parametrize(
    ("arrange", "says"),
    [
        (lambda tmp, s, now: record(tmp, s, [], now), "in its window, fewer than the two a rate needs"),
        (lambda tmp, s, now: record(tmp, s, [5.0], now, run_id="other"), "the record of run 'other' on aws"),
        (lambda tmp, s, now: tmp / "missing.json", "no such file"),
        (
            lambda tmp, s, now: (tmp / "x.json").write_text("{}") and tmp / "x.json",
            "not the fleet's interruption record",
        ),
    ],
)
def test_an_observed_record_that_cannot_give_a_rate_is_one_line(tmp_path, arrange, says):
    s, est = settings_and_estimate("aws-prod")
    now = 1_800_000_000.0
    with pytest.raises(ConfigError, match=says):
        goodput.predict(s, est, state_gib=100, observed=arrange(tmp_path, s, now), now=now)


def test_plan_takes_the_observed_record_alone(tmp_path, capsys):
    s, _ = settings_and_estimate("aws-prod")
    import time

    path = record(tmp_path, s, [6.0, 6.0, 6.0], time.time())
    assert main(["plan", "aws-prod", "--state-gib", "2000", "--observed", str(path)]) == 0
    assert "(observed: 4 job interruptions in 0.8 days)" in capsys.readouterr().out
    assert (
        main(["plan", "aws-prod", "--state-gib", "2000", "--observed", str(path), "--spot-monthly-share", "0.1"]) == 2
    )
    assert "replaces --spot-monthly-share and --spot-advisor; give one" in capsys.readouterr().err
    assert main(["plan", "aws-prod", "--observed", str(path)]) == 2
    assert "--observed needs --state-gib" in capsys.readouterr().err


def test_without_data_the_catalogs_dated_bands_come_first_naming_their_date_and_what_they_lack():
    dev, dev_est = settings_and_estimate("aws-dev")  # us-east-1: g5.2xlarge, g5.xlarge, g5.4xlarge
    first, *scenarios = goodput.predict(dev, dev_est, state_gib=100)["rows"]
    prior = catalog.spot_interruption_prior("aws")
    ranges = {r["index"]: r["max"] for r in prior["ranges"]}
    tops = [ranges[prior["bands"][t]] for t in dev.fleet.worker_instance_types]
    shares = [goodput.OPEN_BAND if top >= 100 else top / 100 for top in tops]  # as --spot-advisor takes them
    assert first["monthly_share"] == pytest.approx(sum(shares) / len(shares), abs=1e-4)
    assert first["source"].startswith(f"catalog: the advisor's bands as of {prior['as_of']}, g5.2xlarge ")
    assert [r["source"] for r in scenarios] == [f"scenario: {p:.0%} a month" for p in goodput.SCENARIOS]
    prod, prod_est = settings_and_estimate("aws-prod")  # p5e.48xlarge has no band in that copy
    assert "p5e.48xlarge: no band in that copy" in goodput.predict(prod, prod_est, state_gib=100)["rows"][0]["source"]
    # Another region, or GCP (no published per-type figure): the scenarios alone.
    for stack in ("aws-prod-standby", "gcp-prod"):
        s, est = settings_and_estimate(stack)
        rows = goodput.predict(s, est, state_gib=100, checkpoint_s=10)["rows"]
        assert [r["source"] for r in rows] == [f"scenario: {p:.0%} a month" for p in goodput.SCENARIOS]
