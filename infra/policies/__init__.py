"""The invariants every ftfleet stack must satisfy, written once.

The tests run them over every resource the real program declares under mocks, and the
CrossGuard pack in policy/ wraps the same functions for `pulumi preview --policy-pack`.
They read resources through :class:`Res`, a neutral view both sides can build.

- `baseline`: buckets guarded (SSE-C blocked among the rest), IMDSv2, no world
  ingress, no `*` on `*`, FSx shape, spot spread, cross-region replication, an
  on-demand coordinator.
- `names`: every generated name fits its service's limits.
- `nodes`: one AMI per deployment, user data within EC2's limit, Route 53 grants
  scoped to one record and type, instance tag keys that instance metadata can serve.
- `remediation`: Lambda quotas, bounded retries, dead-letter queues and log retention,
  rule permissions, valid schedules, trails with global events, replication alarms in
  the region S3 publishes their metric in, no silent alarm.
- `deployable`: what AWS enforces at create time or on the node (FSx's grant in the
  key policy, EFA per network card and its security group, one GPU generation per
  fleet, the file system after its rules, replacement bounds, KMS via services,
  protection of stateful resources, ECR replication within its limits and after the
  repository it fills).
"""

from __future__ import annotations

from collections.abc import Iterable

from ftfleet.infra.policies.baseline import (
    BUCKET_GUARDS,
    IAM_DOCS,
    buckets_guarded,
    coordinator_on_demand,
    fsx_valid,
    imdsv2_required,
    kms_encrypted,
    no_star_star,
    no_world_ingress,
    public_access_blocked,
    replication_cross_region,
    spot_diversified,
    sse_c_blocked,
    tls_only,
    versioning_enabled,
)
from ftfleet.infra.policies.deployable import (
    ecr_replication_finds_its_repository,
    ecr_replication_valid,
    efa_group_admits_itself,
    efa_per_network_card,
    fleet_one_generation,
    fsx_export_key_grants_fsx,
    fsx_waits_for_its_rules,
    kms_via_service,
    replacement_within_aws_bounds,
    stateful_protected,
)
from ftfleet.infra.policies.model import FSX_THROUGHPUTS, WORLD, Policy, Res
from ftfleet.infra.policies.names import names_within_limits
from ftfleet.infra.policies.nodes import (
    conditional_objects_findable,
    metadata_tag_keys_valid,
    node_image_pinned,
    route53_changes_scoped,
    user_data_within_limit,
)
from ftfleet.infra.policies.remediation import (
    alarms_notify,
    async_retries_bounded,
    dead_letter_queues_admit_their_rules,
    event_target_bounded,
    lambda_dead_letters_and_logs,
    lambda_rule_permissions,
    lambda_within_quotas,
    s3_replication_alarm_region,
    schedule_expression_valid,
    trail_logs_global_events,
)

__all__ = [
    "alarms_notify",
    "async_retries_bounded",
    "dead_letter_queues_admit_their_rules",
    "event_target_bounded",
    "lambda_dead_letters_and_logs",
    "lambda_rule_permissions",
    "lambda_within_quotas",
    "s3_replication_alarm_region",
    "schedule_expression_valid",
    "trail_logs_global_events",
    "BUCKET_GUARDS",
    "FSX_THROUGHPUTS",
    "IAM_DOCS",
    "POLICIES",
    "WORLD",
    "Policy",
    "Res",
    "buckets_guarded",
    "coordinator_on_demand",
    "efa_group_admits_itself",
    "efa_per_network_card",
    "evaluate",
    "fleet_one_generation",
    "fsx_export_key_grants_fsx",
    "fsx_valid",
    "fsx_waits_for_its_rules",
    "imdsv2_required",
    "kms_encrypted",
    "kms_via_service",
    "no_star_star",
    "metadata_tag_keys_valid",
    "names_within_limits",
    "node_image_pinned",
    "no_world_ingress",
    "public_access_blocked",
    "replacement_within_aws_bounds",
    "replication_cross_region",
    "route53_changes_scoped",
    "conditional_objects_findable",
    "spot_diversified",
    "sse_c_blocked",
    "stateful_protected",
    "tls_only",
    "user_data_within_limit",
    "versioning_enabled",
]

