"""Every name the program gives (or lets Pulumi generate for) a resource fits what its
service accepts: its length and its characters. Names derive from the stack's, which
ftfleet accepts up to Pulumi's 100 characters (infra/settings.py), so a long stack name
must not produce a name a service refuses at create time.

The limits, each from the service's API reference for the call that creates the
resource (or the quota page it points to):

- IAM roles 64, instance profiles and policies 128 (IAM User Guide, "IAM and AWS STS
  quotas", "IAM name requirements" and character limits);
- S3 buckets 3-63 lowercase letters, digits, dots and hyphens (S3 User Guide, "General
  purpose bucket naming rules");
- Lambda function names 64 (Lambda API Reference, "CreateFunction", FunctionName);
- SQS queue names 80 (SQS Developer Guide, "Amazon SQS queue quotas");
- EventBridge rule names 64 (EventBridge API Reference, "PutRule", Name);
- CloudWatch Logs log group names 512 ("CreateLogGroup"), alarm names 255
  ("PutMetricAlarm"), dashboard names 255 ("PutDashboard");
- SNS topic names 256 ("CreateTopic"); CloudTrail trail names 3-128 ("CreateTrail");
- KMS alias names 256 with the ``alias/`` prefix ("CreateAlias");
- ECR repository names 256 ("CreateRepository");
- EC2 launch template names 128 ("CreateLaunchTemplate"), security group names 255
  ("CreateSecurityGroup"), placement group names 255 ("CreatePlacementGroup");
- Auto Scaling group names 255 ("CreateAutoScalingGroup");
- Route 53 zone names: labels of at most 63 characters, 255 in all (RFC 1035 2.3.4,
  Route 53 Developer Guide, "DNS domain name format").

A resource the program does not name gets Pulumi's auto-name: its logical name, a
hyphen and 7 random hex characters (Pulumi docs, "Resource names", Autonaming). One
given a name prefix gets 26 more characters from the provider (the Terraform AWS
provider's ``name_prefix``: a timestamp and a counter).
"""

from __future__ import annotations

import re

from ftfleet.infra.policies.model import Res

#: Characters Pulumi appends to a logical name when it generates the physical one.
AUTONAME_SUFFIX = 8
#: Characters the provider appends to a name prefix.
PREFIX_SUFFIX = 26

_IAM = r"[\w+=,.@-]+"
_LAMBDA = r"[A-Za-z0-9_-]+"
#: type -> (property that holds the name, max length, the characters allowed).
LIMITS: dict[str, tuple[str, int, str]] = {
    "aws:iam/role:Role": ("name", 64, _IAM),
    "aws:iam/instanceProfile:InstanceProfile": ("name", 128, _IAM),
    "aws:iam/policy:Policy": ("name", 128, _IAM),
    "aws:iam/rolePolicy:RolePolicy": ("name", 128, r"[^\\/*? ]+"),
    "aws:s3/bucket:Bucket": ("bucket", 63, r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
    "aws:lambda/function:Function": ("name", 64, _LAMBDA),
    "aws:sqs/queue:Queue": ("name", 80, _LAMBDA),
    "aws:cloudwatch/eventRule:EventRule": ("name", 64, r"[.A-Za-z0-9_-]+"),
    "aws:cloudwatch/logGroup:LogGroup": ("name", 512, r"[.A-Za-z0-9_/#-]+"),
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("name", 255, r"[ -~]+"),
    "aws:cloudwatch/dashboard:Dashboard": ("dashboardName", 255, _LAMBDA),
    "aws:sns/topic:Topic": ("name", 256, _LAMBDA),
    "aws:cloudtrail/trail:Trail": ("name", 128, r"[A-Za-z0-9](?:[._-]?[A-Za-z0-9])+"),
    "aws:kms/alias:Alias": ("name", 256, r"alias/[A-Za-z0-9/_-]+"),
    "aws:ecr/repository:Repository": (
        "name",
        256,
        r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*",
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": ("name", 128, r"[A-Za-z0-9().\/_-]+"),
    "aws:ec2/securityGroup:SecurityGroup": ("name", 255, r"[ -~]+"),
    "aws:ec2/placementGroup:PlacementGroup": ("name", 255, r"[ -~]+"),
    "aws:autoscaling/group:Group": ("name", 255, r"[ -~]+"),
}
ZONE = "aws:route53/zone:Zone"


def name_of(r: Res) -> tuple[str | None, str]:
    """``(name, how)``: the name the resource will have (for a generated one, a
    placeholder of the right length), and how it comes to be (``given``, ``prefix`` or
    ``generated``); ``(None, "")`` when it is unknown (at preview) or the type has no
    limit here."""
    if r.type not in LIMITS:
        return None, ""
    prop = LIMITS[r.type][0]
    value, prefix = r.props.get(prop), r.props.get(f"{prop}Prefix")
    if isinstance(value, str):
        return value, "given"
    if isinstance(prefix, str):
        return prefix + "0" * PREFIX_SUFFIX, "prefix"
    if value is None and prefix is None:
        return f"{r.name}-{'0' * (AUTONAME_SUFFIX - 1)}", "generated"
    return None, ""


def names_within_limits(r: Res) -> list[str]:
    """A resource's name fits its service's length and alphabet (the module's list)."""
    if r.type == ZONE:
        zone = r.props.get("name")
        if not isinstance(zone, str):
            return []
        long = [label for label in zone.rstrip(".").split(".") if len(label) > 63]
        out = [f"zone label {label[:20]}... has {len(label)} characters; DNS allows 63" for label in long]
        if len(zone.rstrip(".")) > 253:
            out.append(f"zone name has {len(zone)} characters; DNS allows 253")
        return out
    name, source = name_of(r)
    if name is None:
        return []
    _, limit, alphabet = LIMITS[r.type]
    how = {"given": "the name", "prefix": "the prefix with its suffix"}.get(source, "the name Pulumi generates")
    out = []
    if len(name) > limit:
        out.append(f"{how} ({name[:40]}...) has {len(name)} characters; {r.type.split(':')[1]} allows {limit}")
    if source == "generated" and r.type == "aws:s3/bucket:Bucket":
        name = name.lower()  # Pulumi lowercases a bucket's generated name
    if not re.fullmatch(alphabet, name):
        out.append(f"{how} {name[:60]!r} has characters {r.type.split(':')[1]} does not allow")
    return out
