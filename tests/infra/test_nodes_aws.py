"""What the AWS program gives its nodes: one AMI per deployment, no nodes before the
image, the coordinator's name, and the node roles' grants for the boot."""

from __future__ import annotations

import json

import pytest

from ftfleet import contract
from ftfleet.infra import offline, stackfile
from ftfleet.infra.aws import dns, userdata
from tests.infra.conftest import recording

DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"


def one(rec, type_token, suffix=""):
    found = [r for r in rec.of_type(type_token) if r.name.endswith(suffix)]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def groups(rec) -> dict[str, dict]:
    return {r.name.rsplit("-", 1)[-1]: r.inputs for r in rec.of_type("aws:autoscaling/group:Group")}


def policy(rec, suffix) -> dict[str, dict]:
    doc = json.loads(one(rec, "aws:iam/rolePolicy:RolePolicy", suffix).inputs["policy"])
    return {s["Sid"]: s for s in doc["Statement"]}


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_every_node_of_a_deployment_boots_the_one_ami_resolved_for_it(stack):
    rec = recording(stack)
    (lookup,) = [i for i in rec.invokes if i[0] == "aws:ssm/getParameter:getParameter"]
    _, args, provider = lookup
    assert args == {"name": DLAMI}
    assert provider.endswith("::primary")
    images = {lt.inputs["imageId"] for lt in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate")}
    assert images == {rec.outputs["node_image"]}
    assert rec.outputs["node_image"].startswith("ami-")


def test_a_pinned_ami_is_used_as_is_and_nothing_is_resolved(variant):
    rec = variant(imageId="ami-0123456789abcdef0")
    assert not [i for i in rec.invokes if i[0] == "aws:ssm/getParameter:getParameter"]
    images = {lt.inputs["imageId"] for lt in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate")}
    assert images == {"ami-0123456789abcdef0"} and rec.outputs["node_image"] == "ami-0123456789abcdef0"


def test_until_the_image_is_pushed_both_groups_hold_at_zero_nodes_and_say_so():
    rec = offline.run(stackfile.load("aws-prod"), registry_tags=("0.0.9",))
    sizes = groups(rec)
    assert (sizes["coordinator"]["minSize"], sizes["coordinator"]["desiredCapacity"]) == (0, 0)
    assert (sizes["workers"]["minSize"], sizes["workers"]["desiredCapacity"]) == (0, 0)
    assert sizes["workers"]["maxSize"] == 32
    status = rec.outputs["fleet_status"]
    assert status.startswith("held at 0 nodes:") and rec.outputs["trainer_image"] in status
    assert "README: AWS: first deploy" in status and "\n" not in status


def test_once_the_image_is_pushed_the_groups_take_their_configured_sizes():
    rec = recording("aws-prod")
    (lookup,) = [i for i in rec.invokes if i[0] == "aws:ecr/getImages:getImages"]
    assert lookup[1] == {"repositoryName": "ftfleet-aws-prod/trainer"}
    sizes = groups(rec)
    assert (sizes["coordinator"]["minSize"], sizes["coordinator"]["desiredCapacity"]) == (1, 1)
    assert (sizes["workers"]["minSize"], sizes["workers"]["desiredCapacity"]) == (2, 16)
    assert rec.outputs["fleet_status"].startswith("running:")


def test_the_coordinator_may_upsert_only_its_own_a_record_and_read_change_status():
    rec = recording("aws-prod")
    statements = policy(rec, "-coordinator-dns")
    assert set(statements) == {"PublishCoordinatorAddress", "WaitForCoordinatorAddress"}
    publish = statements["PublishCoordinatorAddress"]
    zone = one(rec, "aws:route53/zone:Zone")
    assert publish["Action"] == ["route53:ChangeResourceRecordSets"]
    assert publish["Resource"] == [zone.outputs["arn"]]
    assert publish["Condition"] == {
        "ForAllValues:StringEquals": {
            "route53:ChangeResourceRecordSetsNormalizedRecordNames": ["coordinator.aws-prod.ftfleet.internal"],
            "route53:ChangeResourceRecordSetsRecordTypes": ["A"],
            "route53:ChangeResourceRecordSetsActions": ["UPSERT"],
        }
    }
    wait = statements["WaitForCoordinatorAddress"]
    assert wait["Action"] == ["route53:GetChange"] and wait["Resource"] == ["arn:aws:route53:::change/*"]


def test_the_record_name_in_the_grant_is_the_name_the_coordinator_writes():
    rec = recording("aws-dev")
    granted = policy(rec, "-coordinator-dns")["PublishCoordinatorAddress"]["Condition"]
    (name,) = granted["ForAllValues:StringEquals"]["route53:ChangeResourceRecordSetsNormalizedRecordNames"]
    assert rec.outputs["coordinator_address"].startswith(f"{name}:{contract.RDZV_PORT} ")


@pytest.mark.parametrize(
    "name, normalized",
    [
        ("coordinator.aws-dev.ftfleet.internal.", "coordinator.aws-dev.ftfleet.internal"),
        ("Coordinator.My_Stack.ftfleet.internal", "coordinator.my_stack.ftfleet.internal"),
        ("*.a b.internal", "\\052.a\\040b.internal"),
    ],
)
def test_record_names_are_normalized_as_route53s_condition_key_compares_them(name, normalized):
    assert dns.normalized_record_name(name) == normalized


@pytest.mark.parametrize("role", ["coordinator", "worker"])
def test_a_node_may_replace_itself_only_in_this_stacks_groups(role):
    rec = recording("aws-prod")
    statements = policy(rec, f"-{role}-checkpoints")
    replace = statements["ReplaceSelfInStackGroups"]
    assert sorted(replace["Action"]) == [
        "autoscaling:SetInstanceHealth",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    (pattern,) = replace["Resource"]
    assert pattern == (
        f"arn:aws:autoscaling:us-east-1:{offline.MOCK_ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/ftfleet-aws-prod-*"
    )
    assert replace["Condition"] == {"StringEquals": {"aws:ResourceTag/ftfleet:stack": "aws-prod"}}
    for group in rec.of_type("aws:autoscaling/group:Group"):
        assert group.outputs["name"].startswith("ftfleet-aws-prod-")
        tags = {t["key"]: t["value"] for t in group.inputs["tags"]}
        assert tags["ftfleet:stack"] == "aws-prod"


@pytest.mark.parametrize("role", ["coordinator", "worker"])
def test_a_node_may_complete_lifecycle_actions_only_in_this_stacks_groups(role):
    rec = recording("aws-prod")
    statements = policy(rec, f"-{role}-checkpoints")
    complete = statements["CompleteOwnLifecycleAction"]
    assert complete["Action"] == ["autoscaling:CompleteLifecycleAction"]
    assert complete["Resource"] == statements["ReplaceSelfInStackGroups"]["Resource"]
    assert complete["Condition"] == {"StringEquals": {"aws:ResourceTag/ftfleet:stack": "aws-prod"}}


def test_a_node_records_and_counts_replacements_only_under_its_runs_prefix():
    rec = recording("aws-prod")
    statements = policy(rec, "-worker-checkpoints")
    bucket = one(rec, "aws:s3/bucket:Bucket", "-primary").outputs["arn"]
    prefix = f"{contract.REPLACEMENTS_PREFIX}llm-prod/"
    assert statements["RecordSelfReplacement"]["Action"] == ["s3:PutObject"]
    assert statements["RecordSelfReplacement"]["Resource"] == [f"{bucket}/{prefix}*"]
    count = statements["CountSelfReplacements"]
    assert count["Action"] == ["s3:ListBucket"] and count["Resource"] == [bucket]
    assert count["Condition"] == {"StringLike": {"s3:prefix": [f"{prefix}*"]}}
    helper = contract.replacement_key("llm-prod", "worker", 1767225600, "i-0")
    assert helper.startswith(prefix)


def test_the_zone_forgets_a_missing_name_within_seconds():
    rec = recording("aws-prod")
    zone = one(rec, "aws:route53/zone:Zone")
    soa = one(rec, "aws:route53/record:Record", "-soa")
    assert soa.inputs["type"] == "SOA" and soa.inputs["allowOverwrite"] is True
    assert soa.inputs["zoneId"] == zone.outputs["zoneId"] and soa.inputs["name"] == zone.outputs["name"]
    (value,) = soa.inputs["records"]
    fields = value.split()
    assert fields[0] == "ns-1536.awsdns-00.co.uk." and len(fields) == 7
    # Resolvers cache a miss for min(SOA TTL, SOA minimum) (RFC 2308).
    assert min(soa.inputs["ttl"], int(fields[-1])) == userdata.RECORD_TTL


def test_spare_nodes_are_extra_desired_capacity_of_the_worker_group(variant):
    plain, spared = groups(variant()), groups(variant(spareNodes=1))
    assert spared["workers"]["desiredCapacity"] == plain["workers"]["desiredCapacity"] + 1
    assert spared["workers"]["minSize"] == plain["workers"]["minSize"]
    assert spared["coordinator"] == plain["coordinator"]