POLICIES: tuple[Policy, ...] = (
    Policy("s3-versioning-enabled", "Checkpoint buckets keep every version.", versioning_enabled),
    Policy("s3-kms-encrypted", "Buckets are encrypted with a customer KMS key.", kms_encrypted),
    Policy("s3-sse-c-blocked", "Default encryption blocks SSE-C uploads.", sse_c_blocked),
    Policy("s3-public-access-blocked", "All four S3 public-access blocks are on.", public_access_blocked),
    Policy("s3-tls-only", "Bucket policies deny requests without TLS.", tls_only),
    Policy("ec2-imdsv2-required", "Launch templates require IMDSv2 tokens.", imdsv2_required),
    Policy("no-world-ingress", "No security group admits traffic from 0.0.0.0/0 or ::/0.", no_world_ingress),
    Policy("iam-no-star-star", "No policy statement allows * actions on * resources.", no_star_star),
    Policy("fsx-valid", "FSx for Lustre is PERSISTENT_2 with a valid capacity and throughput.", fsx_valid),
    Policy("spot-diversified", "Spot workers spread over at least 3 instance types.", spot_diversified, advisory=True),
    Policy("stateful-protected", "Buckets, KMS keys and file systems are protected from deletion.", stateful_protected),
    Policy(
        "efa-per-network-card",
        "A launch template has one EFA interface per network card of its instance type.",
        efa_per_network_card,
    ),
    Policy(
        "asg-replacement-bounds",
        "Replacement percentages are ones AWS accepts; a one-node group launches before it terminates.",
        replacement_within_aws_bounds,
    ),
    Policy(
        "ec2-node-image-pinned", "Launch templates boot one AMI id, resolved once per deployment.", node_image_pinned
    ),
    Policy(
        "ec2-metadata-tag-keys",
        "With tags in instance metadata, every tag an instance gets has a key metadata can serve.",
        metadata_tag_keys_valid,
        stack=True,
    ),
    Policy(
        "names-within-limits",
        "Every physical name fits its service's length and characters, whatever the stack's name.",
        names_within_limits,
    ),
    Policy("ec2-user-data-within-limit", "User data fits EC2's 16 KiB.", user_data_within_limit),
    Policy(
        "route53-changes-scoped",
        "Grants to change Route 53 records name the record and the type.",
        route53_changes_scoped,
    ),
    Policy(
        "s3-conditional-objects-findable",
        "An object a role reads and writes by its exact key may also be listed by it (a missing one answers 404).",
        conditional_objects_findable,
    ),
    Policy("iam-kms-via-service", "Identity policies grant KMS only through a named service.", kms_via_service),
    Policy(
        "ecr-replication-valid",
        "A registry's replication has 1-10 rules, each 1-100 destinations and PREFIX_MATCH filters.",
        ecr_replication_valid,
    ),
    Policy(
        "ecr-replication-finds-its-repository",
        "A replicated repository the stack declares exists before the replication rule that fills it.",
        ecr_replication_finds_its_repository,
        stack=True,
    ),
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
        "fsx-export-key-grant",
        "The KMS key of a bucket an FSx association exports to grants FSx's S3-access role.",
        fsx_export_key_grants_fsx,
        stack=True,
    ),
    Policy(
        "efa-security-group-self-traffic",
        "The security group of an EFA interface allows all traffic in from and out to itself.",
        efa_group_admits_itself,
        stack=True,
    ),
    Policy(
        "fsx-waits-for-security-group-rules",
        "A Lustre file system depends on its security groups' ingress rules, which admit port 988.",
        fsx_waits_for_its_rules,
        stack=True,
    ),
    Policy(
        "fleet-one-gpu-generation",
        "No group or fleet mixes GPU generations or EFA-incompatible instance types.",
        fleet_one_generation,
        stack=True,
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
        "cloudwatch-alarms-notify",
        "Every alarm has its actions enabled and notifies an SNS topic of its own region.",
        alarms_notify,
        stack=True,
    ),
    Policy(
        "s3-replication-alarm-region",
        "An alarm on an S3 replication metric is in the region S3 publishes it in.",
        s3_replication_alarm_region,
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


# GCP's invariants live with the GCP components; they read resources through Res too.
from ftfleet.infra.gcp import policies as _gcp_policies  # noqa: E402

POLICIES += tuple(
    Policy(name, doc, check, stack=stack, advisory=bool(rest and rest[0]))
    for name, doc, check, stack, *rest in _gcp_policies.SPECS
)
