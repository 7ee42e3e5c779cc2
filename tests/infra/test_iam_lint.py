"""Every identity policy the program declares passes an IAM linter that knows AWS's
actions and resource ARN formats (parliament), and the offline mocks give every
resource the ARN shape AWS does, so the linter sees what AWS would.

Linted: every identity policy (inline role, user and group policies, managed
policies), with parliament's community auditors, at every severity (LOW and up).
Not linted: trust policies and key or bucket policies. They are resource policies,
which parliament reads as identity policies: it calls a trust policy malformed for
having no Resource, and a key policy's `"Resource": "*"` unnecessary, although in a key
policy `*` means the key itself (AWS KMS Developer Guide, "Key policies").

One finding is suppressed, narrowly: CREDENTIALS_EXPOSURE for `ecr:GetAuthorizationToken`.
A node cannot pull the trainer image without an ECR login token, and the token grants
no more than the role's ECR statements allow: pull from the one repository.

And one role is exempt from two findings by design: storage_drift's job is to put back a
bucket's policy and lifecycle rules and the FSx association, so it holds
s3:PutBucketPolicy and s3:PutLifecycleConfiguration (RESOURCE_POLICY_PRIVILEGE_ESCALATION)
on this stack's two checkpoint buckets only, and the iam actions FSx's
CreateDataRepositoryAssociation needs on FSx's own service-linked role path
(PERMISSIONS_MANAGEMENT_ACTIONS; FSx for Lustre guide, "Using service-linked roles").
`test_the_storage_drift_exemption_is_scoped` holds those grants to exactly that.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from ftfleet.infra import offline
from tests.infra.conftest import recording

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # parliament imports the deprecated pkg_resources
    import parliament

IDENTITY_POLICIES = (
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/policy:Policy",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
)
SUPPRESSED = {("CREDENTIALS_EXPOSURE", "ecr:getauthorizationtoken")}  # parliament lowercases actions
STORAGE_DRIFT = "-remediation-storage-drift-policy"
STORAGE_DRIFT_EXEMPT = {"RESOURCE_POLICY_PRIVILEGE_ESCALATION", "PERMISSIONS_MANAGEMENT_ACTIONS"}
FSX_SERVICE_ROLE_PATH = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"

parliament.override_config(Path(parliament.__file__).parent / "community_auditors" / "config_override.yaml")


def lint(policy: str) -> list[tuple[str, str, str]]:
    """(issue, severity, detail) of every finding that is not suppressed."""
    found = []
    for f in parliament.analyze_policy_string(policy, include_community_auditors=True).findings:
        f = parliament.enhance_finding(f)
        actions = {a.lower() for a in (f.location or {}).get("actions", [])}
        if actions and all((f.issue, a) in SUPPRESSED for a in actions):
            continue
        found.append((f.issue, f.severity, json.dumps(f.detail, default=str)))
    return found


def identity_policies(stack: str) -> list[tuple[str, str]]:
    rec = recording(stack)
    return [(r.name, r.inputs["policy"]) for r in rec.resources if r.type in IDENTITY_POLICIES]


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_every_identity_policy_passes_the_iam_linter(stack):
    policies = identity_policies(stack)
    assert len(policies) >= 4  # node roles (checkpoints, DNS) and the replication role
    found = {
        name: [f for f in lint(policy) if not (name.endswith(STORAGE_DRIFT) and f[0] in STORAGE_DRIFT_EXEMPT)]
        for name, policy in policies
    }
    assert found == {name: [] for name, _ in policies}


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_the_storage_drift_exemption_is_scoped(stack):
    rec = recording(stack)
    buckets = {r.outputs["arn"] for r in rec.of_type("aws:s3/bucket:Bucket") if "-ckpt-" in r.name}
    replication_roles = {r.outputs["arn"] for r in rec.of_type("aws:iam/role:Role") if "replication" in r.name}
    [(_, policy)] = [p for p in identity_policies(stack) if p[0].endswith(STORAGE_DRIFT)]
    for st in json.loads(policy)["Statement"]:
        actions = set(st["Action"])
        if actions & {"s3:PutBucketPolicy", "s3:PutLifecycleConfiguration"}:
            assert set(st["Resource"]) <= buckets, st["Sid"]
        if actions == {"iam:PassRole"}:  # to put back the replication configuration
            assert set(st["Resource"]) <= replication_roles, st["Sid"]
        elif any(a.startswith("iam:") for a in actions):
            assert all(FSX_SERVICE_ROLE_PATH in arn for arn in st["Resource"]), st["Sid"]


def test_the_linter_catches_an_ecr_grant_on_an_arn_without_repository():
    """What the mocks produced before they gave ECR its `repository/` ARNs."""
    name, policy = next(p for p in identity_policies("aws-dev") if p[0].endswith("-worker-checkpoints"))
    doc = json.loads(policy)
    for statement in doc["Statement"]:
        if statement["Sid"] == "PullTrainerImage":
            statement["Resource"] = ["arn:aws:ecr:us-east-1:123456789012:ftfleet-aws-dev/trainer"]
    assert [issue for issue, _, _ in lint(json.dumps(doc))] == ["RESOURCE_MISMATCH"]


def test_the_ecr_login_suppression_covers_nothing_else():
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["redshift:GetClusterCredentials"], "Resource": ["*"]}],
    }
    assert "CREDENTIALS_EXPOSURE" in {issue for issue, _, _ in lint(json.dumps(policy))}


# Type token -> (service prefix, resource type) in parliament's copy of the Service
# Authorization Reference.
ARN_KINDS = {
    "aws:s3/bucket:Bucket": ("s3", "bucket"),
    "aws:ecr/repository:Repository": ("ecr", "repository"),
    "aws:route53/zone:Zone": ("route53", "hostedzone"),
    "aws:fsx/lustreFileSystem:LustreFileSystem": ("fsx", "file-system"),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": ("fsx", "association"),
    "aws:kms/key:Key": ("kms", "key"),
    "aws:kms/replicaKey:ReplicaKey": ("kms", "key"),
    "aws:kms/alias:Alias": ("kms", "alias"),
    "aws:autoscaling/group:Group": ("autoscaling", "autoScalingGroup"),
    "aws:iam/role:Role": ("iam", "role"),
    "aws:iam/instanceProfile:InstanceProfile": ("iam", "instance-profile"),
    "aws:ec2/launchTemplate:LaunchTemplate": ("ec2", "launch-template"),
    "aws:ec2/securityGroup:SecurityGroup": ("ec2", "security-group"),
    "aws:ec2/placementGroup:PlacementGroup": ("ec2", "placement-group"),
    "aws:ec2/vpc:Vpc": ("ec2", "vpc"),
    "aws:ec2/subnet:Subnet": ("ec2", "subnet"),
    "aws:sqs/queue:Queue": ("sqs", "queue"),
    "aws:sns/topic:Topic": ("sns", "topic"),
    "aws:lambda/function:Function": ("lambda", "function"),
    "aws:cloudwatch/eventRule:EventRule": ("events", "rule-on-default-event-bus"),
    "aws:cloudwatch/logGroup:LogGroup": ("logs", "log-group"),
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("cloudwatch", "alarm"),
    "aws:ssm/parameter:Parameter": ("ssm", "parameter"),
    "aws:dynamodb/table:Table": ("dynamodb", "table"),
}


def aws_arn_pattern(prefix: str, kind: str) -> re.Pattern:
    service = next(s for s in parliament.iam_definition if s["prefix"] == prefix)
    arn = next(r["arn"] for r in service["resources"] if r["resource"] == kind)
    parts = re.split(r"(\$\{[A-Za-z]+\})", arn)
    fill = {"${Partition}": "aws", "${Account}": r"\d{12}", "${Region}": r"[a-z]{2}(-[a-z]+)+-\d"}
    return re.compile("".join(fill.get(p, "[^:]+") if p.startswith("${") else re.escape(p) for p in parts) + "$")


@pytest.mark.parametrize("typ", sorted(ARN_KINDS))
def test_mock_arns_have_the_shape_aws_gives_each_resource_type(typ):
    pattern = aws_arn_pattern(*ARN_KINDS[typ])
    name = "/ftfleet/x" if typ == "aws:ssm/parameter:Parameter" else "ftfleet-x"
    if typ == "aws:kms/alias:Alias":
        name = "alias/ftfleet-x"
    arn = offline.mock_arn(typ, "us-east-1", name, "fs-0123abc", {"fileSystemId": "fs-0123abc"})
    assert pattern.match(arn), (arn, pattern.pattern)


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_every_recorded_arn_has_the_shape_aws_gives_its_type(stack):
    checked = 0
    for r in recording(stack).resources:
        if r.type in ARN_KINDS and "arn" in r.outputs:
            assert aws_arn_pattern(*ARN_KINDS[r.type]).match(r.outputs["arn"]), (r.type, r.outputs["arn"])
            checked += 1
    assert checked >= 15
