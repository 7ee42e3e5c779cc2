"""What AWS checks at create time or on the node, read off the declared resources:
EFA per network card, the FSx grant in the key policy, the security group rules and
the order in which things must exist."""

from __future__ import annotations

import json

from ftfleet.infra import catalog
from ftfleet.infra.aws import kms
from tests.infra.conftest import recording
from tests.infra.test_components import one

LT = "aws:ec2/launchTemplate:LaunchTemplate"
GROUP = "aws:autoscaling/group:Group"


def test_every_instance_type_has_its_own_launch_template_with_one_efa_interface_per_network_card():
    rec = recording("aws-prod")
    templates = {lt.inputs["instanceType"]: lt for lt in rec.of_type(LT) if "-worker-" in lt.name}
    assert set(templates) == {"p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"}
    counts = {t: len(lt.inputs["networkInterfaces"]) for t, lt in templates.items()}
    assert counts == {"p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16}
    for t, lt in [*templates.items(), ("p5.48xlarge", one(rec, LT, "-coordinator"))]:
        interfaces = lt.inputs["networkInterfaces"]
        assert len(interfaces) == catalog.instance("aws", t).network_cards
        assert [i["networkCardIndex"] for i in interfaces] == list(range(len(interfaces)))
        assert [i["deviceIndex"] for i in interfaces] == [0] + [1] * (len(interfaces) - 1)
        assert {i["interfaceType"] for i in interfaces} == {"efa"}


def test_the_worker_group_names_each_types_template_in_its_overrides():
    rec = recording("aws-prod")
    ids = {lt.inputs["instanceType"]: lt.id for lt in rec.of_type(LT) if "-worker-" in lt.name}
    lt = one(rec, GROUP, "-workers").inputs["mixedInstancesPolicy"]["launchTemplate"]
    overrides = {o["instanceType"]: o["launchTemplateSpecification"] for o in lt["overrides"]}
    assert {t: spec["launchTemplateId"] for t, spec in overrides.items()} == ids
    assert all(spec["version"] == "1" for spec in overrides.values())
    assert lt["launchTemplateSpecification"]["launchTemplateId"] == ids["p5.48xlarge"]


def test_without_efa_templates_carry_the_security_group_and_no_interfaces():
    for lt in recording("aws-dev").of_type(LT):
        assert "networkInterfaces" not in lt.inputs and lt.inputs["vpcSecurityGroupIds"]


def test_the_cluster_group_sends_all_traffic_to_itself_for_efa():
    rec = recording("aws-prod")
    cluster = one(rec, "aws:ec2/securityGroup:SecurityGroup", "-cluster")
    egress = rec.of_type("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    assert any(
        r.inputs["securityGroupId"] == cluster.id
        and r.inputs.get("referencedSecurityGroupId") == cluster.id
        and r.inputs["ipProtocol"] == "-1"
        for r in egress
    )


def test_lustre_clients_admit_the_file_servers_on_988_and_1018_to_1023():
    rec = recording("aws-dev")
    cluster = one(rec, "aws:ec2/securityGroup:SecurityGroup", "-cluster")
    fsx = one(rec, "aws:ec2/securityGroup:SecurityGroup", "-fsx")
    rules = [
        r
        for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs["securityGroupId"] == cluster.id and r.inputs.get("referencedSecurityGroupId") == fsx.id
    ]
    assert {(r.inputs["fromPort"], r.inputs["toPort"]) for r in rules} == {(988, 988), (1018, 1023)}
    assert all(r.inputs["ipProtocol"] == "tcp" for r in rules)


def test_the_file_system_waits_for_every_ingress_rule_of_its_group():
    rec = recording("aws-prod")
    fsx = one(rec, "aws:ec2/securityGroup:SecurityGroup", "-fsx")
    rules = {
        r.urn
        for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs["securityGroupId"] == fsx.id
    }
    assert len(rules) == 4
    assert rules <= set(one(rec, "aws:fsx/lustreFileSystem:LustreFileSystem").dependencies)


def test_launch_templates_wait_for_the_association_and_the_node_role_policies():
    rec = recording("aws-prod")
    association = one(rec, "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    policies = {
        r.urn
        for r in rec.resources
        if r.type in ("aws:iam/rolePolicy:RolePolicy", "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        and "-nodes-" in r.name
    }
    assert len(policies) == 5
    for lt in rec.of_type(LT):
        assert {association.urn, *policies} <= set(lt.dependencies), lt.name


def test_the_key_of_the_exported_bucket_lets_fsx_s3_access_roles_use_it_through_s3_only():
    rec = recording("aws-prod")
    policy = json.loads(one(rec, "aws:kms/key:Key", "-kms-key").inputs["policy"])
    grant = next(st for st in policy["Statement"] if st["Sid"] == "FsxExportToSseKmsBucket")
    cond = grant["Condition"]
    assert cond["ArnLike"]["aws:PrincipalArn"] == (
        "arn:aws:iam::123456789012:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
        "AWSServiceRoleForFSxS3Access_fs-*"
    )
    assert cond["StringEquals"] == {"kms:CallerAccount": "123456789012", "kms:ViaService": "s3.us-east-1.amazonaws.com"}
    assert set(grant["Action"]) == set(kms.FSX_S3_KMS_ACTIONS)
    # A standby's file system exports to the replica bucket: its key grants the same,
    # through S3 in the replica region only.
    replica = json.loads(one(rec, "aws:kms/replicaKey:ReplicaKey").inputs["policy"])
    assert [st["Sid"] for st in replica["Statement"]] == ["DelegateToAccountIam", "FsxExportToSseKmsBucket"]
    assert replica["Statement"][1]["Condition"]["StringEquals"]["kms:ViaService"] == "s3.us-west-2.amazonaws.com"


def test_buckets_keys_and_the_file_system_are_protected():
    rec = recording("aws-prod")
    stateful = [
        r
        for r in rec.resources
        if r.type
        in (
            "aws:s3/bucket:Bucket",
            "aws:kms/key:Key",
            "aws:kms/replicaKey:ReplicaKey",
            "aws:fsx/lustreFileSystem:LustreFileSystem",
        )
    ]
    # checkpoint buckets and keys, the file system, the audit trail's log bucket and key
    assert len(stateful) == 7 and all(r.protect for r in stateful)
    assert not one(rec, GROUP, "-workers").protect


def test_the_one_coordinator_is_replaced_launch_first_and_workers_never_drop_below_desired():
    rec = recording("aws-prod")
    for suffix, (low, high) in (("-coordinator", (100, 200)), ("-workers", (100, 110))):
        group = one(rec, GROUP, suffix)
        prefs = group.inputs["instanceRefresh"]["preferences"]
        assert (prefs["minHealthyPercentage"], prefs["maxHealthyPercentage"]) == (low, high)
        policy = group.inputs["instanceMaintenancePolicy"]
        assert (policy["minHealthyPercentage"], policy["maxHealthyPercentage"]) == (low, high)


def test_iam_resources_carry_the_stack_tags_through_the_tagged_provider():
    rec = recording("aws-dev")
    providers = {r.urn: r for r in rec.resources if r.type == "pulumi:providers:aws"}
    iam = [r for r in rec.resources if r.type.startswith("aws:iam/")]
    assert iam
    for r in iam:
        tags = json.loads(providers[r.provider].inputs["defaultTags"])["tags"]  # providers take JSON
        assert tags["ftfleet:stack"] == "aws-dev" and tags["team"] == "ml-platform", r.name


def test_node_roles_use_the_checkpoint_keys_only_through_s3_in_each_keys_region():
    rec = recording("aws-prod")
    policy = json.loads(one(rec, "aws:iam/rolePolicy:RolePolicy", "-worker-checkpoints").inputs["policy"])
    kms_statements = [st for st in policy["Statement"] if any(a.startswith("kms:") for a in st["Action"])]
    vias = {st["Resource"][0].split(":")[3]: st["Condition"]["StringEquals"]["kms:ViaService"] for st in kms_statements}
    assert vias == {"us-east-1": "s3.us-east-1.amazonaws.com", "us-west-2": "s3.us-west-2.amazonaws.com"}
