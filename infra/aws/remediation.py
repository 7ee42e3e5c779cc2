"""Remediation: the functions that let the fleet and its checkpoints repair themselves.

One function per folder of ``lambdas/`` (see README.md's table), each packaged straight
from its folder (infra/aws/lambda_package.py) with its own role (infra/aws/
remediation_iam.py), its own log group with retention, an SQS dead-letter queue for
its failed invocations and for events EventBridge could not deliver, bounded retries
on both sides, a timeout, and its configuration as environment variables rendered from
the function's own config dataclass. Each ``remediation*`` switch adds or removes a
function together with its rules and alarms. The dashboard is always there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from ftfleet.infra.aws import drift_desired, lambda_package, remediation_alarms, userdata
from ftfleet.infra.aws import remediation_iam as iam
from ftfleet.infra.aws import remediation_patterns as patterns
from ftfleet.infra.aws.audit_trail import AuditTrail
from ftfleet.infra.aws.remediation_dashboard import DashboardInputs, body
from ftfleet.infra.settings import Settings
from ftfleet.lambdas.common.config import FunctionConfig
from ftfleet.lambdas.lifecycle_handoff.config import Config as HandoffConfig
from ftfleet.lambdas.replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.spot_interruption.config import Config as SpotConfig
from ftfleet.lambdas.storage_drift.config import DESIRED_FILE
from ftfleet.lambdas.storage_drift.config import Config as DriftConfig
from ftfleet.lambdas.storage_drift.config import render as render_desired
from ftfleet.lambdas.unhealthy_node.config import Config as UnhealthyConfig

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
    primary_bucket: aws.s3.Bucket
    replica_bucket: aws.s3.Bucket
    key_arn: pulumi.Output[str]
    replica_key_arn: pulumi.Output[str]
    replication: aws.s3.BucketReplicationConfig
    file_system: aws.fsx.LustreFileSystem
    association: aws.fsx.DataRepositoryAssociation


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
    }


class Remediation(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        targets: Targets,
        primary: aws.Provider,
        replica: aws.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:Remediation", name, None, opts)
        self._name, self._s, self._t = name, settings, targets
        self._o = pulumi.ResourceOptions(parent=self, provider=primary)
        self._replica = replica
        self._specs = specs(settings)
        self.deployed: dict[str, Deployed] = {}
        self.alarms: list[aws.cloudwatch.MetricAlarm] = []
        s, r = settings, settings.remediation
        self._root = userdata.checkpoint_root(settings)
        self._group_names = pulumi.Output.all(*[g.name for g in targets.groups]).apply(list)

        if r.spot_interruption:
            fn = self._function("spot_interruption", self._stack_env(SpotConfig, groups=True), iam.spot_interruption)
            self._rule(fn, "spot-interruption", pattern=pulumi.Output.from_input(patterns.spot_interruption()))
            self._rule(fn, "rebalance", pattern=pulumi.Output.from_input(patterns.rebalance_recommendation()))
        if r.lifecycle_handoff:
            hook = s.fleet.termination_hook_seconds
            env = self._stack_env(
                HandoffConfig,
                groups=True,
                max_wait_s=float(handoff_wait_s(s)),
                heartbeat_s=float(max(10, hook // 3)),
            )
            fn = self._function("lifecycle_handoff", env, iam.lifecycle_handoff)
            self._rule(fn, "lifecycle-action", pattern=self._group_names.apply(patterns.lifecycle_action))
        if r.unhealthy_nodes:
            env = self._stack_env(
                UnhealthyConfig,
                groups=True,
                grace_s=float(r.unhealthy_node_grace_seconds),
                max_per_hour=r.max_replacements_per_hour,
            )
            fn = self._function("unhealthy_node", env, iam.unhealthy_node)
            self._rule(fn, "node-sweep", schedule=patterns.rate(patterns.sweep_minutes(r.unhealthy_node_grace_seconds)))
        if r.storage_drift:
            env = pulumi.Output.from_input(DriftConfig(stack=s.stack, run_id=s.trainer.run_id).to_env())
            fn = self._function("storage_drift", env, iam.storage_drift, rendered=self._drift_desired())
            buckets = pulumi.Output.all(targets.primary_bucket.bucket, targets.replica_bucket.bucket).apply(list)
            self._rule(fn, "bucket-calls", pattern=buckets.apply(patterns.bucket_calls))
            self._rule(fn, "association-calls", pattern=pulumi.Output.from_input(patterns.association_calls()))
            self._forward_replica_calls(targets.replica_bucket.bucket)
            self.trail = (
                AuditTrail(f"{name}-audit", s, targets.account_id, primary, opts=pulumi.ResourceOptions(parent=self))
                if r.cloud_trail == "create"
                else None
            )
        if r.replication_lag:
            env = pulumi.Output.all(targets.primary_bucket.bucket, targets.replica_bucket.bucket).apply(
                lambda a: WatchConfig(
                    stack=s.stack,
                    run_id=s.trainer.run_id,
                    bucket=a[0],
                    replica_bucket=a[1],
                    replica_region=s.replica_region,
                    root=self._root,
                ).to_env()
            )
            fn = self._function("replication_watch", env, iam.replication_watch)
            self._rule(fn, "replication-watch", schedule=patterns.rate(patterns.REPLICATION_WATCH_MINUTES))

        for deployed in self.deployed.values():
            self._dead_letter_policy(deployed)
        self.alarms += remediation_alarms.declare(
            name,
            s,
            self.deployed,
            targets.primary_bucket.bucket,
            targets.replica_bucket.bucket,
            self._rule_id(),
            self._o,
        )
        self.dashboard = aws.cloudwatch.Dashboard(
            f"{name}-dashboard",
            dashboard_name=s.name,
            dashboard_body=pulumi.Output.all(
                targets.primary_bucket.bucket, targets.replica_bucket.bucket, self._rule_id()
            ).apply(
                lambda a: body(
                    DashboardInputs(
                        region=s.region,
                        stack=s.stack,
                        run_id=s.trainer.run_id,
                        primary_bucket=a[0],
                        replica_bucket=a[1],
                        replication_rule_id=a[2],
                        lag_alarm_seconds=r.replication_lag_alarm_seconds,
                        spot_interruption=r.spot_interruption,
                        lifecycle_handoff=r.lifecycle_handoff,
                        unhealthy_nodes=r.unhealthy_nodes,
                        storage_drift=r.storage_drift,
                        replication_lag=r.replication_lag,
                    )
                )
            ),
            opts=self._o,
        )
        self.register_outputs(
            {
                "functions": {k: v.function.name for k, v in self.deployed.items()},
                "dashboard": self.dashboard.dashboard_name,
            }
        )

    # -- configuration ---------------------------------------------------------------

    def _rule_id(self) -> pulumi.Output[str]:
        return self._t.replication.rules.apply(lambda rules: (rules or [{}])[0].get("id") or "")

    def _stack_env(self, cls: type[FunctionConfig], groups: bool = False, **values: Any) -> pulumi.Output[dict]:
        s = self._s
        return pulumi.Output.all(self._group_names, self._t.primary_bucket.bucket).apply(
            lambda a: cls(
                stack=s.stack,
                run_id=s.trainer.run_id,
                **({"groups": tuple(a[0])} if groups else {}),
                bucket=a[1],
                root=self._root,
                **values,
            ).to_env()
        )

    def _drift_desired(self) -> pulumi.Output[dict[str, str]]:
        s, t = self._s, self._t
        dra = t.association
        return pulumi.Output.all(
            t.primary_bucket.bucket,
            t.primary_bucket.arn,
            t.key_arn,
            t.replica_bucket.bucket,
            t.replica_bucket.arn,
            t.replica_key_arn,
            t.replication.role,
            t.replication.rules,
            dra.id,
            dra.file_system_id,
            dra.file_system_path,
            dra.data_repository_path,
            dra.batch_import_meta_data_on_create,
            dra.s3,
        ).apply(
            lambda a: {
                DESIRED_FILE: render_desired(
                    buckets={
                        a[0]: {
                            **drift_desired.bucket(s.region, a[1], a[2], s.buckets),
                            "replication": drift_desired.replication(a[6], a[7] or []),
                        },
                        a[3]: drift_desired.bucket(s.replica_region, a[4], a[5], s.buckets),
                    },
                    association=drift_desired.association(a[8], a[9], a[10], a[11], a[12], a[13] or {}),
                )
            }
        )

    # -- building blocks ---------------------------------------------------------------

    def _physical(self, short: str) -> str:
        return f"{self._s.name}-{short}"

    def _function(
        self,
        folder: str,
        env: pulumi.Output[dict],
        policy: Callable[[iam.Scope], dict],
        rendered: pulumi.Output[dict[str, str]] | None = None,
    ) -> Deployed:
        s, t, o = self._s, self._t, self._o
        spec = self._specs[folder]
        base = f"{self._name}-{folder.replace('_', '-')}"
        physical = self._physical(folder.replace("_", "-"))
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
            description=f"{s.name}: the {folder} function",
            assume_role_policy=t.account_id.apply(lambda a: json.dumps(iam.lambda_trust(a))),
            opts=pulumi.ResourceOptions(parent=self),
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
            t.file_system.arn,
            t.file_system.id,
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
            )
        )
        role_policy = aws.iam.RolePolicy(
            f"{base}-policy",
            role=role.id,
            policy=scope.apply(lambda sc: json.dumps(policy(sc))),
            opts=pulumi.ResourceOptions(parent=self),
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
        deployed = Deployed(spec, function, dlq, role, log_group)
        self.deployed[folder] = deployed
        return deployed

    def _rule(
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
            name=self._physical(short),
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

    def _dead_letter_policy(self, deployed: Deployed) -> None:
        aws.sqs.QueuePolicy(
            f"{self._name}-{deployed.spec.folder.replace('_', '-')}-dlq-policy",
            queue_url=deployed.dlq.url,
            policy=pulumi.Output.all(deployed.dlq.arn, *[r.arn for r in deployed.rules]).apply(
                lambda a: json.dumps(iam.dead_letter_queue(a[0], list(a[1:])))
            ),
            opts=self._o,
        )

    def _forward_replica_calls(self, replica_bucket: pulumi.Output[str]) -> None:
        """CloudTrail delivers the replica bucket's calls to EventBridge in the replica's
        region: a rule there forwards them to the primary region's default bus, where
        the bucket-calls rule matches them like the primary's."""
        s, t = self._s, self._t
        o = pulumi.ResourceOptions(parent=self, provider=self._replica)
        base = f"{self._name}-bucket-calls-replica"
        bus = t.account_id.apply(lambda a: f"arn:aws:events:{s.region}:{a}:event-bus/default")
        role = aws.iam.Role(
            f"{base}-role",
            description=f"{s.name}: forward the replica bucket's CloudTrail events to {s.region}",
            assume_role_policy=t.account_id.apply(lambda a: json.dumps(iam.events_trust(a))),
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{base}-policy",
            role=role.id,
            policy=bus.apply(lambda b: json.dumps(iam.forward_events(b))),
            opts=pulumi.ResourceOptions(parent=self),
        )
        dlq = aws.sqs.Queue(
            f"{base}-dlq",
            name=self._physical("bucket-calls-replica-dlq"),
            message_retention_seconds=DLQ_RETENTION_S,
            sqs_managed_sse_enabled=True,
            opts=o,
        )
        rule = aws.cloudwatch.EventRule(
            base,
            name=self._physical("bucket-calls-replica"),
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
