"""Bad stack configuration: one line naming the key and the fix, exit 2, no traceback."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pulumi
import pytest
import yaml

from ftfleet.cli import main
from ftfleet.infra import catalog, constraints, offline, settings, stackfile

DEV = yaml.safe_load(open(stackfile.STACKS_DIR / "Pulumi.aws-dev.yaml"))["config"]

BAD = {
    "unknown cloud": ({"ftfleet:cloud": "azure"}, "ftfleet:cloud is 'azure'; use one of: aws, gcp"),
    "replica equals primary": ({"ftfleet:replicaRegion": "us-east-1"}, "ftfleet:replicaRegion equals the primary"),
    "fsx capacity not an increment": (
        {"ftfleet:fsxStorageCapacityGiB": 3000},
        "ftfleet:fsxStorageCapacityGiB is 3000; PERSISTENT_2 SSD takes 1200 or a multiple of 2400",
    ),
    "fsx throughput": ({"ftfleet:fsxThroughputPerTiB": 200}, "ftfleet:fsxThroughputPerTiB is 200; use one of"),
    "on-demand base above max": (
        {"ftfleet:onDemandBaseCapacity": 9},
        "ftfleet:onDemandBaseCapacity (9) exceeds workerMaxSize (4)",
    ),
    "empty instance types": ({"ftfleet:workerInstanceTypes": []}, "ftfleet:workerInstanceTypes is empty"),
    "unknown instance type": ({"ftfleet:workerInstanceTypes": ["g5.2xlarg"]}, "unknown instance type 'g5.2xlarg'"),
    "mixed gpu counts": (
        {"ftfleet:workerInstanceTypes": ["g5.2xlarge", "g5.12xlarge"]},
        "mixes types with different GPU counts",
    ),
    "unknown allocation strategy": (
        {"ftfleet:spotAllocationStrategy": "cheapest"},
        "ftfleet:spotAllocationStrategy is 'cheapest'; use one of",
    ),
    "negative retention": (
        {"ftfleet:noncurrentVersionExpiryDays": -3},
        "ftfleet:noncurrentVersionExpiryDays is -3; it must be at least 1",
    ),
    "non-integer retention": (
        {"ftfleet:transitionToIaDays": 30.5},
        "ftfleet:transitionToIaDays must be a whole number",
    ),
    "glacier before ia": (
        {"ftfleet:transitionToIaDays": 30, "ftfleet:transitionToGlacierDays": 40},
        "ftfleet:transitionToGlacierDays is 40; it must be at least transitionToIaDays + 30",
    ),
    "unknown key": (
        {"ftfleet:workerMaxSise": 4},
        "unknown config key ftfleet:workerMaxSise: did you mean ftfleet:workerMaxSize?",
    ),
    "desired outside bounds": ({"ftfleet:workerDesiredSize": 7}, "ftfleet:workerDesiredSize (7) must lie between"),
    "spares above the group's maximum": (
        {"ftfleet:spareNodes": 99},
        "ftfleet:spareNodes (99) plus workerDesiredSize",
    ),
    "negative spares": ({"ftfleet:spareNodes": -1}, "ftfleet:spareNodes is -1; it must be at least 0"),
    "efa on a type without it": ({"ftfleet:efaEnabled": True}, "does not support EFA"),
    "pinned inside checkpoints": ({"ftfleet:pinnedPrefix": "checkpoints/keep/"}, "overlaps checkpointPrefix"),
    "zone of another region": ({"ftfleet:availabilityZones": ["us-west-2a"]}, "not a zone of us-east-1"),
    "missing required": ({"ftfleet:replicaRegion": None}, "ftfleet:replicaRegion is required"),
    "mutable image tag": ({"ftfleet:trainerImageTag": "latest"}, "ftfleet:trainerImageTag must name an immutable"),
    "unknown launcher": (
        {"ftfleet:trainerLauncher": "mpirun"},
        "ftfleet:trainerLauncher is 'mpirun'; use inprocess (ftfleet's in-process launcher, the default) or torchrun",
    ),
    "bad tag": ({"ftfleet:tags": ["team"]}, "write tags as key=value"),
    # The nodes allow tags in instance metadata (EC2 User Guide, tag restrictions).
    "tag key with a space": ({"ftfleet:tags": ["cost center=ml"]}, "contains key 'cost center': an instance tag key"),
    "tag key with a slash": ({"ftfleet:tags": ["team/sub=ml"]}, "(no spaces or slashes)"),
    "tag key reserved in metadata": ({"ftfleet:tags": ["_index=1"]}, "'_index' is reserved in instance metadata"),
    "tag key of two periods": ({"ftfleet:tags": ["..=1"]}, "'..' is reserved in instance metadata"),
    "tag key too long": ({"ftfleet:tags": ["k" * 129 + "=v"]}, "1-128 letters, digits"),
    "tag value too long": ({"ftfleet:tags": ["k=" + "v" * 257]}, "EC2 allows 256"),
    "tag twice": ({"ftfleet:tags": ["k=a", "k=b"]}, "sets 'k' twice"),
    "replica region that does not exist": (
        {"ftfleet:replicaRegion": "us-west-99"},
        "ftfleet:replicaRegion is 'us-west-99', which is not an AWS region that pulumi-aws knows; did you mean",
    ),
    "primary region that does not exist is blamed on aws:region, not the zones": (
        {"aws:region": "us-east-9"},
        "aws:region is 'us-east-9', which is not an AWS region that pulumi-aws knows; did you mean us-east-",
    ),
    "region of another partition": (
        {"aws:region": "cn-north-1", "ftfleet:availabilityZones": ["cn-north-1a"]},
        "aws:region is 'cn-north-1', in the aws-cn partition",
    ),
    "workers of two gpu generations": (
        {"ftfleet:workerInstanceTypes": ["g5.2xlarge", "g6.2xlarge"]},
        "ftfleet:workerInstanceTypes mixes GPU generations (g5.2xlarge is ampere-a10g, g6.2xlarge is ada-l4)",
    ),
    "a100 workers with h100": (
        {
            "ftfleet:coordinatorInstanceType": "p5.48xlarge",
            "ftfleet:workerInstanceTypes": ["p5.48xlarge", "p4d.24xlarge"],
        },
        "ftfleet:workerInstanceTypes mixes GPU generations (p5.48xlarge is hopper, p4d.24xlarge is ampere-a100)",
    ),
    "coordinator of another generation": (
        {"ftfleet:coordinatorInstanceType": "g6.2xlarge"},
        "ftfleet:coordinatorInstanceType is g6.2xlarge (ada-l4) but the workers are ampere-a10g",
    ),
    "object lock with the fsx export": (
        {"ftfleet:objectLock": True},
        "ftfleet:objectLock is true, but on AWS only the FSx data repository association writes",
    ),
    "more efa interfaces than the subnet has addresses": (
        {
            "ftfleet:coordinatorInstanceType": "p5.48xlarge",
            "ftfleet:workerInstanceTypes": ["p5.48xlarge"],
            "ftfleet:efaEnabled": True,
            "ftfleet:workerMaxSize": 200,
        },
        "ftfleet:workerMaxSize allows 201 nodes with 32 EFA interfaces each",
    ),
}


def test_types_of_two_efa_groups_are_refused_with_efa(monkeypatch, tmp_path, capsys):
    """No catalog pair of one generation spans two EFA groups today; a new type could."""
    real = catalog.instance

    def with_dl_type(cloud, name):
        if name == "x9.48xlarge":
            return dataclasses.replace(real(cloud, "p5.48xlarge"), name=name, efa_group="dl1")
        return real(cloud, name)

    monkeypatch.setattr(catalog, "instance", with_dl_type)
    changes = {
        "ftfleet:coordinatorInstanceType": "p5.48xlarge",
        "ftfleet:workerInstanceTypes": ["p5.48xlarge", "x9.48xlarge"],
        "ftfleet:efaEnabled": True,
    }
    assert main(["plan", bad_stack(tmp_path, changes)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: ftfleet:workerInstanceTypes mixes types that cannot exchange EFA traffic")
    constraints.check_fleet_types("aws", "p5.48xlarge", ("p5.48xlarge", "x9.48xlarge"), efa=False)


def test_every_aws_region_the_stacks_use_is_known_to_the_provider():
    known = constraints.known_aws_regions()
    for name in stackfile.stack_names():
        s = stackfile.load(name).settings()
        if s.cloud == "aws":
            assert {s.region, s.replica_region} <= set(known)


def bad_stack(tmp_path, changes) -> str:
    config = dict(DEV)
    for k, v in changes.items():
        if v is None:
            config.pop(k)
        else:
            config[k] = v
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return str(path)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_exits_2_with_one_line_naming_the_key(case, tmp_path, capsys):
    changes, expected = BAD[case]
    assert main(["plan", bad_stack(tmp_path, changes)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err


@pytest.mark.integration
def test_the_cli_prints_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ftfleet.cli", "plan", bad_stack(tmp_path, {"ftfleet:cloud": "azure"})],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: ftfleet:cloud is 'azure'; use one of: aws, gcp"]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_the_pulumi_program_reports_bad_config_as_a_run_error_without_a_stack_trace(tmp_path):
    stack = stackfile.load(bad_stack(tmp_path, {"ftfleet:fsxStorageCapacityGiB": 1000}))
    with pytest.raises(pulumi.RunError, match="ftfleet:fsxStorageCapacityGiB is 1000"):
        offline.run(stack, validate_first=False)


def test_pulumi_strings_parse_like_yaml_values():
    """`pulumi up` hands the program strings (lists as JSON); the result must match."""
    stack = stackfile.load("aws-prod")
    as_strings = {k.split(":", 1)[1]: v for k, v in stack.as_pulumi_strings().items() if k.startswith("ftfleet:")}
    assert settings.parse(as_strings, stack="aws-prod", region="us-east-1") == stack.settings()


def test_defaults_come_from_pulumi_yaml_and_fill_a_minimal_stack():
    minimal = {
        "cloud": "aws",
        "replicaRegion": "us-west-2",
        "availabilityZones": ["us-east-1a"],
        "workerInstanceTypes": ["g5.xlarge"],
    }
    s = settings.parse(minimal, stack="mini", region="us-east-1")
    schema = settings.load_schema()
    assert s.fleet.worker_max_size == schema["workerMaxSize"]["default"]
    assert s.storage.fsx_storage_capacity_gib == schema["fsxStorageCapacityGiB"]["default"]
    assert s.trainer.run_id == "mini"
