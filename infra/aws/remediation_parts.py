"""The pieces every remediation function is deployed with: a package from its folder,
its own role, a log group with retention, an SQS dead-letter queue, bounded retries, a
timeout; its EventBridge rules with a permission each; and the forwarder that brings
the replica region's CloudTrail events to the primary region's bus."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.aws import lambda_package, names
from ftfleet.infra.aws import remediation_iam as iam
from ftfleet.infra.aws import remediation_patterns as patterns
from ftfleet.infra.settings import Settings

LOG_RETENTION_DAYS = 30
DLQ_RETENTION_S = 14 * 86400  # SQS's maximum: two weeks to look at a lost event
#: Lambda's own limit on one invocation.
LAMBDA_MAX_TIMEOUT_S = 900
#: EventBridge's delivery retries to a target (it gives up earlier on max event age).
TARGET_RETRIES = 3


@dataclass(frozen=True)
class Targets:
    """The stack's resources the functions serve."""

    account_id: pulumi.Output[str]
    groups: list[aws.autoscaling.Group]
    primary_bucket: Any
    """An aws.s3.Bucket, or a standby's BucketRef: its ``bucket`` and ``arn`` are read."""
    replica_bucket: Any
    key_arn: pulumi.Output[str]
    replica_key_arn: pulumi.Output[str]
    replication: aws.s3.BucketReplicationConfig
    file_system: aws.fsx.LustreFileSystem | None
    """None: a standby whose file system comes with a failover."""
    association: aws.fsx.DataRepositoryAssociation | None
    home: Any = None
    """A standby's home (pulumi.Output of infra.aws.standby.Home), else None."""


@dataclass(frozen=True)
class Spec:
    """How one function runs."""

    folder: str
    purpose: str
    timeout_s: int
    retries: int
    """Lambda's retries of a failed asynchronous invocation (0-2)."""
    max_event_age_s: int
    """After this, an event is no longer worth acting on (EventBridge and Lambda)."""
    memory_mb: int = 256
    one_at_a_time: bool = False
    """Reserved concurrency 1: an invocation never overlaps the one before."""


@dataclass
class Deployed:
    spec: Spec
    function: aws.lambda_.Function
    dlq: aws.sqs.Queue
    role: aws.iam.Role
    log_group: aws.cloudwatch.LogGroup
    rules: list[aws.cloudwatch.EventRule] = field(default_factory=list)


def handoff_wait_s(settings: Settings) -> int:
    """How long lifecycle_handoff holds a node without a marker: the hook's timeout, within
    one Lambda invocation (beyond it, the node holds until the hook's own timeout)."""
    return min(settings.fleet.termination_hook_seconds, LAMBDA_MAX_TIMEOUT_S - 60)


def specs(settings: Settings) -> dict[str, Spec]:
    wait = handoff_wait_s(settings)
    return {
        "spot_interruption": Spec(
            "spot_interruption", "count spot interruptions and rebalance recommendations; keep the prior", 60, 2, 3600
        ),
        "lifecycle_handoff": Spec(
            "lifecycle_handoff",
            "complete a terminating node's lifecycle action after its marker",
            wait + 60,
            1,
            max(60, wait),
        ),
        "unhealthy_node": Spec("unhealthy_node", "replace nodes that stopped making progress", 120, 0, 300),
        "storage_drift": Spec("storage_drift", "restore weakened bucket and FSx association settings", 600, 2, 3600),
        "replication_watch": Spec("replication_watch", "measure replication lag of committed checkpoints", 120, 0, 300),
        # A standby's moves the run: one invocation at a time, each with time for a step
        # (two buckets' listings, one across regions, and the groups of both).
        "capacity_watch": Spec(
            "capacity_watch", "measure how long the groups lack capacity", 300, 0, 300, one_at_a_time=True
        ),
        "retention_sweep": Spec(
            "retention_sweep", "delete checkpoints the run's retention schedule no longer keeps", 600, 0, 3600
        ),
    }


