"""The invariants every ftfleet stack must satisfy, written once.

The tests run them over every resource the real program declares under mocks, and the
CrossGuard pack in policy/ wraps the same functions for `pulumi preview --policy-pack`.
They read resources through :class:`Res`, a neutral view both sides can build.
Values unknown at preview time (not yet a str/number) are skipped, never guessed.
"""

from __future__ import annotations

import json
import re
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


# --- remediation functions: Lambda, EventBridge, CloudWatch Logs, CloudTrail ------

FUNCTION = "aws:lambda/function:Function"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
LAMBDA_ENV_LIMIT = 4096
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lambda_within_quotas(r: Res) -> list[str]:
    """A function's timeout is 1-900 s, its memory 128-10,240 MB and its environment
    variables 4 KB in all.

    AWS Lambda Developer Guide, "Lambda quotas":
    https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
    """
    if r.type != FUNCTION:
        return []
    out = []
    timeout = r.props.get("timeout")
    if timeout is None:
        out.append("no timeout set: Lambda's default of 3 s cuts a remediation short")
    elif _number(timeout) and not 1 <= timeout <= 900:
        out.append(f"timeout {timeout} s is outside Lambda's 1-900 s")
    memory = r.props.get("memorySize")
    if _number(memory) and not 128 <= memory <= 10240:
        out.append(f"memory {memory} MB is outside Lambda's 128-10240 MB")
    env = ((r.props.get("environment") or {}).get("variables")) or {}
    if isinstance(env, dict) and all(isinstance(v, str) for v in env.values()):
        size = sum(len(k.encode()) + len(v.encode()) for k, v in env.items())
        if size > LAMBDA_ENV_LIMIT:
            out.append(f"environment variables take {size} bytes; Lambda allows {LAMBDA_ENV_LIMIT} in all")
    return out


def async_retries_bounded(r: Res) -> list[str]:
    """Lambda retries a failed asynchronous invocation 0-2 times and keeps an event 60 s to
    6 hours.

    AWS Lambda API Reference, "PutFunctionEventInvokeConfig":
    https://docs.aws.amazon.com/lambda/latest/api/API_PutFunctionEventInvokeConfig.html
    """
    if r.type != "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig":
        return []
    out = []
    retries, age = r.props.get("maximumRetryAttempts"), r.props.get("maximumEventAgeInSeconds")
    if _number(retries) and not 0 <= retries <= 2:
        out.append(f"maximumRetryAttempts {retries} is outside 0-2")
    if _number(age) and not 60 <= age <= 21600:
        out.append(f"maximumEventAgeInSeconds {age} is outside 60-21600")
    return out


def event_target_bounded(r: Res) -> list[str]:
    """A rule's target to a function retries within EventBridge's bounds (0-185 attempts,
    60 s to 24 h) and has a dead-letter queue for the events it could not deliver.

    Amazon EventBridge User Guide, "Event retry policy and using dead-letter queues":
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html
    """
    if r.type != EVENT_TARGET:
        return []
    out = []
    retry = r.props.get("retryPolicy") or {}
    attempts, age = retry.get("maximumRetryAttempts"), retry.get("maximumEventAgeInSeconds")
    if _number(attempts) and not 0 <= attempts <= 185:
        out.append(f"retry attempts {attempts} outside EventBridge's 0-185")
    if _number(age) and not 60 <= age <= 86400:
        out.append(f"maximum event age {age} s outside EventBridge's 60-86400")
    arn = r.props.get("arn")
    if isinstance(arn, str) and ":lambda:" in arn and not (r.props.get("deadLetterConfig") or {}).get("arn"):
        out.append("a target that invokes a function has no dead-letter queue")
    return out


def schedule_expression_valid(r: Res) -> list[str]:
    """A rate expression has a positive whole value and a unit that is singular for 1
    (``rate(1 minute)``) and plural otherwise (``rate(5 minutes)``).

    Amazon EventBridge User Guide, "Creating an Amazon EventBridge rule that runs on a
    schedule" (rate expressions):
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-scheduled-rule-pattern.html
    """
    if r.type != "aws:cloudwatch/eventRule:EventRule":
        return []
    expr = r.props.get("scheduleExpression")
    if not isinstance(expr, str) or not expr.startswith("rate("):
        return []
    m = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", expr)
    if not m or int(m.group(1)) < 1:
        return [f"schedule {expr!r} is not rate(<n> <unit>)"]
    value, unit = int(m.group(1)), m.group(2)
    if (value == 1) != (not unit.endswith("s")):
        return [f"schedule {expr!r}: use the singular unit for 1 and the plural otherwise"]
    return []


def trail_logs_global_events(r: Res) -> list[str]:
    """A multi-Region trail includes global service events; CloudTrail turns them off only
    on a single-Region trail.

    AWS CloudTrail User Guide, "Using the update-trail command to update a trail"
    (Enabling and disabling global service event logging):
    https://docs.aws.amazon.com/awscloudtrail/latest/userguide/cloudtrail-create-and-update-a-trail-by-using-the-aws-cli-update-trail.html
    """
    if r.type != "aws:cloudtrail/trail:Trail":
        return []
    if r.props.get("isMultiRegionTrail") is True and r.props.get("includeGlobalServiceEvents") is False:
        return ["a multi-Region trail must include global service events"]
    return []


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


