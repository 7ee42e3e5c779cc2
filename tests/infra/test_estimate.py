"""The cost estimate follows what the fleet declares and prices what a deploy pays for."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ftfleet.cli import main
from ftfleet.infra import catalog, estimate, stackfile

PROD = stackfile.load("aws-prod").settings()


def with_fleet(s, **changes):
    return dataclasses.replace(s, fleet=dataclasses.replace(s.fleet, **changes))


def price(name, kind="on_demand_hourly"):
    return getattr(catalog.instance("aws", name), kind)


def test_on_demand_workers_are_priced_as_the_first_listed_type_as_prioritized_launches_them():
    volumes = estimate.estimate(PROD)["fleet_usd_per_hour"]["root_volumes"]
    for first in ("p5.48xlarge", "p5en.48xlarge"):
        types = (first, *[t for t in PROD.fleet.worker_instance_types if t != first])
        est = estimate.estimate(with_fleet(PROD, worker_instance_types=types))
        expected = price("p5.48xlarge") + PROD.fleet.worker_desired_size * price(first) + volumes
        assert est["fleet_usd_per_hour"]["all_on_demand"] == pytest.approx(expected, abs=0.01)
        assert est["assumptions"][0].startswith(f"on-demand workers are {first}")


def test_root_volumes_are_priced_with_their_provisioned_iops_and_throughput():
    p = catalog.storage_prices("aws")
    monthly = (
        500 * p["ebs_gp3_gib_month"] + (6000 - 3000) * p["ebs_gp3_iops_month"] + (500 - 125) * p["ebs_gp3_mibps_month"]
    )
    assert estimate.root_volume_monthly(PROD) == pytest.approx(monthly)
    nodes = 1 + PROD.fleet.worker_desired_size
    assert estimate.estimate(PROD)["fleet_usd_per_hour"]["root_volumes"] == round(nodes * monthly / 730, 2)


def test_replication_costs_transfer_and_the_rtc_fee_per_tib_written():
    p = catalog.storage_prices("aws")
    repl = estimate.estimate(PROD)["replication_usd_per_tib_written"]
    assert repl["inter_region_transfer"] == round(1024 * p["s3_inter_region_transfer_gib"], 2)
    assert repl["replication_time_control"] == round(1024 * p["s3_replication_rtc_gib"], 2)
    assert repl["total"] == pytest.approx(repl["inter_region_transfer"] + repl["replication_time_control"])
    no_rtc = dataclasses.replace(PROD, buckets=dataclasses.replace(PROD.buckets, replication_time_control=False))
    assert estimate.estimate(no_rtc)["replication_usd_per_tib_written"]["replication_time_control"] == 0


def test_the_nat_gateway_is_priced_only_when_the_stack_creates_it():
    net = estimate.estimate(PROD)["network_usd_per_month"]
    assert net["nat_gateway"] == round(catalog.network_prices("aws")["nat_gateway_hourly"] * 730, 2) > 0
    adopted = dataclasses.replace(
        PROD,
        network=dataclasses.replace(PROD.network, existing_vpc_id="vpc-1", existing_subnet_ids=("subnet-1",) * 3),
    )
    assert estimate.estimate(adopted)["network_usd_per_month"] == {"nat_gateway": 0, "nat_per_gib_processed": 0}


def test_the_plan_shows_replication_per_tib_written_in_the_table_and_the_json(capsys):
    assert main(["plan", "aws-prod"]) == 0
    table = capsys.readouterr().out
    assert "replication: $35.84 per TiB of checkpoints written" in table and "NAT gateway:" in table
    assert main(["plan", "aws-prod", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert est["replication_usd_per_tib_written"]["total"] == 35.84


def test_spare_nodes_are_priced_as_nodes_of_the_worker_group():
    plain, spared = estimate.estimate(PROD), estimate.estimate(with_fleet(PROD, spare_nodes=2))
    fleet, base = spared["fleet_usd_per_hour"], plain["fleet_usd_per_hour"]
    per_node_volume = estimate.root_volume_monthly(PROD) / 730
    first = PROD.fleet.worker_instance_types[0]
    extra = 2 * (price(first) + per_node_volume)
    assert fleet["all_on_demand"] - base["all_on_demand"] == pytest.approx(extra, abs=0.02)
    assert fleet["spare_nodes"] > 0
    assert fleet["spare_nodes"] == pytest.approx(fleet["with_spot"] - base["with_spot"], abs=0.02)
    assert base["spare_nodes"] == 0 and spared["nodes"]["workers_spare"] == 2
    nodes = spared["nodes"]
    assert nodes["workers_on_demand"] + nodes["workers_spot"] == PROD.fleet.worker_desired_size + 2
    assert nodes["gpus"] == plain["nodes"]["gpus"] + 2 * PROD.fleet.gpus_per_node


def test_the_plan_of_a_stack_with_spares_names_them_in_the_table_and_the_json(capsys, tmp_path):
    text = (stackfile.STACKS_DIR / "Pulumi.aws-dev.yaml").read_text()
    assert "config:\n" in text
    path = tmp_path / "Pulumi.spares.yaml"
    path.write_text(text.replace("config:\n", "config:\n  ftfleet:spareNodes: 1\n", 1))
    assert main(["plan", str(path)]) == 0
    assert "1 of them spare ($" in capsys.readouterr().out
    assert main(["plan", str(path), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert est["nodes"]["workers_spare"] == 1 and est["fleet_usd_per_hour"]["spare_nodes"] > 0
