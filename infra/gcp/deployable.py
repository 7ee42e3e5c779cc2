"""Constraints Google enforces at create time, or that decide whether a GCP stack works
once deployed, read off the declared resources. Mocks accept any value of the right
type; these catch what Google would refuse or what would misbehave on a real project.
Each docstring names the Google document the constraint comes from.

infra/gcp/policies.py adds :data:`SPECS` to its own; checks read resources through the
neutral view of infra/policies/ (``type``, ``name``, ``urn``, ``props`` with camelCase
keys, ``dependencies``). Values unknown at preview time are skipped, never guessed.
"""

from __future__ import annotations

import re

TEMPLATES = (
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate",
    "gcp:compute/instanceTemplate:InstanceTemplate",
)


def no_beta_preemption_notice(r) -> list[str]:
    """ "Create and use Spot VMs", https://cloud.google.com/compute/docs/instances/create-use-spot,
    and the provider's `scheduling.preemptionNoticeDuration` ("Beta: Specifies the
    Metadata Service preemption notice duration before the GCE ACPI G2 Soft Off signal
    is triggered for Spot VMs only"): a Beta field that Compute Engine accepts only on
    allow-listed projects. Advisory: a stack sets it only once a Spot template with it
    has been created and preempted on its project (docs/VERIFY-ON-GCP.md)."""
    if r.type not in TEMPLATES:
        return []
    notice = (r.props.get("scheduling") or {}).get("preemptionNoticeDuration")
    if not notice:
        return []
    return [
        f"scheduling.preemptionNoticeDuration {notice} is a Beta field; confirm it on the project "
        "(docs/VERIFY-ON-GCP.md) or set gcpPreemptionNoticeSeconds 0"
    ]


ALERT = "gcp:monitoring/alertPolicy:AlertPolicy"
DESCRIPTOR = "gcp:monitoring/metricDescriptor:MetricDescriptor"
CUSTOM_METRICS = ("custom.googleapis.com/", "workload.googleapis.com/")
CONDITIONS = ("conditionThreshold", "conditionAbsent")


def alerts_know_their_metrics(resources: list) -> list[tuple[str, str]]:
    """ "Create custom metrics with the API", https://cloud.google.com/monitoring/custom-metrics/creating-metrics:
    a custom metric exists once its descriptor is created (or a first point is
    written); until then Cloud Monitoring refuses an alerting policy on it ("Cannot
    find metric(s)"). "Alerting policies in the API",
    https://cloud.google.com/monitoring/alerts/policies-in-api, and "Monitoring filters",
    https://cloud.google.com/monitoring/api/v3/filters: a condition selects time series
    by metric type and monitored-resource type. Every condition names its
    `resource.type`, and a policy on a custom metric depends on that metric's
    descriptor."""
    described = {r.urn: r.props.get("type") for r in resources if r.type == DESCRIPTOR}
    out = []
    for alert in (r for r in resources if r.type == ALERT):
        waits_for = {described[u] for u in alert.dependencies if u in described}
        for condition in alert.props.get("conditions") or []:
            display = condition.get("displayName", "?")
            for kind in CONDITIONS:
                text = (condition.get(kind) or {}).get("filter")
                if not isinstance(text, str):
                    continue
                if not re.search(r"\bresource\.type\s*=", text):
                    out.append((alert.name, f"condition {display!r} names no resource.type"))
                for metric in re.findall(r'metric\.type\s*=\s*"([^"]+)"', text):
                    if metric.startswith(CUSTOM_METRICS) and metric not in waits_for:
                        out.append(
                            (alert.name, f"condition {display!r} is on {metric}, whose descriptor it does not wait for")
                        )
    return out


#: (name, description, check, stack policy, advisory): infra/policies/ wraps them.
SPECS = (
    (
        "gcp-beta-preemption-notice",
        "Spot templates leave the Beta preemption notice unset until it is proven on the project.",
        no_beta_preemption_notice,
        False,
        True,
    ),
    (
        "gcp-alerts-know-their-metrics",
        "Alert conditions name their resource type and wait for their custom metrics' descriptors.",
        alerts_know_their_metrics,
        True,
    ),
)
