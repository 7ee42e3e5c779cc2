"""A change that would replace a bucket, a key or the file system is refused in one line."""

from __future__ import annotations

import json

import pulumi
import pytest

from ftfleet.cli import main
from ftfleet.errors import ConfigError
from ftfleet.infra import creation, offline, stackfile

DEV = stackfile.load("aws-dev")
CURRENT = creation.recorded(DEV.settings())


def deployed(**changes) -> dict:
    return {**CURRENT, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"objectLock": True}, "ftfleet:objectLock was true when this stack was deployed and is now false"),
        ({"region": "us-east-2"}, 'aws:region was "us-east-2" when this stack was deployed and is now "us-east-1"'),
        ({"replicaRegion": "eu-west-1"}, 'ftfleet:replicaRegion was "eu-west-1"'),
        ({"fsxZone": "us-east-1b"}, 'ftfleet:availabilityZones[0] was "us-east-1b"'),
        ({"vpcCidr": "10.50.0.0/16"}, 'ftfleet:vpcCidr was "10.50.0.0/16"'),
        ({"fsxStorageCapacityGiB": 2400}, "ftfleet:fsxStorageCapacityGiB is 1200, below the 2400 GiB"),
    ],
)
def test_a_change_that_would_replace_stored_data_is_refused_naming_the_key(changes, message):
    with pytest.raises(ConfigError) as err:
        creation.check(deployed(**changes), CURRENT)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_first_deployment_a_growing_file_system_and_unchanged_settings_pass():
    creation.check(None, CURRENT)
    creation.check(deployed(), CURRENT)
    creation.check(deployed(fsxStorageCapacityGiB=1200), {**CURRENT, "fsxStorageCapacityGiB": 2400})


def test_the_program_exports_what_it_checks_next_time():
    assert offline.run(DEV).outputs[creation.OUTPUT] == CURRENT


def test_the_program_refuses_before_registering_any_cloud_resource_when_a_bucket_would_be_replaced(monkeypatch):
    registered = []
    real = offline._Monitor.RegisterResource

    def spy(self, request):
        registered.append(request.type)
        return real(self, request)

    monkeypatch.setattr(offline._Monitor, "RegisterResource", spy)
    previous = {creation.OUTPUT: deployed(objectLock=True)}
    with pytest.raises(pulumi.RunError, match="ftfleet:objectLock was true"):
        offline.run(DEV, previous_outputs=previous)
    assert registered and not [t for t in registered if t.startswith("aws:")]


def test_a_stack_deployed_with_the_same_settings_plans_in_full():
    rec = offline.run(DEV, previous_outputs={creation.OUTPUT: CURRENT})
    assert rec.of_type("aws:s3/bucket:Bucket")


def test_plan_with_the_deployed_outputs_exits_2_with_one_line(tmp_path, capsys):
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({creation.OUTPUT: deployed(replicaRegion="eu-west-1")}))
    assert main(["plan", "aws-dev", "--previous-outputs", str(outputs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith('error: ftfleet:replicaRegion was "eu-west-1"')


def test_plan_names_an_unreadable_outputs_file(tmp_path, capsys):
    bad = tmp_path / "outputs.json"
    bad.write_text("not json")
    assert main(["plan", "aws-dev", "--previous-outputs", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --previous-outputs {bad}: not a JSON file")
