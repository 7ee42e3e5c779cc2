"""Every stack file in stacks/ runs under mocks and satisfies every invariant."""

from __future__ import annotations

import json

import pytest

from ftfleet.cli import main
from ftfleet.infra import policies, stackfile
from tests.infra.conftest import recording, res_view

STACKS = stackfile.stack_names()

CORE_TYPES = {
    "aws": {
        "aws:s3/bucket:Bucket",
        "aws:s3/bucketReplicationConfig:BucketReplicationConfig",
        "aws:kms/key:Key",
        "aws:kms/replicaKey:ReplicaKey",
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:autoscaling/group:Group",
        "aws:autoscaling/lifecycleHook:LifecycleHook",
        "aws:ecr/repository:Repository",
        "aws:iam/instanceProfile:InstanceProfile",
    },
    "gcp": {
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:compute/firewall:Firewall",
        "gcp:compute/globalAddress:GlobalAddress",
        "gcp:servicenetworking/connection:Connection",
        "gcp:compute/address:Address",
        "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate",
        "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager",
        "gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig",
        "gcp:compute/regionHealthCheck:RegionHealthCheck",
        "gcp:storage/bucket:Bucket",
        "gcp:storage/bucketIAMMember:BucketIAMMember",
        "gcp:artifactregistry/repository:Repository",
        "gcp:serviceaccount/account:Account",
    },
}
#: What a standby shares with its home stack instead of declaring it.
SHARED_WITH_HOME = {"aws:s3/bucket:Bucket", "aws:kms/key:Key", "aws:kms/replicaKey:ReplicaKey"}
#: What a GCP standby whose file system comes with a failover declares only then
#: (resource types and outputs alike).
NODES_AND_FILE_SYSTEM = {
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate",
    "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager",
    "gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig",
    "gcp:compute/regionHealthCheck:RegionHealthCheck",
    "file_system_mount",
    "coordinator_group",
    "worker_group",
}
#: One of these per stack: the fast checkpoint tier.
FILE_SYSTEMS = {
    "aws": {"aws:fsx/lustreFileSystem:LustreFileSystem"},
    "gcp": {"gcp:lustre/instance:Instance", "gcp:parallelstore/instance:Instance"},
}
OUTPUTS = {
    "aws": {
        "primary_bucket",
        "replica_bucket",
        "fsx_dns_name",
        "fsx_mount_name",
        "coordinator_group",
        "worker_group",
        "registry_url",
        "coordinator_address",
        "checkpoint_uri",
    },
    "gcp": {
        "checkpoint_bucket",
        "checkpoint_uri",
        "file_system_mount",
        "coordinator_group",
        "worker_group",
        "registry_url",
        "trainer_image",
        "coordinator_address",
        "node_service_account",
    },
}


def cloud_of(stack: str) -> str:
    return stackfile.load(stack).project_config()["cloud"]


def test_there_are_dev_and_prod_stacks_for_both_clouds():
    assert {"aws-dev", "aws-prod", "gcp-dev", "gcp-prod"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_stack_declares_the_whole_environment(stack):
    rec, cloud = recording(stack), cloud_of(stack)
    types = {r.type for r in rec.resources}
    core, outputs, file_systems = CORE_TYPES[cloud], OUTPUTS[cloud], 1
    standby = stackfile.load(stack).settings().standby
    if standby:  # tests/infra/test_standby.py
        core = core - SHARED_WITH_HOME
        if not standby.has_fast_tier:
            core, outputs, file_systems = core - NODES_AND_FILE_SYSTEM, outputs - NODES_AND_FILE_SYSTEM, 0
    assert core <= types
    assert len(FILE_SYSTEMS[cloud] & types) == file_systems
    assert outputs <= set(rec.outputs)
    assert all(v for k, v in rec.outputs.items() if k in outputs)


@pytest.mark.parametrize("stack", STACKS)
def test_stack_satisfies_every_mandatory_invariant(stack):
    assert policies.evaluate(res_view(recording(stack)), include_advisory=False) == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_component_child_has_a_parent_and_every_regional_resource_a_region(stack):
    rec = recording(stack)
    components = {r.urn for r in rec.resources if not r.custom}
    for r in rec.resources:
        if r.custom and not r.type.startswith("pulumi:providers:"):
            assert r.parent in components, f"{r.name} is not inside a component"
            if not r.type.startswith("aws:iam/"):
                assert rec.region_of(r), f"{r.name} has no region"


def test_prod_spreads_spot_over_at_least_three_types():
    rec = recording("aws-prod")
    assert [v for v in policies.evaluate(res_view(rec)) if v[0] == "spot-diversified"] == []
    workers = [r for r in rec.of_type("aws:autoscaling/group:Group") if r.name.endswith("-workers")][0]
    overrides = workers.inputs["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
    assert len({o["instanceType"] for o in overrides}) >= 3


def test_prod_replica_is_on_another_coast_and_prod_uses_efa():
    rec = recording("aws-prod")
    buckets = {r.name: rec.region_of(r) for r in rec.of_type("aws:s3/bucket:Bucket")}
    assert len(set(buckets.values())) == 2
    for lt in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        assert lt.inputs["networkInterfaces"][0]["interfaceType"] == "efa"


def test_plan_json_has_the_documented_shape(capsys):
    assert main(["plan", "aws-prod", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"stack", "resources", "outputs", "functions", "estimate"}
    assert doc["stack"] == "aws-prod"
    for r in doc["resources"]:
        assert {"type", "name", "parent", "provider", "inputs", "protect", "dependencies"} <= set(r)
    types = {r["type"] for r in doc["resources"]}
    assert "aws:fsx/lustreFileSystem:LustreFileSystem" in types
    fsx = next(r for r in doc["resources"] if r["type"] == "aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fsx["inputs"]["storageCapacity"] == 19200 and fsx["parent"].endswith("-fsx")
    by_name = {r["name"]: r for r in doc["resources"]}
    assert fsx["protect"] is True and "ftfleet-aws-prod-net-fsx-cluster-988" in fsx["dependencies"]
    workers = {r["inputs"]["instanceType"]: r for r in doc["resources"] if "-fleet-worker-" in r["name"]}
    assert {t: len(r["inputs"]["networkInterfaces"]) for t, r in workers.items()} == {
        "p5.48xlarge": 32,
        "p5e.48xlarge": 32,
        "p5en.48xlarge": 16,
    }
    assert "ftfleet-aws-prod-fsx-export" in workers["p5.48xlarge"]["dependencies"]
    key_policy = json.loads(by_name["ftfleet-aws-prod-kms-key"]["inputs"]["policy"])
    assert "FsxExportToSseKmsBucket" in {st["Sid"] for st in key_policy["Statement"]}
    self_out = by_name["ftfleet-aws-prod-net-cluster-self-out"]["inputs"]
    assert self_out["securityGroupId"] == self_out["referencedSecurityGroupId"]
    est = doc["estimate"]
    assert "ESTIMATE" in est["label"] and est["prices_as_of"]
    assert 0 < est["fleet_usd_per_hour"]["with_spot"] < est["fleet_usd_per_hour"]["all_on_demand"]


def test_plan_table_lists_every_resource_and_the_estimate(capsys):
    assert main(["plan", "aws-dev"]) == 0
    out = capsys.readouterr().out
    rec = recording("aws-dev")
    for r in rec.resources:
        if r.custom and not r.type.startswith("pulumi:providers:"):
            assert r.name in out
    assert "ESTIMATE" in out and "/hour with spot" in out and "FSx for Lustre" in out
