"""What a node needs to boot as the deployment meant: one AMI for the whole deployment,
user data EC2 accepts, and DNS grants scoped to the coordinator's own record. Each
docstring names the AWS document the constraint comes from."""

from __future__ import annotations

import base64
import binascii
import json

from ftfleet.infra.bootscript import EC2_USER_DATA_LIMIT
from ftfleet.infra.constraints import imds_tag_key_problem
from ftfleet.infra.policies.baseline import IAM_DOCS
from ftfleet.infra.policies.model import Res, as_list, statements


def node_image_pinned(r: Res) -> list[str]:
    """One AMI per deployment. EC2 Auto Scaling resolves a `resolve:ssm:` image at every
    launch ("Use AWS Systems Manager parameters instead of AMI IDs in launch templates",
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/using-systems-manager-parameters.html),
    so nodes of one deployment would boot different kernels, while the Lustre client is
    built for one kernel (FSx for Lustre guide, "Installing the Lustre client",
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/install-lustre-client.html)."""
    if r.type != "aws:ec2/launchTemplate:LaunchTemplate":
        return []
    image = r.props.get("imageId")
    if not isinstance(image, str) or image.startswith("ami-"):
        return []
    return [f"imageId is {image!r}; give the AMI id the program resolved once for the deployment"]


def user_data_within_limit(r: Res) -> list[str]:
    """ "User data is limited to 16 KB, in raw form, before it is base64-encoded" (EC2 user
    guide, "Run commands when you launch an EC2 instance with user data input",
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html)."""
    if r.type != "aws:ec2/launchTemplate:LaunchTemplate" or not isinstance(r.props.get("userData"), str):
        return []
    try:
        size = len(base64.b64decode(r.props["userData"], validate=True))
    except (binascii.Error, ValueError):
        return ["userData is not base64 (launch templates take it encoded)"]
    if size <= EC2_USER_DATA_LIMIT:
        return []
    return [f"user data is {size} bytes; EC2 takes at most {EC2_USER_DATA_LIMIT}"]


def route53_changes_scoped(r: Res) -> list[str]:
    """A grant of ChangeResourceRecordSets names the record and type it may change, with
    the route53:ChangeResourceRecordSetsNormalizedRecordNames and ...RecordTypes condition
    keys (Route 53 developer guide, "Using IAM policy conditions for fine-grained access
    control", https://docs.aws.amazon.com/Route53/latest/DeveloperGuide/specifying-conditions-route53.html);
    without them a node could rewrite any record of the zone."""
    if r.type not in IAM_DOCS:
        return []
    out = []
    for s in statements(r.props.get(IAM_DOCS[r.type])):
        actions = [a for a in as_list(s.get("Action", [])) if isinstance(a, str)]
        if s.get("Effect") != "Allow" or not any(
            a in ("route53:ChangeResourceRecordSets", "route53:*") for a in actions
        ):
            continue
        keys = {k for cond in (s.get("Condition") or {}).values() if isinstance(cond, dict) for k in cond}
        needed = {
            "route53:ChangeResourceRecordSetsNormalizedRecordNames",
            "route53:ChangeResourceRecordSetsRecordTypes",
        }
        if not needed <= keys:
            missing = ", ".join(sorted(needed - keys))
            out.append(f"statement {s.get('Sid', '?')!r} may change any record: condition it on {missing}")
    return out


def metadata_tag_keys_valid(resources: list[Res]) -> list[tuple[str, str]]:
    """With tags in instance metadata allowed (``instanceMetadataTags: enabled``), every
    tag an instance gets has a key instance metadata can serve: letters, digits and
    ``+ - = . , _ : @``, not ``.``, ``..`` or ``_index``; EC2 refuses to launch it
    otherwise. An instance gets the launch template's instance tags, its group's tags
    propagated at launch and the providers' default tags.

    Amazon EC2 User Guide, "Tag your Amazon EC2 resources" (Tag restrictions) and "View
    tags for your EC2 instances using instance metadata":
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html
    """
    templates = [
        r
        for r in resources
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate"
        and (r.props.get("metadataOptions") or {}).get("instanceMetadataTags") == "enabled"
    ]
    if not templates:
        return []
    keys: list[tuple[str, str]] = []
    for t in templates:
        for spec in t.props.get("tagSpecifications") or []:
            if isinstance(spec, dict) and spec.get("resourceType") == "instance":
                keys += [(t.name, k) for k in (spec.get("tags") or {})]
    for r in resources:
        if r.type == "aws:autoscaling/group:Group":
            keys += [
                (r.name, tag.get("key"))
                for tag in r.props.get("tags") or []
                if isinstance(tag, dict) and tag.get("propagateAtLaunch") and isinstance(tag.get("key"), str)
            ]
        elif r.type == "pulumi:providers:aws":
            default = r.props.get("defaultTags")
            if isinstance(default, str):  # a provider's inputs arrive as JSON strings
                try:
                    default = json.loads(default)
                except ValueError:
                    default = None
            tags = (default or {}).get("tags") if isinstance(default, dict) else None
            keys += [(r.name, k) for k in (tags if isinstance(tags, dict) else {})]
    return [(name, f"tag key {key!r}: {problem}") for name, key in keys if (problem := imds_tag_key_problem(key))]


def _lists_key(statements_: list[dict], bucket_arn: str, key: str) -> bool:
    """Whether a statement allows s3:ListBucket on ``bucket_arn`` for a listing of
    ``key`` (unconditioned, or an s3:prefix condition that matches it)."""
    import fnmatch

    for s in statements_:
        actions = [a for a in as_list(s.get("Action", [])) if isinstance(a, str)]
        if s.get("Effect") != "Allow" or not {"s3:ListBucket", "s3:*"} & set(actions):
            continue
        if bucket_arn not in as_list(s.get("Resource", [])):
            continue
        condition = s.get("Condition") or {}
        if not condition:
            return True
        exact = as_list((condition.get("StringEquals") or {}).get("s3:prefix", []))
        like = as_list((condition.get("StringLike") or {}).get("s3:prefix", []))
        if key in exact or any(isinstance(p, str) and fnmatch.fnmatchcase(key, p) for p in like):
            return True
    return False


def conditional_objects_findable(r: Res) -> list[str]:
    """An object a role reads and writes by its exact key (a read-modify-write under a
    condition, such as the run lease) must be findable missing: "If you don't have the
    s3:ListBucket permission, Amazon S3 returns an HTTP status code 403 Access Denied
    error" for an object that does not exist (Amazon S3 API Reference, GetObject,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html), so without a
    listing of its key the first writer cannot tell "not there yet" from "no access"."""
    if r.type not in IAM_DOCS:
        return []
    found = statements(r.props.get(IAM_DOCS[r.type]))
    out = []
    for s in found:
        actions = {a for a in as_list(s.get("Action", [])) if isinstance(a, str)}
        if s.get("Effect") != "Allow" or not {"s3:GetObject", "s3:PutObject"} <= actions:
            continue
        for resource in as_list(s.get("Resource", [])):
            if not isinstance(resource, str) or "*" in resource or "/" not in resource:
                continue
            bucket_arn, _, key = resource.partition("/")
            if not _lists_key(found, bucket_arn, key):
                out.append(
                    f"statement {s.get('Sid', '?')!r} reads and writes {key} but may not list it: a missing "
                    "object answers 403; allow s3:ListBucket with s3:prefix equal to the key"
                )
    return out
