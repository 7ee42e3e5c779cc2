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
  run; a policy opens an incident when it has not arrived for SILENT_AFTER, so a watch
  that stops (its scheduler, its function, its permissions) does not go unnoticed.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings
from ftfleet.lambdas.common.gcp import Metric
from ftfleet.lambdas.gcp_replication_watch import config as watch

m = gcp.monitoring
#: "storage.googleapis.com/replication/turbo_max_delay" (Google Cloud metrics, Cloud
#: Storage): the age of the oldest byte a turbo-replicated bucket has not replicated.
TURBO_MAX_DELAY = "storage.googleapis.com/replication/turbo_max_delay"
#: The watch runs every five minutes (functions.REPLICATION_SCHEDULE): four missed runs.
SILENT_AFTER = "1200s"
ALIGNMENT = "300s"


def condition_filter(metric_type: str, resource_type: str, **labels: str) -> str:
    """A condition's filter: the metric type, its monitored resource type, and labels
    (``metric.label.x`` or, for names starting ``resource_``, ``resource.label.x``)."""
    parts = [f'metric.type="{metric_type}"', f'resource.type="{resource_type}"']
    for key, value in labels.items():
        scope, _, label = key.partition("_") if key.startswith("resource_") else ("metric", "", key)
        parts.append(f'{scope}.label.{label}="{value}"')
    return " AND ".join(parts)


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
        replication watch among them, the lag and silence policies are declared too."""
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
            self._silent(name)
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

        def above(display: str, filter_: pulumi.Input[str]) -> m.AlertPolicyConditionArgs:
            return m.AlertPolicyConditionArgs(
                display_name=display,
                condition_threshold=m.AlertPolicyConditionConditionThresholdArgs(
                    filter=filter_,
                    comparison="COMPARISON_GT",
                    threshold_value=alarm,
                    duration="600s",
                    aggregations=[
                        m.AlertPolicyConditionConditionThresholdAggregationArgs(
                            alignment_period=ALIGNMENT, per_series_aligner="ALIGN_MAX"
                        )
                    ],
                ),
            )

        conditions = []
        if s.buckets.turbo_replication:
            conditions.append(
                above(
                    f"Cloud Storage turbo replication delay above {alarm} s",
                    bucket.name.apply(
                        lambda b: condition_filter(TURBO_MAX_DELAY, "gcs_bucket", resource_bucket_name=b)
                    ),
                )
            )
        conditions.append(
            above(
                f"measured checkpoint replication lag above {alarm} s",
                condition_filter(watch.LAG.type, watch.LAG.resource_type, stack=s.stack),
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

    def _silent(self, name: str) -> None:
        s = self._s
        beat = watch.HEARTBEAT
        self._policy(
            f"{name}-watch-silent",
            "silent",
            "replication watch stopped reporting",
            [
                m.AlertPolicyConditionArgs(
                    display_name=f"no {beat.name} for {SILENT_AFTER}",
                    condition_absent=m.AlertPolicyConditionConditionAbsentArgs(
                        filter=condition_filter(beat.type, beat.resource_type, stack=s.stack),
                        duration=SILENT_AFTER,
                        aggregations=[
                            m.AlertPolicyConditionConditionAbsentAggregationArgs(
                                alignment_period=ALIGNMENT, per_series_aligner="ALIGN_MAX"
                            )
                        ],
                    ),
                )
            ],
            "The replication watch function has written nothing for several of its five-minute runs: "
            "its Cloud Scheduler job, its push subscription (and dead-letter topic) or the function "
            "itself needs a look. Replication is unwatched until it reports again.",
            [beat],
        )
