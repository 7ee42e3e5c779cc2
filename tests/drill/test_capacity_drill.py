"""The capacity-loss drill end to end, on each cloud: the home region's workers run out
of spot capacity at step 20 of 40, the standby's capacity watch moves the run, and the
run completes in the standby region where the uninterrupted run ends (``make chaos``)."""

from __future__ import annotations

import pytest

from drill.capacity_report import FIRST_STEP_LIMIT_S
from tests.drill.test_drill_e2e import run_drill


@pytest.mark.chaos
@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_run_whose_region_loses_its_spot_capacity_moves_to_its_standby_and_matches_the_reference(tmp_path, cloud):
    args = ("--faults", "capacity_loss", "--cloud", cloud, "--first-step", "20", "--spacing", "20")
    data = run_drill(tmp_path, *args, timeout=540)
    assert data["ok"] and data["completed"] and data["final_step"] == 40
    assert data["state_matches_reference"] is True
    assert data["loss_to_decision_s"] >= data["loss_s"]  # the function waited for capacityLossMinutes
    assert data["t_loss"] < data["t_decision"] <= data["t_sized"] < data["t_first_standby_step"]
    # Only what replication had not carried is computed again.
    emergency = data["home_committed_step"]
    assert emergency >= 20
    assert data["resumed_from"] >= emergency - data["not_replicated_steps"]
    assert data["resumed_tier"] == "primary"  # AWS: the home's replica bucket; GCP: the one bucket
    if cloud == "gcp":
        assert data["not_replicated_steps"] == 0 and data["resumed_from"] == emergency
    # The move left the home's lease to run out: the standby's first starts were fenced.
    assert data["fenced_starts"] >= 1
    assert data["decision_to_first_step_s"] < FIRST_STEP_LIMIT_S
