"""The stack's CloudWatch dashboard: what the trainer and the remediation functions see.

A pure function of names, so that tests read the widgets without Pulumi. Per-node and
per-pool series use SEARCH expressions: nodes and spot pools come and go, and a
dashboard written at deploy time cannot list them. A widget reads its metrics in one
region: S3's ReplicationLatency has its own widget in the replica (destination)
region, where S3 publishes it (remediation_alarms.S3_REPLICATION_METRIC_SIDE).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ftfleet import contract

NS = contract.METRICS_NAMESPACE
WIDTH, HEIGHT = 12, 6


@dataclass(frozen=True)
class DashboardInputs:
    region: str
    replica_region: str
    stack: str
    run_id: str
    primary_bucket: str
    replica_bucket: str
    replication_rule_id: str
    lag_alarm_seconds: int
    spot_interruption: bool
    lifecycle_handoff: bool
    unhealthy_nodes: bool
    storage_drift: bool
    replication_lag: bool


def _search(schema: str, where: str, stat: str, period: int, label: str = "") -> dict:
    return {"expression": f"SEARCH('{{{schema}}} {where}', '{stat}', {period})", "label": label}


def _widget(title: str, metrics: list, region: str, **extra: object) -> dict:
    return {
        "type": "metric",
        "width": WIDTH,
        "height": HEIGHT,
        "properties": {"title": title, "region": region, "view": "timeSeries", "metrics": metrics, **extra},
    }


def _expr(i: int, expression: dict) -> list:
    return [{**expression, "id": f"e{i}"}]


def widgets(d: DashboardInputs) -> list[dict]:
    out = [
        _widget(
            "Training step rate per node (steps per minute)",
            [
                _expr(
                    1,
                    _search(
                        f"{NS},NodeId,RunId",
                        f'MetricName="{contract.PROGRESS_METRIC.name}" RunId="{d.run_id}"',
                        "Sum",
                        contract.NODE_METRIC_PERIOD_S,
                    ),
                )
            ],
            d.region,
        )
    ]
    if d.spot_interruption:
        out.append(
            _widget(
                "Spot interruptions and rebalance recommendations per zone and type (per hour)",
                [
                    _expr(
                        1,
                        _search(
                            f"{NS},AvailabilityZone,InstanceType,Stack",
                            f'MetricName="SpotInterruptions" Stack="{d.stack}"',
                            "Sum",
                            3600,
                        ),
                    ),
                    _expr(
                        2,
                        _search(
                            f"{NS},AvailabilityZone,InstanceType,Stack",
                            f'MetricName="RebalanceRecommendations" Stack="{d.stack}"',
                            "Sum",
                            3600,
                        ),
                    ),
                ],
                d.region,
            )
        )
    if d.lifecycle_handoff:
        out.append(
            _widget(
                "Lifecycle handoff: notice to completed action (seconds)",
                [
                    [NS, "HandoffWaitSeconds", "Stack", d.stack, {"stat": "Average", "label": "average"}],
                    [NS, "HandoffWaitSeconds", "Stack", d.stack, {"stat": "Maximum", "label": "maximum"}],
                    _expr(
                        1,
                        _search(
                            f"{NS},Outcome,Stack",
                            f'MetricName="HandoffWaitSeconds" Stack="{d.stack}"',
                            "SampleCount",
                            3600,
                        ),
                    ),
                ],
                d.region,
            )
        )
    if d.replication_lag:
        out.append(
            _widget(
                "Replication lag (seconds)",
                [
                    [
                        NS,
                        "ReplicationLagSeconds",
                        "Stack",
                        d.stack,
                        {"stat": "Maximum", "label": "committed checkpoints"},
                    ],
                ],
                d.region,
                annotations={"horizontal": [{"label": "alarm", "value": d.lag_alarm_seconds}]},
            )
        )
        out.append(
            _widget(
                f"S3 replication latency (seconds, published in {d.replica_region})",
                [
                    [
                        "AWS/S3",
                        "ReplicationLatency",
                        "SourceBucket",
                        d.primary_bucket,
                        "DestinationBucket",
                        d.replica_bucket,
                        "RuleId",
                        d.replication_rule_id,
                        {"stat": "Maximum", "label": "S3 ReplicationLatency"},
                    ],
                ],
                d.replica_region,
                annotations={"horizontal": [{"label": "alarm", "value": d.lag_alarm_seconds}]},
            )
        )
        out.append(
            _widget(
                "Age of the newest durable checkpoint (seconds)",
                [
                    [
                        NS,
                        "NewestDurableCheckpointAgeSeconds",
                        "Stack",
                        d.stack,
                        {"stat": "Maximum", "label": "primary"},
                    ],
                    [NS, "ReplicaHasCompleteCheckpoint", "Stack", d.stack, {"stat": "Minimum", "yAxis": "right"}],
                ],
                d.region,
            )
        )
    if d.unhealthy_nodes:
        out.append(
            _widget(
                "Nodes without progress, replaced and withheld",
                [
                    [NS, "NodesWithoutProgress", "Stack", d.stack, {"stat": "Maximum"}],
                    [NS, "NodesReplaced", "Stack", d.stack, {"stat": "Sum"}],
                    [NS, "ReplacementsWithheld", "Stack", d.stack, {"stat": "Sum"}],
                ],
                d.region,
            )
        )
    if d.storage_drift:
        out.append(
            _widget("Storage settings restored", [[NS, "DriftRepairs", "Stack", d.stack, {"stat": "Sum"}]], d.region)
        )
    for i, w in enumerate(out):
        w["x"], w["y"] = (i % 2) * WIDTH, (i // 2) * HEIGHT
    return out


def body(d: DashboardInputs) -> str:
    return json.dumps({"widgets": widgets(d)}, sort_keys=True)
