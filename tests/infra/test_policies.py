"""Each invariant catches its violation, and the CrossGuard pack runs the same checks."""

from __future__ import annotations

import base64
import json

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from ftfleet.infra import policies
from ftfleet.infra.crossguard import build_policies
from tests.infra.conftest import recording, res_view

OPTS = PolicyResourceOptions(
    protect=False,
    ignore_changes=[],
    delete_before_replace=None,
    aliases=[],
    custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
    additional_secret_outputs=[],
)


def res(type_token, props, name="r", **kw):
    return policies.Res(type=type_token, name=name, urn=f"urn:{name}", props=props, **kw)


BAD_RESOURCES = {
    "s3-versioning-enabled": res(
        "aws:s3/bucketVersioning:BucketVersioning", {"versioningConfiguration": {"status": "Suspended"}}
    ),
    "s3-kms-encrypted": res(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        {
            "rules": [
                {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}, "blockedEncryptionTypes": ["SSE-C"]}
            ]
        },
    ),
    "s3-sse-c-blocked": res(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        {
            "rules": [
                {
                    "applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": "k"},
                    "blockedEncryptionTypes": ["NONE"],
                }
            ]
        },
    ),
    "s3-public-access-blocked": res(
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        {"blockPublicAcls": True, "blockPublicPolicy": False, "ignorePublicAcls": True, "restrictPublicBuckets": True},
    ),
    "s3-tls-only": res(
        "aws:s3/bucketPolicy:BucketPolicy",
        {
            "policy": json.dumps(
                {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteBucket", "Resource": "*"}]}
            )
        },
    ),
    "ec2-imdsv2-required": res(
        "aws:ec2/launchTemplate:LaunchTemplate", {"metadataOptions": {"httpTokens": "optional"}}
    ),
    "no-world-ingress": res(
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        {"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 22, "toPort": 22},
    ),
    "iam-no-star-star": res(
        "aws:iam/rolePolicy:RolePolicy",
        {"policy": json.dumps({"Statement": [{"Sid": "Admin", "Effect": "Allow", "Action": "*", "Resource": "*"}]})},
    ),
    "fsx-valid": res(
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        {"deploymentType": "PERSISTENT_2", "storageCapacity": 3000, "perUnitStorageThroughput": 125},
        protect=True,
    ),
    "ec2-node-image-pinned": res(
        "aws:ec2/launchTemplate:LaunchTemplate",
        {
            "imageId": "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base/latest/ami-id",
            "metadataOptions": {"httpTokens": "required"},
        },
    ),
    "ec2-user-data-within-limit": res(
        "aws:ec2/launchTemplate:LaunchTemplate",
        {
            "userData": base64.b64encode(b"#!/bin/bash\n" + b"#" * 16_384).decode(),
            "metadataOptions": {"httpTokens": "required"},
        },
    ),
    "route53-changes-scoped": res(
        "aws:iam/rolePolicy:RolePolicy",
        {
            "policy": json.dumps(
                {
                    "Statement": [
                        {
                            "Sid": "Publish",
                            "Effect": "Allow",
                            "Action": ["route53:ChangeResourceRecordSets"],
                            "Resource": ["arn:aws:route53:::hostedzone/Z1"],
                            "Condition": {
                                "ForAllValues:StringEquals": {"route53:ChangeResourceRecordSetsRecordTypes": ["A"]}
                            },
                        }
                    ]
                }
            )
        },
    ),
    "spot-diversified": res(
        "aws:autoscaling/group:Group",
        {
            "tags": [{"key": "ftfleet:role", "value": "worker"}],
            "mixedInstancesPolicy": {
                "instancesDistribution": {"onDemandPercentageAboveBaseCapacity": 0},
                "launchTemplate": {"overrides": [{"instanceType": "p5.48xlarge"}]},
            },
        },
    ),
    "ecr-replication-valid": res(
        "aws:ecr/replicationConfiguration:ReplicationConfiguration",
        {
            "replicationConfiguration": {
                "rules": [{"destinations": [], "repositoryFilters": [{"filter": "ftfleet", "filterType": "EXACT"}]}]
            }
        },
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_RESOURCES))
def test_resource_policy_reports_its_violation(name):
    resource_policies = [p for p in policies.POLICIES if not p.stack]
    found = [p.name for p in resource_policies if p.check(BAD_RESOURCES[name])]
    assert found == [name]


def test_world_ingress_is_caught_in_inline_security_group_rules_too():
    sg = res("aws:ec2/securityGroup:SecurityGroup", {"ingress": [{"cidrBlocks": ["10.0.0.0/8", "0.0.0.0/0"]}]})
    assert policies.no_world_ingress(sg) == ["ingress open to 0.0.0.0/0"]


def test_a_bucket_without_guards_and_a_same_region_replica_are_caught():
    b1 = res("aws:s3/bucket:Bucket", {}, name="b1", region="us-east-1")
    b2 = res("aws:s3/bucket:Bucket", {}, name="b2", region="us-east-1")
    repl = res(
        "aws:s3/bucketReplicationConfig:BucketReplicationConfig",
        {},
        name="repl",
        property_dependencies={"bucket": ["urn:b1"], "rules": ["urn:b2"]},
    )
    found = policies.evaluate([b1, b2, repl])
    assert ("s3-replication-cross-region", "repl", "replica b2 is in the source's region us-east-1") in found
    assert sum(1 for v in found if v[0] == "s3-buckets-guarded") == 8


def test_a_coordinator_that_may_run_on_spot_is_caught():
    coord = res(
        "aws:autoscaling/group:Group",
        {
            "tags": [{"key": "ftfleet:role", "value": "coordinator"}],
            "mixedInstancesPolicy": {"instancesDistribution": {"onDemandPercentageAboveBaseCapacity": 0}},
        },
    )
    assert [v[0] for v in policies.evaluate([coord])] == ["coordinator-on-demand"]


def test_dev_stack_is_only_advised_about_spot_diversity():
    found = policies.evaluate(res_view(recording("aws-dev")))
    assert found == []  # dev spreads over three types too


def _opts(r):
    return PolicyResourceOptions(
        protect=r.protect,
        ignore_changes=[],
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
        additional_secret_outputs=[],
    )


def _policy_resource(rec, r, providers):
    # Outputs carry the id, as the engine's do once a resource exists.
    return PolicyResource(
        resource_type=r.type,
        props={**r.inputs, "id": r.id},
        urn=r.urn,
        name=r.name,
        opts=_opts(r),
        provider=providers.get(r.provider),
        parent=None,
        dependencies=[],
        property_dependencies={},
    )


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_crossguard_pack_passes_the_recorded_stack_and_rejects_a_bad_resource(stack):
    rec = recording(stack)
    pack = {p.name: p for p in build_policies()}
    assert set(pack) == {p.name for p in policies.POLICIES}
    violations = []
    for r in rec.resources:
        args = ResourceValidationArgs(
            resource_type=r.type, props=r.inputs, urn=r.urn, name=r.name, opts=_opts(r), provider=None, config={}
        )
        for p in pack.values():
            if hasattr(p, "validate") and type(p).__name__ == "ResourceValidationPolicy":
                p.validate(args, lambda msg, urn=None, _p=p.name, _r=r.name: violations.append((_p, _r, msg)))
    # Stack policies, with property dependencies resolved to PolicyResources.
    providers = {
        r.urn: PolicyProviderResource(resource_type=r.type, props=r.inputs, urn=r.urn, name=r.name)
        for r in rec.resources
        if r.type.startswith("pulumi:providers:")
    }
    base = {r.urn: _policy_resource(rec, r, providers) for r in rec.resources}
    for r in rec.resources:
        base[r.urn].property_dependencies = {
            k: [base[u] for u in v if u in base] for k, v in r.property_dependencies.items()
        }
        base[r.urn].dependencies = [base[u] for u in r.dependencies if u in base]
    stack_args = StackValidationArgs(resources=list(base.values()), config={})
    for p in pack.values():
        if type(p).__name__ == "StackValidationPolicy":
            p.validate(stack_args, lambda msg, urn=None, _p=p.name: violations.append((_p, urn, msg)))
    assert violations == []

    bad = BAD_RESOURCES["ec2-imdsv2-required"]
    reported = []
    pack["ec2-imdsv2-required"].validate(
        ResourceValidationArgs(
            resource_type=bad.type, props=bad.props, urn=bad.urn, name=bad.name, opts=OPTS, provider=None, config={}
        ),
        lambda msg, urn=None: reported.append(msg),
    )
    assert reported == ["metadata httpTokens is 'optional'; require IMDSv2"]


def test_an_instance_tag_key_metadata_cannot_serve_is_caught():
    template = res(
        "aws:ec2/launchTemplate:LaunchTemplate",
        {
            "metadataOptions": {"instanceMetadataTags": "enabled"},
            "tagSpecifications": [
                {"resourceType": "instance", "tags": {"cost center": "x", "ok:key": "y"}},
                {"resourceType": "volume", "tags": {"vol/tag": "z"}},  # volumes are not in metadata
            ],
        },
        name="lt",
    )
    group = res("aws:autoscaling/group:Group", {"tags": [{"key": "_index", "value": "1", "propagateAtLaunch": True}]})
    provider = res("pulumi:providers:aws", {"defaultTags": json.dumps({"tags": {"a/b": "c"}})}, name="primary")
    found = [(n, m) for p, n, m in policies.evaluate([template, group, provider]) if p == "ec2-metadata-tag-keys"]
    assert [n for n, _ in found] == ["lt", "r", "primary"]
    assert "'cost center'" in found[0][1] and "reserved in instance metadata" in found[1][1]
    off = res("aws:ec2/launchTemplate:LaunchTemplate", {"metadataOptions": {"instanceMetadataTags": "disabled"}})
    assert [v for v in policies.evaluate([off, group, provider]) if v[0] == "ec2-metadata-tag-keys"] == []


def test_an_object_read_and_written_by_its_key_must_be_listable_by_it():
    """The run lease: without a listing of its key a missing object answers 403, and the
    first holder cannot create it (GetObject, Amazon S3 API Reference)."""
    hold = {
        "Sid": "HoldRunLease",
        "Effect": "Allow",
        "Action": ["s3:GetObject", "s3:PutObject"],
        "Resource": ["arn:aws:s3:::b/ftfleet-leases/r.json"],
    }
    find = {
        "Sid": "FindRunLease",
        "Effect": "Allow",
        "Action": ["s3:ListBucket"],
        "Resource": ["arn:aws:s3:::b"],
        "Condition": {"StringEquals": {"s3:prefix": ["ftfleet-leases/r.json"]}},
    }

    def found(*statements):
        doc = json.dumps({"Version": "2012-10-17", "Statement": list(statements)})
        r = res("aws:iam/rolePolicy:RolePolicy", {"policy": doc})
        return [m for p, _, m in policies.evaluate([r]) if p == "s3-conditional-objects-findable"]

    (problem,) = found(hold)
    assert "HoldRunLease" in problem and "ftfleet-leases/r.json" in problem
    assert found(hold, find) == []
    elsewhere = {**find, "Condition": {"StringEquals": {"s3:prefix": ["ftfleet-leases/other.json"]}}}
    assert len(found(hold, elsewhere)) == 1
    # Grants on prefixes, or reads alone, are not such objects.
    assert found({**hold, "Resource": ["arn:aws:s3:::b/checkpoints/r/*"]}, {**hold, "Action": ["s3:GetObject"]}) == []


def test_ecr_replication_within_ecrs_limits_and_before_the_repository_it_fills():
    rule = {"destinations": [{"region": "us-west-2", "registryId": "123456789012"}]}
    eleven = res(
        "aws:ecr/replicationConfiguration:ReplicationConfiguration",
        {"replicationConfiguration": {"rules": [rule] * 11}},
    )
    assert policies.ecr_replication_valid(eleven) == ["11 rules; ECR takes 1 to 10"]
    filtered = {**rule, "repositoryFilters": [{"filter": "ftfleet-aws-prod/", "filterType": "PREFIX_MATCH"}]}
    repo = res("aws:ecr/repository:Repository", {"name": "ftfleet-aws-prod/trainer"}, name="repo", region="us-west-2")
    config = res(
        "aws:ecr/replicationConfiguration:ReplicationConfiguration",
        {"replicationConfiguration": {"rules": [filtered]}},
        name="config",
        region="us-east-1",
    )
    assert policies.ecr_replication_finds_its_repository([repo, config]) == [
        ("config", "replicates into ftfleet-aws-prod/trainer in us-west-2 without waiting for it")
    ]
    config.dependencies = [repo.urn]
    assert policies.ecr_replication_finds_its_repository([repo, config]) == []
    elsewhere = res("aws:ecr/repository:Repository", {"name": "other/trainer"}, name="o", region="us-west-2")
    assert policies.ecr_replication_finds_its_repository([elsewhere, config]) == []
