"""The invariants every ftfleet stack must satisfy, written once.

The tests run them over every resource the real program declares under mocks, and the
CrossGuard pack in policy/ wraps the same functions for `pulumi preview --policy-pack`.
They read resources through :class:`Res`, a neutral view both sides can build.
Values unknown at preview time (not yet a str/number) are skipped, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

WORLD = ("0.0.0.0/0", "::/0")
FSX_THROUGHPUTS = (125, 250, 500, 1000)


@dataclass
class Res:
    type: str
    name: str
    urn: str
    props: dict[str, Any]
    region: str | None = None
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    """Top-level property -> URNs of the resources its value came from."""
    protect: bool | None = None
    """The `protect` resource option; None where the caller cannot tell."""

    def deps(self, prop: str) -> list[str]:
        return self.property_dependencies.get(prop, [])


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    check: Callable
    stack: bool = False
    """Stack policies see every resource; resource policies one at a time."""
    advisory: bool = False


def _statements(doc: Any) -> list[dict]:
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError:
            return []
    if not isinstance(doc, dict):
        return []
    st = doc.get("Statement", [])
    return [s for s in (st if isinstance(st, list) else [st]) if isinstance(s, dict)]


def _as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


# --- resource policies: (Res) -> list of messages ---------------------------------


def versioning_enabled(r: Res) -> list[str]:
    if r.type != "aws:s3/bucketVersioning:BucketVersioning":
        return []
    status = (r.props.get("versioningConfiguration") or {}).get("status")
    return [] if status == "Enabled" else [f"bucket versioning is {status!r}, not Enabled"]


def kms_encrypted(r: Res) -> list[str]:
    if r.type != "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration":
        return []
    out = []
    for rule in r.props.get("rules") or [{}]:
        default = rule.get("applyServerSideEncryptionByDefault") or {}
        if default.get("sseAlgorithm") not in ("aws:kms", "aws:kms:dsse"):
            out.append(f"default encryption is {default.get('sseAlgorithm')!r}; use SSE-KMS")
        elif "kmsMasterKeyId" not in default:
            out.append("SSE-KMS without a customer key; set kms_master_key_id")
    return out


def public_access_blocked(r: Res) -> list[str]:
    if r.type != "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
        return []
    keys = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    return [f"{k} is not true" for k in keys if r.props.get(k) is not True]


def tls_only(r: Res) -> list[str]:
    if r.type != "aws:s3/bucketPolicy:BucketPolicy" or not isinstance(r.props.get("policy"), str):
        return []
    for s in _statements(r.props["policy"]):
        cond = (s.get("Condition") or {}).get("Bool") or {}
        if s.get("Effect") == "Deny" and str(cond.get("aws:SecureTransport")).lower() == "false":
            return []
    return ["bucket policy does not deny requests without TLS (aws:SecureTransport=false)"]


def imdsv2_required(r: Res) -> list[str]:
    if r.type != "aws:ec2/launchTemplate:LaunchTemplate":
        return []
    tokens = (r.props.get("metadataOptions") or {}).get("httpTokens")
    return [] if tokens == "required" else [f"metadata httpTokens is {tokens!r}; require IMDSv2"]


def no_world_ingress(r: Res) -> list[str]:
    cidrs: list = []
    if r.type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        cidrs = [r.props.get("cidrIpv4"), r.props.get("cidrIpv6")]
    elif r.type == "aws:ec2/securityGroup:SecurityGroup":
        for rule in r.props.get("ingress") or []:
            cidrs += (rule.get("cidrBlocks") or []) + (rule.get("ipv6CidrBlocks") or [])
    elif r.type == "aws:ec2/securityGroupRule:SecurityGroupRule" and r.props.get("type") == "ingress":
        cidrs = (r.props.get("cidrBlocks") or []) + (r.props.get("ipv6CidrBlocks") or [])
    return [f"ingress open to {c}" for c in cidrs if c in WORLD]


IAM_DOCS = {
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/policy:Policy": "policy",
    "aws:iam/userPolicy:UserPolicy": "policy",
    "aws:iam/groupPolicy:GroupPolicy": "policy",
    "aws:kms/key:Key": "policy",
    "aws:kms/replicaKey:ReplicaKey": "policy",
    "aws:s3/bucketPolicy:BucketPolicy": "policy",
}


def no_star_star(r: Res) -> list[str]:
    prop = IAM_DOCS.get(r.type)
    if not prop:
        return []
    out = []
    for s in _statements(r.props.get(prop)):
        if s.get("Effect") != "Allow":
            continue
        if "*" in _as_list(s.get("Action")) and "*" in _as_list(s.get("Resource", "*")):
            out.append(f"statement {s.get('Sid', '?')!r} allows every action on every resource")
    return out


def fsx_valid(r: Res) -> list[str]:
    if r.type != "aws:fsx/lustreFileSystem:LustreFileSystem":
        return []
    out = []
    if r.props.get("deploymentType") != "PERSISTENT_2":
        out.append(f"deployment type {r.props.get('deploymentType')!r}; checkpoints need PERSISTENT_2")
    cap = r.props.get("storageCapacity")
    if isinstance(cap, (int, float)) and not (cap == 1200 or (cap > 0 and cap % 2400 == 0)):
        out.append(f"storage capacity {cap} GiB is not 1200 or a multiple of 2400")
    tput = r.props.get("perUnitStorageThroughput")
    if isinstance(tput, (int, float)) and tput not in FSX_THROUGHPUTS:
        out.append(f"throughput {tput} MB/s/TiB is not one of {FSX_THROUGHPUTS}")
    return out


def _role(r: Res) -> str | None:
    for tag in r.props.get("tags") or []:
        if isinstance(tag, dict) and tag.get("key") == "ftfleet:role":
            return tag.get("value")
    return None


def spot_diversified(r: Res, min_types: int = 3) -> list[str]:
    if r.type != "aws:autoscaling/group:Group" or _role(r) != "worker":
        return []
    mip = r.props.get("mixedInstancesPolicy") or {}
    dist = mip.get("instancesDistribution") or {}
    if dist.get("onDemandPercentageAboveBaseCapacity", 100) >= 100:
        return []
    types = {o.get("instanceType") for o in (mip.get("launchTemplate") or {}).get("overrides") or []}
    return (
        []
        if len(types) >= min_types
        else [f"spot spread over {len(types)} instance type(s); use at least {min_types} to survive a pool running dry"]
    )


# --- stack policies: (list[Res]) -> list of (resource name, message) -------------

BUCKET_GUARDS = {
    "aws:s3/bucketVersioning:BucketVersioning": "versioning",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": "KMS encryption",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": "a public access block",
    "aws:s3/bucketPolicy:BucketPolicy": "a TLS-only policy",
}


def buckets_guarded(resources: list[Res]) -> list[tuple[str, str]]:
    out = []
    for bucket in (r for r in resources if r.type == "aws:s3/bucket:Bucket"):
        for guard_type, what in BUCKET_GUARDS.items():
            if not any(g.type == guard_type and bucket.urn in g.deps("bucket") for g in resources):
                out.append((bucket.name, f"bucket has no {what}"))
    return out


def replication_cross_region(resources: list[Res]) -> list[tuple[str, str]]:
    by_urn = {r.urn: r for r in resources}
    out = []
    for repl in (r for r in resources if r.type == "aws:s3/bucketReplicationConfig:BucketReplicationConfig"):
        sources = [by_urn[u] for u in repl.deps("bucket") if u in by_urn]
        dests = [by_urn[u] for u in repl.deps("rules") if u in by_urn and by_urn[u].type == "aws:s3/bucket:Bucket"]
        if not sources or not dests:
            out.append((repl.name, "replication source or destination bucket not found"))
            continue
        for d in dests:
            if d.region is None or d.region == sources[0].region:
                out.append((repl.name, f"replica {d.name} is in the source's region {d.region}"))
    return out


def coordinator_on_demand(resources: list[Res]) -> list[tuple[str, str]]:
    by_urn = {r.urn: r for r in resources}
    out = []
    for group in (r for r in resources if r.type == "aws:autoscaling/group:Group" and _role(r) == "coordinator"):
        mip = group.props.get("mixedInstancesPolicy")
        if mip and (mip.get("instancesDistribution") or {}).get("onDemandPercentageAboveBaseCapacity") != 100:
            out.append((group.name, "coordinator group may launch spot capacity"))
        for urn in group.deps("launchTemplate") + group.deps("mixedInstancesPolicy"):
            lt = by_urn.get(urn)
            if lt and lt.type == "aws:ec2/launchTemplate:LaunchTemplate" and lt.props.get("instanceMarketOptions"):
                out.append((group.name, f"coordinator launch template {lt.name} requests spot"))
        if not group.deps("launchTemplate") and not mip:
            out.append((group.name, "coordinator group has no launch template"))
    if not any(_role(r) == "coordinator" for r in resources if r.type == "aws:autoscaling/group:Group"):
        if any(r.type == "aws:autoscaling/group:Group" for r in resources):
            out.append(("stack", "no group is tagged ftfleet:role=coordinator"))
    return out


POLICIES: tuple[Policy, ...] = (
    Policy("s3-versioning-enabled", "Checkpoint buckets keep every version.", versioning_enabled),
    Policy("s3-kms-encrypted", "Buckets are encrypted with a customer KMS key.", kms_encrypted),
    Policy("s3-public-access-blocked", "All four S3 public-access blocks are on.", public_access_blocked),
    Policy("s3-tls-only", "Bucket policies deny requests without TLS.", tls_only),
    Policy("ec2-imdsv2-required", "Launch templates require IMDSv2 tokens.", imdsv2_required),
    Policy("no-world-ingress", "No security group admits traffic from 0.0.0.0/0 or ::/0.", no_world_ingress),
    Policy("iam-no-star-star", "No policy statement allows * actions on * resources.", no_star_star),
    Policy("fsx-valid", "FSx for Lustre is PERSISTENT_2 with a valid capacity and throughput.", fsx_valid),
    Policy("spot-diversified", "Spot workers spread over at least 3 instance types.", spot_diversified, advisory=True),
    Policy(
        "s3-buckets-guarded",
        "Every bucket has versioning, KMS, a public access block and a TLS policy.",
        buckets_guarded,
        stack=True,
    ),
    Policy(
        "s3-replication-cross-region",
        "Replication targets a bucket in another region.",
        replication_cross_region,
        stack=True,
    ),
    Policy(
        "coordinator-on-demand", "The coordinator runs on on-demand capacity only.", coordinator_on_demand, stack=True
    ),
)


def evaluate(resources: Iterable[Res], include_advisory: bool = True) -> list[tuple[str, str, str]]:
    """All violations: (policy, resource name, message)."""
    resources = list(resources)
    out = []
    for p in POLICIES:
        if p.advisory and not include_advisory:
            continue
        if p.stack:
            out += [(p.name, name, msg) for name, msg in p.check(resources)]
        else:
            out += [(p.name, r.name, msg) for r in resources for msg in p.check(r)]
    return out


# GCP's invariants live with the GCP components; they read resources through Res too.
from ftfleet.infra.gcp import policies as _gcp_policies  # noqa: E402

POLICIES += tuple(Policy(name, doc, check, stack=stack) for name, doc, check, stack in _gcp_policies.SPECS)
