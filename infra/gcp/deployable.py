"""Constraints Google enforces at create time, or that decide whether a GCP stack works
once deployed, read off the declared resources. Mocks accept any value of the right
type; these catch what Google would refuse or what would misbehave on a real project.
Each docstring names the Google document the constraint comes from.

infra/gcp/policies.py adds :data:`SPECS` to its own; checks read resources through the
neutral view of infra/policies/ (``type``, ``name``, ``urn``, ``props`` with camelCase
keys, ``dependencies``). Values unknown at preview time are skipped, never guessed.
"""

from __future__ import annotations

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


#: (name, description, check, stack policy, advisory): infra/policies/ wraps them.
SPECS = (
    (
        "gcp-beta-preemption-notice",
        "Spot templates leave the Beta preemption notice unset until it is proven on the project.",
        no_beta_preemption_notice,
        False,
        True,
    ),
)
