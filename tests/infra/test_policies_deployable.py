"""Each create-time constraint of AWS (infra/policies/deployable.py) catches its violation,
passes the fixed resource, and names an AWS document."""

from __future__ import annotations

import json

import pytest

from ftfleet.infra import policies
from ftfleet.infra.aws import kms
from tests.infra.conftest import recording, res_view
from tests.infra.test_policies import res

LT = "aws:ec2/launchTemplate:LaunchTemplate"
GROUP = "aws:autoscaling/group:Group"
SG = "aws:ec2/securityGroup:SecurityGroup"


def efa_template(itype, cards, name="lt", sg_urn="urn:sg", lt_id=None):
    interfaces = [
        {"deviceIndex": 0 if c == 0 else 1, "networkCardIndex": c, "interfaceType": "efa"} for c in range(cards)
    ]
    return res(
        LT,
        {"instanceType": itype, "networkInterfaces": interfaces, "metadataOptions": {"httpTokens": "required"}},
        name=name,
        property_dependencies={"networkInterfaces": [sg_urn]},
        id=lt_id,
    )


LAUNCH_FIRST = {"minHealthyPercentage": 100, "maxHealthyPercentage": 200}

# Resource policies: a violating resource, then the same resource fixed.
BAD_RESOURCES = {
    "stateful-protected": (
        res("aws:kms/key:Key", {}, protect=False),
        res("aws:kms/key:Key", {}, protect=True),
    ),
    "efa-per-network-card": (efa_template("p5.48xlarge", 1), efa_template("p5.48xlarge", 32)),
    "asg-replacement-bounds": (
        res(GROUP, {"maxSize": 1, "instanceRefresh": {"preferences": {"minHealthyPercentage": 50}}}),
        res(
            GROUP,
            {
                "maxSize": 1,
                "instanceRefresh": {"preferences": {"minHealthyPercentage": 100, "maxHealthyPercentage": 200}},
            },
        ),
    ),
    "iam-kms-via-service": (
        res(
            "aws:iam/rolePolicy:RolePolicy",
            {"policy": json.dumps({"Statement": [{"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": ["k"]}]})},
        ),
        res(
            "aws:iam/rolePolicy:RolePolicy",
            {
                "policy": json.dumps(
                    {
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Action": ["kms:Decrypt"],
                                "Resource": ["k"],
                                "Condition": {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}},
                            }
                        ]
                    }
                )
            },
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_RESOURCES))
def test_resource_policy_catches_its_violation_and_passes_the_fix(name):
    bad, good = BAD_RESOURCES[name]
    resource_policies = [p for p in policies.POLICIES if not p.stack]
    assert [p.name for p in resource_policies if p.check(bad)] == [name]
    assert [p.name for p in resource_policies if p.check(good)] == []


def test_efa_interfaces_on_one_card_twice_or_a_secondary_primary_are_caught():
    lt = efa_template("p5en.48xlarge", 16)
    lt.props["networkInterfaces"][3]["networkCardIndex"] = 2
    lt.props["networkInterfaces"][0]["deviceIndex"] = 1
    assert len(policies.efa_per_network_card(lt)) == 2


