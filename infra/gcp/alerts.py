"""Alerts: the remediation functions' metric descriptors and the stack's alert policies.

* A metric descriptor for every custom metric a function writes (the functions'
  ``config.METRICS``). Cloud Monitoring refuses an alert policy on a metric type it
  does not know yet ("Cannot find metric(s)"), and a custom metric is unknown until
  its descriptor exists or a first point is written: the descriptors are declared,
  and the functions and the policies wait for them.
* Replication lag: Cloud Storage's own ``replication/turbo_max_delay`` of the
  checkpoint bucket (a turbo-replicated dual-region publishes how old its oldest
  unreplicated byte is) above replicationLagAlarmSeconds, and, as a second signal, the
  watch function's measured ``replication_lag_seconds`` (written only when it has a
  second bucket to compare with). Default replication (RPO DEFAULT, 12-hour target)
  publishes no minute-scale delay; its policy has only the second signal.
* Silence: the replication watch writes ``replica_has_complete_checkpoint`` at every
  run, the retention sweep ``retention_kept_checkpoints``; a policy per function opens
  an incident when its heartbeat has not arrived for several runs (SILENT_AFTER,
  SWEEP_SILENT_AFTER), so a scheduled function that stops (its scheduler, its function,
  its permissions) does not go unnoticed.
* Retention failures: the sweep's ``retention_delete_failures`` above 0, a step
  directory it could not delete.
* Capacity lost: the capacity watch's ``capacity_short_seconds`` at or above
  capacityLossMinutes (a managed instance group short of nodes for want of resources
  that long), and its silence (it writes both metrics at every run).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings
from ftfleet.lambdas.common.gcp import Metric
from ftfleet.lambdas.gcp_capacity_watch import config as capacity
from ftfleet.lambdas.gcp_replication_watch import config as watch
from ftfleet.lambdas.gcp_retention_sweep import config as sweep

m = gcp.monitoring
#: "storage.googleapis.com/replication/turbo_max_delay" (Google Cloud metrics, Cloud
#: Storage): the age of the oldest byte a turbo-replicated bucket has not replicated.
TURBO_MAX_DELAY = "storage.googleapis.com/replication/turbo_max_delay"
#: The watch runs every five minutes (functions.REPLICATION_SCHEDULE): four missed runs.
SILENT_AFTER = "1200s"
#: The capacity watch runs every two minutes (functions.CAPACITY_SCHEDULE): five missed runs.
CAPACITY_SILENT_AFTER = "600s"
#: The sweep runs every hour (functions.RETENTION_SCHEDULE): three missed runs.
SWEEP_SILENT_AFTER = "10800s"
ALIGNMENT = "300s"


def condition_filter(metric_type: str, resource_type: str, **labels: str) -> str:
    """A condition's filter: the metric type, its monitored resource type, and labels
    (``metric.label.x`` or, for names starting ``resource_``, ``resource.label.x``)."""
    parts = [f'metric.type="{metric_type}"', f'resource.type="{resource_type}"']
    for key, value in labels.items():
        scope, _, label = key.partition("_") if key.startswith("resource_") else ("metric", "", key)
        parts.append(f'{scope}.label.{label}="{value}"')
    return " AND ".join(parts)


def above(display: str, filter_: pulumi.Input[str], threshold: float, duration: str) -> m.AlertPolicyConditionArgs:
    """A condition met when the series' maximum over each ALIGNMENT period stays above
    ``threshold`` for ``duration``."""
    return m.AlertPolicyConditionArgs(
        display_name=display,
        condition_threshold=m.AlertPolicyConditionConditionThresholdArgs(
            filter=filter_,
            comparison="COMPARISON_GT",
            threshold_value=threshold,
            duration=duration,
            aggregations=[
                m.AlertPolicyConditionConditionThresholdAggregationArgs(
                    alignment_period=ALIGNMENT, per_series_aligner="ALIGN_MAX"
                )
            ],
        ),
    )


class Alerts(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        s: GcpSettings,
        metrics: tuple[Metric, ...],
        bucket: gcp.storage.Bucket,
        provider: gcp.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``metrics``: every custom metric the stack's functions write. With the
        replication watch among them, its lag and silence policies are declared too; with
        the retention sweep, its failure and silence policies."""
        super().__init__("ftfleet:gcp:Alerts", name, None, opts)
        self._o = pulumi.ResourceOptions(parent=self, provider=provider)
        self._s = s
        self.descriptors: dict[str, m.MetricDescriptor] = {
            metric.name: m.MetricDescriptor(
                f"{name}-{metric.name.replace('_', '-')}",
                type=metric.type,
                metric_kind=metric.KIND,
                value_type=metric.VALUE_TYPE,
                unit=metric.unit,
                display_name=f"ftfleet {metric.name}",
                description=metric.description,
                labels=[m.MetricDescriptorLabelArgs(key=label, value_type="STRING") for label in metric.labels],
                opts=self._o,
            )
            for metric in metrics
        }
        self.policies: dict[str, m.AlertPolicy] = {}
        if watch.HEARTBEAT.name in self.descriptors:
            self._lag(name, bucket)
            self._silent(
                f"{name}-watch-silent",
                "silent",
                "replication watch stopped reporting",
                watch.HEARTBEAT,
                SILENT_AFTER,
                "The replication watch function has written nothing for several of its five-minute runs: "
                "its Cloud Scheduler job, its push subscription (and dead-letter topic) or the function "
                "itself needs a look. Replication is unwatched until it reports again.",
            )
        if sweep.HEARTBEAT.name in self.descriptors:
            self._sweep_failures(name)
            self._silent(
                f"{name}-sweep-silent",
                "sweep-silent",
                "retention sweep stopped reporting",
                sweep.HEARTBEAT,
                SWEEP_SILENT_AFTER,
                "The retention sweep function has written nothing for several of its hourly runs: its Cloud "
                "Scheduler job, its push subscription (and dead-letter topic) or the function itself needs a "
                "look. Checkpoints the schedule no longer keeps stay in the bucket until it runs again.",
            )
        if capacity.CAPACITY_SHORT_SECONDS.name in self.descriptors:
            self._capacity_lost(name)
            self._silent(
                f"{name}-capacity-silent",
                "capacity-silent",
                "capacity watch stopped reporting",
                capacity.CAPACITY_SHORT_NODES,
                CAPACITY_SILENT_AFTER,
                "The capacity watch function has written nothing for several of its two-minute runs: its Cloud "
                "Scheduler job, its push subscription (and dead-letter topic) or the function itself needs a "
                "look. A region out of capacity goes unnoticed until it reports again.",
            )
        self.register_outputs({"descriptors": [d.type for d in self.descriptors.values()]})

    def _policy(self, name: str, key: str, display: str, conditions: list, text: str, metrics: list[Metric]) -> None:
        r = self._s.remediation
        self.policies[key] = m.AlertPolicy(
            name,
            display_name=f"{self._s.name}: {display}",
            combiner="OR",
            conditions=conditions,
            notification_channels=list(r.alert_channels),
            documentation=m.AlertPolicyDocumentationArgs(content=text, mime_type="text/markdown"),
            opts=pulumi.ResourceOptions.merge(
                self._o, pulumi.ResourceOptions(depends_on=[self.descriptors[x.name] for x in metrics])
            ),
        )

    def _lag(self, name: str, bucket: gcp.storage.Bucket) -> None:
        s, r = self._s, self._s.remediation
        alarm = r.replication_lag_alarm_seconds
        conditions = []
        if s.buckets.turbo_replication:
            conditions.append(
                above(
                    f"Cloud Storage turbo replication delay above {alarm} s",
                    bucket.name.apply(
                        lambda b: condition_filter(TURBO_MAX_DELAY, "gcs_bucket", resource_bucket_name=b)
                    ),
                    alarm,
                    "600s",
                )
            )
        conditions.append(
            above(
                f"measured checkpoint replication lag above {alarm} s",
                condition_filter(watch.LAG.type, watch.LAG.resource_type, stack=s.stack),
                alarm,
                "600s",
            )
        )
        self._policy(
            f"{name}-replication-lag",
            "lag",
            "checkpoint replication lag",
            conditions,
            "Checkpoints written to the bucket have not reached its second region for longer than the "
            "stack's replicationLagAlarmSeconds (Cloud Storage's turbo replication delay, or the watch "
            "function's comparison with a second bucket). See the replication watch's decisions in "
            "Cloud Logging and the bucket's Observability tab.",
            [watch.LAG],
        )

    def _silent(self, name: str, key: str, display: str, beat: Metric, after: str, text: str) -> None:
        """An incident when ``beat``, written at every run of a scheduled function, has
        not arrived for ``after``."""
        self._policy(
            name,
            key,
            display,
            [
                m.AlertPolicyConditionArgs(
                    display_name=f"no {beat.name} for {after}",
                    condition_absent=m.AlertPolicyConditionConditionAbsentArgs(
                        filter=condition_filter(beat.type, beat.resource_type, stack=self._s.stack),
                        duration=after,
                        aggregations=[
                            m.AlertPolicyConditionConditionAbsentAggregationArgs(
                                alignment_period=ALIGNMENT, per_series_aligner="ALIGN_MAX"
                            )
                        ],
                    ),
                )
            ],
            text,
            [beat],
        )

    def _capacity_lost(self, name: str) -> None:
        short = capacity.CAPACITY_SHORT_SECONDS
        loss_s = self._s.remediation.capacity_loss_minutes * 60
        self._policy(
            f"{name}-capacity-lost",
            "capacity-lost",
            "node groups out of capacity",
            [
                above(
                    f"{short.name} at {loss_s} s or more",
                    condition_filter(short.type, short.resource_type, stack=self._s.stack),
                    loss_s - 1,
                    "0s",
                )
            ],
            f"A managed instance group of the stack has been short of nodes for want of resources in its zones "
            f"for {self._s.remediation.capacity_loss_minutes} minutes (capacityLossMinutes): the capacity "
            "watch's decisions in Cloud Logging name each group, and `gcloud compute instance-groups managed "
            'list-errors` the errors. Move the run to its standby (docs/FAILOVER.md, "Moving the job").',
            [short],
        )

    def _sweep_failures(self, name: str) -> None:
        failures = sweep.FAILURES
        self._policy(
            f"{name}-retention-failures",
            "retention-failures",
            "retention sweep could not delete checkpoints",
            [
                above(
                    f"{failures.name} above 0",
                    condition_filter(failures.type, failures.resource_type, stack=self._s.stack),
                    0,
                    "0s",
                )
            ],
            "The retention sweep could not delete step directories its schedule no longer keeps (or old "
            "debris): its `delete-failed` decisions in Cloud Logging name each step and the error. The "
            "sweep tries again every hour; a failure that persists is usually a permission.",
            [failures],
        )
