"""Remediation: the functions that let the fleet and its checkpoints repair themselves.

One function per folder of ``lambdas/`` (see docs/AWS.md's table), each packaged straight
from its folder (infra/aws/lambda_package.py) with its own role (infra/aws/
remediation_iam.py), its own log group with retention, an SQS dead-letter queue for
its failed invocations and for events EventBridge could not deliver, bounded retries
on both sides, a timeout, and its configuration as environment variables rendered from
the function's own config dataclass. Each ``remediation*`` switch adds or removes a
function together with its rules and alarms. The dashboard is always there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.aws import drift_desired, remediation_alarms, userdata
from ftfleet.infra.aws import remediation_iam as iam
from ftfleet.infra.aws import remediation_patterns as patterns
from ftfleet.infra.aws.audit_trail import AuditTrail
from ftfleet.infra.aws.remediation_dashboard import DashboardInputs, body
from ftfleet.infra.aws.remediation_parts import Deployed, Parts, Targets, handoff_wait_s
from ftfleet.infra.settings import Settings
from ftfleet.lambdas.capacity_watch.config import Config as CapacityConfig
from ftfleet.lambdas.common.config import FunctionConfig
from ftfleet.lambdas.common.pair import LeaseRef, Pair, Side
from ftfleet.lambdas.lifecycle_handoff.config import Config as HandoffConfig
from ftfleet.lambdas.replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.retention_sweep.config import Config as SweepConfig
from ftfleet.lambdas.spot_interruption.config import Config as SpotConfig
from ftfleet.lambdas.storage_drift.config import DESIRED_FILE
from ftfleet.lambdas.storage_drift.config import Config as DriftConfig
from ftfleet.lambdas.storage_drift.config import render as render_desired
from ftfleet.lambdas.unhealthy_node.config import Config as UnhealthyConfig


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
        self._replica_o = pulumi.ResourceOptions(parent=self, provider=replica)
        self.deployed: dict[str, Deployed] = {}
        self.alarms: list[aws.cloudwatch.MetricAlarm] = []
        s, r = settings, settings.remediation
        self._root = userdata.checkpoint_root(settings)
        self._group_names = pulumi.Output.all(*[g.name for g in targets.groups]).apply(list)
        self._parts = Parts(self, name, s, targets, self._group_names, self._root, primary, replica)

        if r.spot_interruption:
            fn = self._deploy("spot_interruption", self._stack_env(SpotConfig, groups=True), iam.spot_interruption)
            self._parts.rule(fn, "spot-interruption", pattern=pulumi.Output.from_input(patterns.spot_interruption()))
            self._parts.rule(fn, "rebalance", pattern=pulumi.Output.from_input(patterns.rebalance_recommendation()))
        if r.lifecycle_handoff:
            hook = s.fleet.termination_hook_seconds
            env = self._stack_env(
                HandoffConfig,
                groups=True,
                max_wait_s=float(handoff_wait_s(s)),
                heartbeat_s=float(max(10, hook // 3)),
            )
            fn = self._deploy("lifecycle_handoff", env, iam.lifecycle_handoff)
            self._parts.rule(fn, "lifecycle-action", pattern=self._group_names.apply(patterns.lifecycle_action))
        if r.unhealthy_nodes:
            env = self._stack_env(
                UnhealthyConfig,
                groups=True,
                grace_s=float(r.unhealthy_node_grace_seconds),
                max_per_hour=r.max_replacements_per_hour,
            )
            fn = self._deploy("unhealthy_node", env, iam.unhealthy_node)
            self._parts.rule(
                fn, "node-sweep", schedule=patterns.rate(patterns.sweep_minutes(r.unhealthy_node_grace_seconds))
            )
        if r.storage_drift:
            env = pulumi.Output.from_input(DriftConfig(stack=s.stack, run_id=s.trainer.run_id).to_env())
            fn = self._deploy("storage_drift", env, iam.storage_drift, rendered=self._drift_desired())
            buckets = pulumi.Output.all(targets.primary_bucket.bucket, targets.replica_bucket.bucket).apply(list)
            self._parts.rule(fn, "bucket-calls", pattern=buckets.apply(patterns.bucket_calls))
            self._parts.rule(fn, "association-calls", pattern=pulumi.Output.from_input(patterns.association_calls()))
            self._parts.forward_replica_calls(targets.replica_bucket.bucket)
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
            fn = self._deploy("replication_watch", env, iam.replication_watch)
            self._parts.rule(fn, "replication-watch", schedule=patterns.rate(patterns.REPLICATION_WATCH_MINUTES))

        if r.capacity_watch:
            moves = s.standby is not None and s.standby.auto_failover
            env = pulumi.Output.all(
                self._group_names,
                targets.primary_bucket.bucket,
                targets.home if moves else None,
            ).apply(lambda a: self._capacity_config(a[0], a[1], a[2]).to_env())
            fn = self._deploy("capacity_watch", env, functools.partial(iam.capacity_watch, moves=moves))
            self._parts.rule(fn, "capacity-watch", schedule=patterns.rate(patterns.CAPACITY_WATCH_MINUTES))

        if r.retention_sweep:
            env = self._stack_env(SweepConfig, rules=r.checkpoint_retention)
            fn = self._deploy("retention_sweep", env, iam.retention_sweep)
            self._parts.rule(fn, "retention-sweep", schedule=patterns.rate(patterns.RETENTION_SWEEP_MINUTES))

        for deployed in self.deployed.values():
            self._parts.dead_letter_policy(deployed)
        self.topics = {s.region: remediation_alarms.topic(f"{name}-alarms", s, self._o)}
        if r.replication_lag:  # its S3 latency alarm lives in the replica region
            self.topics[s.replica_region] = remediation_alarms.topic(f"{name}-alarms-replica", s, self._replica_o)
        replica_topic = self.topics.get(s.replica_region, self.topics[s.region])
        self.alarms += remediation_alarms.declare(
            name,
            s,
            self.deployed,
            targets.primary_bucket.bucket,
            targets.replica_bucket.bucket,
            self._rule_id(),
            remediation_alarms.Place(self._o, self.topics[s.region].arn),
            remediation_alarms.Place(self._replica_o, replica_topic.arn),
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
                        replica_region=s.replica_region,
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
                "alarm_topics": {region: t.arn for region, t in self.topics.items()},
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

    def _capacity_config(self, groups: list[str], bucket: str, home: Any) -> CapacityConfig:
        """The capacity watch's config; a standby with standbyAutoFailover also moves the
        run between ``home`` (infra.aws.standby.Home) and itself."""
        s = self._s
        failover = None
        if home is not None:
            coordinator, workers = groups  # targets.groups: the coordinator's, the workers'
            failover = Pair(
                home=Side(
                    home.stack, home.region, home.coordinator_group, home.worker_group, home.primary_bucket, self._root
                ),
                standby=Side(s.stack, s.region, coordinator, workers, bucket, self._root),
                lease=LeaseRef(
                    home.primary_bucket, contract.lease_key(s.trainer.run_id), home.region, s.trainer.run_id
                ),
            )
        return CapacityConfig(
            stack=s.stack,
            run_id=s.trainer.run_id,
            groups=tuple(groups),
            loss_s=float(s.remediation.capacity_loss_minutes * 60),
            failover=failover,
        )

    def _deploy(
        self,
        folder: str,
        env: pulumi.Output[dict],
        policy: Callable[[iam.Scope], dict],
        rendered: pulumi.Output[dict[str, str]] | None = None,
    ) -> Deployed:
        self.deployed[folder] = self._parts.function(folder, env, policy, rendered)
        return self.deployed[folder]
