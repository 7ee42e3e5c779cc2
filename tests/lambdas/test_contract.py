"""What the functions and the nodes agree on (ftfleet/contract.py, remediation section)."""

from __future__ import annotations

import pytest

from ftfleet import contract
from ftfleet.contract import ContractError, Interruption, InterruptionPrior
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest

NOW = 1_800_000_000.0


def prior(*times, nodes=None):
    events = tuple(
        Interruption(nodes[i] if nodes else f"i-{i:017x}", t, "us-east-1a", "p5.48xlarge") for i, t in enumerate(times)
    )
    return InterruptionPrior("aws", "run", NOW, events)


def test_the_prior_round_trips_and_the_trainer_s_parser_accepts_it():
    p = prior(NOW - 7200, NOW - 3600)
    assert contract.parse_interruption_prior(p.to_json()) == p


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": "something-else/1"}',
        '{"format": "ftfleet-interruptions/1", "cloud": "aws", "run_id": "r", "updated_at": 1}',
        '{"format": "ftfleet-interruptions/1", "cloud": "azure", "run_id": "r", "updated_at": 1, "interruptions": []}',
        '{"format": "ftfleet-interruptions/1", "cloud": "aws", "run_id": "r", "updated_at": 1, '
        '"interruptions": [{"node_id": "", "at": 1, "zone": "z", "instance_type": "t"}]}',
        '{"format": "ftfleet-interruptions/1", "cloud": "aws", "run_id": "r", "updated_at": 1, '
        '"interruptions": [{"node_id": "i-1", "at": "soon", "zone": "z", "instance_type": "t"}]}',
    ],
)
def test_a_malformed_prior_is_one_line_naming_it(text):
    with pytest.raises(ContractError, match="interruption prior") as err:
        contract.parse_interruption_prior(text)
    assert "\n" not in str(err.value)


def test_fewer_than_two_job_interruptions_say_nothing():
    assert prior().mtbf_s(NOW) is None
    assert prior(NOW - 100).mtbf_s(NOW) is None


def test_mtbf_is_the_mean_gap_since_the_first_job_interruption():
    assert prior(NOW - 3 * 3600, NOW - 3600).mtbf_s(NOW) == pytest.approx(3 * 3600 / 1)
    assert prior(NOW - 4 * 3600, NOW - 2 * 3600, NOW).mtbf_s(NOW) == pytest.approx(2 * 3600)


def test_nodes_reclaimed_together_are_one_job_interruption():
    burst = prior(NOW - 3600, NOW - 3590, NOW - 3500, NOW)
    assert len(burst.job_interruptions(NOW)) == 2
    assert burst.mtbf_s(NOW) == pytest.approx(3600)


def test_interruptions_outside_the_window_no_longer_count():
    old = prior(NOW - contract.INTERRUPTION_WINDOW_S - 10, NOW - 3600, NOW)
    assert len(old.job_interruptions(NOW)) == 2


def test_adding_an_interruption_is_idempotent_by_node_and_bounded():
    p = prior(NOW - 10)
    same, added = p.with_interruption(Interruption(p.interruptions[0].node_id, NOW, "z", "t"), NOW)
    assert not added and same == p
    grown = p
    for i in range(contract.INTERRUPTION_PRIOR_MAX + 5):
        grown, _ = grown.with_interruption(Interruption(f"n{i}", NOW - 1000 + i, "z", "t"), NOW)
    assert len(grown.interruptions) == contract.INTERRUPTION_PRIOR_MAX
    assert grown.interruptions[-1].node_id == f"n{contract.INTERRUPTION_PRIOR_MAX + 4}"


def marker(**changes):
    values = dict(run_id="run", node_id="i-1", step=5, reason="termination", durable=True, written_at=NOW)
    values.update(changes)
    return contract.CommitMarker(**values)


@pytest.mark.parametrize(
    ("m", "releases"),
    [
        (marker(), True),
        (marker(reason="signal"), True),
        (marker(written_at=NOW - contract.MARKER_NOTICE_SLACK_S + 1), True),
        (marker(written_at=NOW - contract.MARKER_NOTICE_SLACK_S - 1), False),
        (marker(reason="rebalance"), False),
        (marker(node_id="i-2"), False),
        (marker(run_id="other"), False),
    ],
    ids=["fresh", "signal", "during-the-spot-notice", "stale", "rebalance", "other-node", "other-run"],
)
def test_which_markers_release_a_terminating_node(m, releases):
    assert contract.marker_releases(m, node_id="i-1", run_id="run", notice_at=NOW) is releases


def test_the_manifest_s_file_list_is_read_as_the_trainer_writes_it():
    files = {"__0_0.distcp": FileEntry(10, "0badf00d"), ".metadata": FileEntry(3, "00000000")}
    text = Manifest(step=7, run_id="run", config_hash="h", world_size=1, files=files, torch_version="2.13.0").to_json()
    assert contract.manifest_file_sizes(text) == {"__0_0.distcp": 10, ".metadata": 3}


@pytest.mark.parametrize("text", ["", "{}", '{"files": {}}', '{"files": {"a": {"size": "big"}}}', '{"files": []}'])
def test_a_malformed_manifest_is_one_line(text):
    with pytest.raises(ContractError, match="manifest.json"):
        contract.manifest_file_sizes(text)


def test_node_metrics_carry_run_and_node():
    assert contract.PROGRESS_METRIC.dimensions("run", "i-1") == [
        {"Name": "RunId", "Value": "run"},
        {"Name": "NodeId", "Value": "i-1"},
    ]