def lambda_rule_permissions(resources: list[Res]) -> list[tuple[str, str]]:
    """Every rule that targets a function comes with a resource-based permission on that
    function for ``events.amazonaws.com`` whose source ARN is that rule.

    Amazon EventBridge User Guide, "Using resource-based policies for Amazon EventBridge"
    (AWS Lambda permissions):
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html
    """
    functions = {r.urn for r in resources if r.type == FUNCTION}
    permissions = [r for r in resources if r.type == "aws:lambda/permission:Permission"]
    out = []
    for target in (r for r in resources if r.type == EVENT_TARGET):
        for fn in (u for u in target.deps("arn") if u in functions):
            rules = target.deps("rule")
            if not any(
                fn in p.deps("function")
                and any(rule in p.deps("sourceArn") for rule in rules)
                and p.props.get("principal") == "events.amazonaws.com"
                for p in permissions
            ):
                out.append((target.name, "no lambda permission lets this target's rule invoke the function"))
    return out


def lambda_dead_letters_and_logs(resources: list[Res]) -> list[tuple[str, str]]:
    """Every function parks failed asynchronous invocations in a dead-letter queue that its
    role may send to, and logs to its own log group, which has a retention (Lambda's
    default group ``/aws/lambda/<name>`` otherwise keeps logs forever).

    AWS Lambda Developer Guide, "Adding a dead-letter queue" and "Sending Lambda function
    logs to CloudWatch Logs":
    https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html
    https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs.html ; retention
    values: Amazon CloudWatch Logs API Reference, "PutRetentionPolicy":
    https://docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_PutRetentionPolicy.html
    """
    out = []
    groups = {r.props.get("name"): r for r in resources if r.type == "aws:cloudwatch/logGroup:LogGroup"}
    role_policies = [r for r in resources if r.type == "aws:iam/rolePolicy:RolePolicy"]
    for fn in (r for r in resources if r.type == FUNCTION):
        dlq = (fn.props.get("deadLetterConfig") or {}).get("targetArn")
        if not dlq:
            out.append((fn.name, "function has no dead-letter queue"))
        elif isinstance(dlq, str):
            roles = fn.deps("role")
            allowed = any(
                any(role in rp.deps("role") for role in roles)
                and any(
                    s.get("Effect") == "Allow"
                    and "sqs:SendMessage" in _as_list(s.get("Action"))
                    and dlq in _as_list(s.get("Resource"))
                    for s in _statements(rp.props.get("policy"))
                )
                for rp in role_policies
            )
            if not allowed and all(isinstance(rp.props.get("policy"), str) for rp in role_policies):
                out.append((fn.name, "the function's role may not send to its dead-letter queue"))
        name = fn.props.get("name")
        group_name = ((fn.props.get("loggingConfig") or {}).get("logGroup")) or (
            f"/aws/lambda/{name}" if isinstance(name, str) else None
        )
        if not isinstance(group_name, str):
            continue
        group = groups.get(group_name)
        if group is None:
            out.append((fn.name, f"no log group {group_name}: Lambda would create one that never expires"))
            continue
        days = group.props.get("retentionInDays")
        if days is None:
            out.append((group.name, "log group keeps logs forever; set retention_in_days"))
        elif _number(days) and days not in LOG_RETENTION_DAYS:
            out.append((group.name, f"retention {days} days is not a value CloudWatch Logs accepts"))
    return out


def dead_letter_queues_admit_their_rules(resources: list[Res]) -> list[tuple[str, str]]:
    """A rule's dead-letter queue has a queue policy that lets EventBridge send to it for
    that rule (``aws:SourceArn``); without it, undeliverable events are lost.

    Amazon EventBridge User Guide, "Event retry policy and using dead-letter queues"
    (Granting permissions to the dead-letter queue):
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html
    """
    queue_policies = [r for r in resources if r.type == "aws:sqs/queuePolicy:QueuePolicy"]
    queues = {r.urn: r for r in resources if r.type == "aws:sqs/queue:Queue"}
    out = []
    for target in (r for r in resources if r.type == EVENT_TARGET):
        for queue in (u for u in target.deps("deadLetterConfig") if u in queues):
            ok = False
            for qp in queue_policies:
                if queue not in qp.deps("queueUrl"):
                    continue
                if not isinstance(qp.props.get("policy"), str):
                    ok = True  # unknown at preview
                    break
                for st in _statements(qp.props["policy"]):
                    principal = (
                        (st.get("Principal") or {}).get("Service") if isinstance(st.get("Principal"), dict) else None
                    )
                    if (
                        st.get("Effect") == "Allow"
                        and principal == "events.amazonaws.com"
                        and any(rule in qp.deps("policy") for rule in target.deps("rule"))
                    ):
                        ok = True
            if not ok:
                out.append((target.name, "the dead-letter queue's policy does not admit EventBridge for this rule"))
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
    Policy(
        "lambda-within-quotas",
        "Functions keep within Lambda's timeout, memory and environment quotas.",
        lambda_within_quotas,
    ),
    Policy(
        "lambda-async-retries-bounded",
        "Asynchronous invocations retry 0-2 times within 6 hours.",
        async_retries_bounded,
    ),
    Policy(
        "eventbridge-target-bounded",
        "Rule targets retry within EventBridge's bounds and a function target has a dead-letter queue.",
        event_target_bounded,
    ),
    Policy("eventbridge-schedule-valid", "Rate expressions are well formed.", schedule_expression_valid),
    Policy(
        "cloudtrail-global-events", "A multi-Region trail includes global service events.", trail_logs_global_events
    ),
    Policy(
        "lambda-rule-permission",
        "Every rule that targets a function has a permission whose source is that rule.",
        lambda_rule_permissions,
        stack=True,
    ),
    Policy(
        "lambda-dlq-and-log-retention",
        "Every function has a dead-letter queue its role can send to and a log group with retention.",
        lambda_dead_letters_and_logs,
        stack=True,
    ),
    Policy(
        "eventbridge-dlq-admits-rule",
        "A rule's dead-letter queue lets EventBridge send to it for that rule.",
        dead_letter_queues_admit_their_rules,
        stack=True,
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