def test_the_newer_layout_with_an_ena_primary_and_efa_only_interfaces_is_accepted_too():
    """AWS's guide now also describes an ENA primary plus EFA-only interfaces."""
    lt = efa_template("p5.48xlarge", 32)
    interfaces = [{"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}]
    interfaces += [
        {"networkCardIndex": c, "deviceIndex": 1 if c == 0 else 0, "interfaceType": "efa-only"} for c in range(32)
    ]
    lt.props["networkInterfaces"] = interfaces
    assert policies.efa_per_network_card(lt) == []


def test_replacement_percentages_outside_what_aws_accepts_are_caught():
    group = res(GROUP, {"instanceMaintenancePolicy": {"minHealthyPercentage": 20, "maxHealthyPercentage": 210}})
    assert len(policies.replacement_within_aws_bounds(group)) == 2


def _export_stack(key_policy: str) -> list:
    bucket = res("aws:s3/bucket:Bucket", {}, name="b", region="us-east-1", protect=True)
    key = res("aws:kms/key:Key", {"policy": key_policy}, name="key", protect=True)
    sse = res(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        {},
        name="sse",
        property_dependencies={"bucket": ["urn:b"], "rules": ["urn:key"]},
    )
    dra = res(
        "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
        {},
        name="dra",
        property_dependencies={"dataRepositoryPath": ["urn:b"]},
    )
    return [bucket, key, sse, dra]


def _efa_stack(self_egress: bool) -> list:
    sg = res(SG, {}, name="sg")
    rules = [
        res(
            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            {"ipProtocol": "-1"},
            name="in",
            property_dependencies={"securityGroupId": ["urn:sg"], "referencedSecurityGroupId": ["urn:sg"]},
        ),
        res(
            "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
            {"ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0"},
            name="out-world",
            property_dependencies={"securityGroupId": ["urn:sg"]},
        ),
    ]
    if self_egress:
        rules.append(
            res(
                "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
                {"ipProtocol": "-1"},
                name="out-self",
                property_dependencies={"securityGroupId": ["urn:sg"], "referencedSecurityGroupId": ["urn:sg"]},
            )
        )
    return [sg, *rules, efa_template("p5.48xlarge", 32)]


def _fsx_stack(waits: bool) -> list:
    sg = res(SG, {}, name="fsx-sg")
    rule = res(
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        {"ipProtocol": "tcp", "fromPort": 988, "toPort": 988},
        name="lustre-988",
        property_dependencies={"securityGroupId": ["urn:fsx-sg"]},
    )
    fs = res(
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        {},
        name="fs",
        protect=True,
        property_dependencies={"securityGroupIds": ["urn:fsx-sg"]},
        dependencies=["urn:fsx-sg", *(["urn:lustre-988"] if waits else [])],
    )
    return [sg, rule, fs]


def _fleet_stack(types: list[str]) -> list:
    templates = [efa_template(t, 32 if t.startswith("p5") else 4, name=f"lt-{t}", lt_id=f"lt-{t}") for t in types]
    group = res(
        GROUP,
        {
            "tags": [{"key": "ftfleet:role", "value": "worker"}],
            "mixedInstancesPolicy": {
                "launchTemplate": {
                    "launchTemplateSpecification": {"launchTemplateId": f"lt-{types[0]}"},
                    "overrides": [
                        {"instanceType": t, "launchTemplateSpecification": {"launchTemplateId": f"lt-{t}"}}
                        for t in types
                    ],
                }
            },
        },
        name="workers",
    )
    return [*templates, group]


GRANT = json.dumps({"Statement": [kms.fsx_export_statement("123456789012", "us-east-1")]})
NO_GRANT = json.dumps(
    {"Statement": [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::1:root"}, "Action": "kms:*"}]}
)
WRONG_REGION = json.dumps({"Statement": [kms.fsx_export_statement("123456789012", "us-west-2")]})

# Stack policies: a violating stack, then the same stack fixed.
BAD_STACKS = {
    "fsx-export-key-grant": (_export_stack(NO_GRANT), _export_stack(GRANT)),
    "efa-security-group-self-traffic": (_efa_stack(self_egress=False), _efa_stack(self_egress=True)),
    "fsx-waits-for-security-group-rules": (_fsx_stack(waits=False), _fsx_stack(waits=True)),
    "fleet-one-gpu-generation": (
        _fleet_stack(["p5.48xlarge", "p4d.24xlarge"]),
        _fleet_stack(["p5.48xlarge", "p5e.48xlarge"]),
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_STACKS))
def test_stack_policy_catches_its_violation_and_passes_the_fix(name):
    bad, good = BAD_STACKS[name]
    policy = next(p for p in policies.POLICIES if p.name == name)
    assert policy.stack and policy.check(bad)
    assert policy.check(good) == []
    others = [p.name for p in policies.POLICIES if p.stack and p.name in BAD_STACKS and p.name != name]
    assert [n for n in others if next(p for p in policies.POLICIES if p.name == n).check(good)] == []


def test_a_grant_through_s3_of_another_region_does_not_count():
    assert policies.fsx_export_key_grants_fsx(_export_stack(WRONG_REGION))


def test_a_file_system_whose_group_admits_no_lustre_is_caught():
    sg, rule, fs = _fsx_stack(waits=True)
    rule.props.update(fromPort=22, toPort=22)
    assert policies.fsx_waits_for_its_rules([sg, rule, fs]) == [
        ("fs", "no ingress rule of its security groups admits Lustre on TCP 988")
    ]


def test_an_override_that_launches_from_another_types_template_is_caught():
    stack = _fleet_stack(["p5.48xlarge", "p5en.48xlarge"])
    group = stack[-1]
    group.props["mixedInstancesPolicy"]["launchTemplate"]["overrides"][1]["launchTemplateSpecification"] = {
        "launchTemplateId": "lt-p5.48xlarge"
    }
    assert policies.fleet_one_generation(stack) == [
        ("workers", "p5en.48xlarge launches from lt-p5.48xlarge, made for p5.48xlarge's EFA interfaces")
    ]


def test_a_coordinator_of_another_generation_than_the_workers_is_caught():
    workers = _fleet_stack(["p5.48xlarge"])
    coordinator = _fleet_stack(["p4d.24xlarge"])
    coordinator[-1].props["tags"] = [{"key": "ftfleet:role", "value": "coordinator"}]
    found = policies.fleet_one_generation(workers + coordinator)
    assert ("stack", "the fleet's groups mix GPU generations: ampere-a100, hopper") in found


@pytest.mark.parametrize("policy", [p for p in policies.POLICIES if p.name in {*BAD_RESOURCES, *BAD_STACKS}])
def test_every_aws_constraint_names_its_document(policy):
    doc = policy.check.__doc__ or ""
    assert "https://" in doc and ('"' in doc or "API Reference" in doc), policy.name


def _prod_without(drop) -> list:
    return [r for r in res_view(recording("aws-prod")) if not drop(r)]


def test_on_the_recorded_prod_stack_each_removed_safeguard_is_reported():
    """The policies follow the recording's real links (ids, inputs, depends_on)."""
    assert policies.evaluate(_prod_without(lambda r: False)) == []
    no_self_out = _prod_without(lambda r: r.name.endswith("-cluster-self-out"))
    assert {v[0] for v in policies.evaluate(no_self_out)} == {"efa-security-group-self-traffic"}
    views = res_view(recording("aws-prod"))
    key = next(r for r in views if r.type == "aws:kms/key:Key" and r.name.endswith("-kms-key"))
    key.props = {**key.props, "policy": NO_GRANT}
    assert {v[0] for v in policies.evaluate(views)} == {"fsx-export-key-grant"}
    views = res_view(recording("aws-prod"))
    fs = next(r for r in views if r.type == "aws:fsx/lustreFileSystem:LustreFileSystem")
    fs.dependencies = [u for u in fs.dependencies if "fsx-cluster-988" not in u]
    assert {v[0] for v in policies.evaluate(views)} == {"fsx-waits-for-security-group-rules"}