class Parts:
    """Builds one function's resources, and its rules, as children of ``parent``."""

    def __init__(
        self,
        parent: pulumi.Resource,
        name: str,
        settings: Settings,
        targets: Targets,
        group_names: pulumi.Output[list[str]],
        root: str,
        primary: aws.Provider,
        replica: aws.Provider,
    ):
        self._name, self._s, self._t = name, settings, targets
        self._group_names, self._root = group_names, root
        self._o = pulumi.ResourceOptions(parent=parent, provider=primary)
        self._replica_o = pulumi.ResourceOptions(parent=parent, provider=replica)
        self._specs = specs(settings)

    def physical(self, short: str) -> str:
        """``ftfleet-<stack>-<short>``, fitted to 64 characters: the limit of a function's
        and a rule's name (a queue's is 80, its ``-dlq`` suffix included)."""
        return names.fit(f"{self._s.name}-{short}", names.limit_of("aws:lambda/function:Function"))

    def function(
        self,
        folder: str,
        env: pulumi.Output[dict],
        policy: Callable[[iam.Scope], dict],
        rendered: pulumi.Output[dict[str, str]] | None = None,
    ) -> Deployed:
        s, t, o = self._s, self._t, self._o
        spec = self._specs[folder]
        base = f"{self._name}-{folder.replace('_', '-')}"
        physical = self.physical(folder.replace("_", "-"))
        log_group = aws.cloudwatch.LogGroup(
            f"{base}-logs", name=f"/aws/lambda/{physical}", retention_in_days=LOG_RETENTION_DAYS, opts=o
        )
        dlq = aws.sqs.Queue(
            f"{base}-dlq",
            name=f"{physical}-dlq",
            message_retention_seconds=DLQ_RETENTION_S,
            sqs_managed_sse_enabled=True,
            opts=o,
        )
        role = aws.iam.Role(
            f"{base}-role",
            **names.generated("aws:iam/role:Role", f"{base}-role"),
            description=f"{s.name}: the {folder} function",
            assume_role_policy=t.account_id.apply(lambda a: json.dumps(iam.lambda_trust(a))),
            opts=o,  # the primary provider: its default tags reach IAM resources too
        )
        scope = pulumi.Output.all(
            t.account_id,
            log_group.arn,
            dlq.arn,
            self._group_names,
            t.primary_bucket.arn,
            t.replica_bucket.arn,
            t.key_arn,
            t.replica_key_arn,
            t.replication.role,
            t.file_system.arn if t.file_system else "",
            t.file_system.id if t.file_system else "",
            t.home.apply(lambda h: [h.coordinator_group, h.worker_group]) if t.home is not None else [],
        ).apply(
            lambda a: iam.Scope(
                region=s.region,
                replica_region=s.replica_region,
                account=a[0],
                log_group_arn=a[1],
                dlq_arn=a[2],
                groups=tuple(a[3]),
                primary_bucket_arn=a[4],
                replica_bucket_arn=a[5],
                key_arn=a[6],
                replica_key_arn=a[7],
                root=self._root,
                replication_role_arn=a[8],
                file_system_arn=a[9],
                file_system_id=a[10],
                home_groups=tuple(a[11]),
                lease_key=contract.lease_key(s.trainer.run_id),
            )
        )
        role_policy = aws.iam.RolePolicy(
            f"{base}-policy",
            **names.generated("aws:iam/rolePolicy:RolePolicy", f"{base}-policy"),
            role=role.id,
            policy=scope.apply(lambda sc: json.dumps(policy(sc))),
            opts=o,
        )
        function = aws.lambda_.Function(
            base,
            name=physical,
            description=f"{s.name}: {spec.purpose} (lambdas/{folder}/)",
            runtime=lambda_package.RUNTIME,
            architectures=["arm64"],
            handler=lambda_package.handler_path(folder),
            code=(
                rendered.apply(lambda files: lambda_package.archive(folder, files))
                if rendered is not None
                else lambda_package.archive(folder)
            ),
            role=role.arn,
            timeout=spec.timeout_s,
            memory_size=spec.memory_mb,
            reserved_concurrent_executions=1 if spec.one_at_a_time else None,
            environment=aws.lambda_.FunctionEnvironmentArgs(variables=env),
            dead_letter_config=aws.lambda_.FunctionDeadLetterConfigArgs(target_arn=dlq.arn),
            logging_config=aws.lambda_.FunctionLoggingConfigArgs(log_format="Text", log_group=log_group.name),
            # The log group first, or Lambda creates one that never expires; the policy
            # first, or the first invocations fail on missing permissions.
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[log_group, role_policy])),
        )
        aws.lambda_.FunctionEventInvokeConfig(
            f"{base}-async",
            function_name=function.name,
            maximum_retry_attempts=spec.retries,
            maximum_event_age_in_seconds=spec.max_event_age_s,
            opts=o,
        )
        return Deployed(spec, function, dlq, role, log_group)

    def rule(
        self,
        deployed: Deployed,
        short: str,
        pattern: pulumi.Output[dict] | None = None,
        schedule: str | None = None,
    ) -> aws.cloudwatch.EventRule:
        o = self._o
        base = f"{self._name}-{short}"
        rule = aws.cloudwatch.EventRule(
            base,
            name=self.physical(short),
            description=f"{short} -> {deployed.spec.folder}",
            event_pattern=pattern.apply(lambda p: json.dumps(p, sort_keys=True)) if pattern is not None else None,
            schedule_expression=schedule,
            state="ENABLED",
            opts=o,
        )
        aws.cloudwatch.EventTarget(
            f"{base}-target",
            rule=rule.name,
            arn=deployed.function.arn,
            retry_policy=aws.cloudwatch.EventTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=deployed.spec.max_event_age_s, maximum_retry_attempts=TARGET_RETRIES
            ),
            dead_letter_config=aws.cloudwatch.EventTargetDeadLetterConfigArgs(arn=deployed.dlq.arn),
            opts=o,
        )
        aws.lambda_.Permission(
            f"{base}-invoke",
            function=deployed.function.name,
            action="lambda:InvokeFunction",
            principal="events.amazonaws.com",
            source_arn=rule.arn,
            opts=o,
        )
        deployed.rules.append(rule)
        return rule

    def dead_letter_policy(self, deployed: Deployed) -> None:
        aws.sqs.QueuePolicy(
            f"{self._name}-{deployed.spec.folder.replace('_', '-')}-dlq-policy",
            queue_url=deployed.dlq.url,
            policy=pulumi.Output.all(deployed.dlq.arn, *[r.arn for r in deployed.rules]).apply(
                lambda a: json.dumps(iam.dead_letter_queue(a[0], list(a[1:])))
            ),
            opts=self._o,
        )

    def forward_replica_calls(self, replica_bucket: pulumi.Output[str]) -> None:
        """CloudTrail delivers the replica bucket's calls to EventBridge in the replica's
        region: a rule there forwards them to the primary region's default bus, where
        the bucket-calls rule matches them like the primary's."""
        s, t = self._s, self._t
        o = self._replica_o
        base = f"{self._name}-bucket-calls-replica"
        bus = t.account_id.apply(lambda a: f"arn:aws:events:{s.region}:{a}:event-bus/default")
        role = aws.iam.Role(
            f"{base}-role",
            **names.generated("aws:iam/role:Role", f"{base}-role"),
            description=f"{s.name}: forward the replica bucket's CloudTrail events to {s.region}",
            assume_role_policy=t.account_id.apply(lambda a: json.dumps(iam.events_trust(a))),
            opts=self._o,
        )
        aws.iam.RolePolicy(
            f"{base}-policy",
            **names.generated("aws:iam/rolePolicy:RolePolicy", f"{base}-policy"),
            role=role.id,
            policy=bus.apply(lambda b: json.dumps(iam.forward_events(b))),
            opts=self._o,
        )
        dlq = aws.sqs.Queue(
            f"{base}-dlq",
            name=self.physical("bucket-calls-replica-dlq"),
            message_retention_seconds=DLQ_RETENTION_S,
            sqs_managed_sse_enabled=True,
            opts=o,
        )
        rule = aws.cloudwatch.EventRule(
            base,
            name=self.physical("bucket-calls-replica"),
            description=f"bucket-calls in {s.replica_region} -> the default bus of {s.region}",
            event_pattern=replica_bucket.apply(lambda b: json.dumps(patterns.bucket_calls([b]), sort_keys=True)),
            state="ENABLED",
            opts=o,
        )
        aws.cloudwatch.EventTarget(
            f"{base}-target",
            rule=rule.name,
            arn=bus,
            role_arn=role.arn,
            retry_policy=aws.cloudwatch.EventTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=3600, maximum_retry_attempts=TARGET_RETRIES
            ),
            dead_letter_config=aws.cloudwatch.EventTargetDeadLetterConfigArgs(arn=dlq.arn),
            opts=o,
        )
        aws.sqs.QueuePolicy(
            f"{base}-dlq-policy",
            queue_url=dlq.url,
            policy=pulumi.Output.all(dlq.arn, rule.arn).apply(
                lambda a: json.dumps(iam.dead_letter_queue(a[0], [a[1]]))
            ),
            opts=o,
        )
