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

from ftfleet.infra.gcp import machines

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


FUNCTION = "gcp:cloudfunctionsv2/function:Function"
PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
BUILDER_ROLE = "roles/run.builder"
DEFAULT_BUILDERS = ("@cloudbuild.gserviceaccount.com", "-compute@developer.gserviceaccount.com")


def functions_build_as_their_own_account(resources: list) -> list[tuple[str, str]]:
    """ "Custom service account for Cloud Build", https://cloud.google.com/functions/docs/securing/build-custom-sa:
    in newer projects Cloud Build no longer gives its default account the permissions
    a build needs, so a project deploying functions for the first time may find the
    default build account unable to build. "Configure a build service
    account", https://cloud.google.com/run/docs/configuring/services/build-service-account:
    the build account needs Cloud Run Builder (`roles/run.builder`) on the project.
    Every function names its build account (not a default one), and the function
    waits for that account's builder grant."""
    grants = {
        r.urn: r.props.get("member")
        for r in resources
        if r.type == PROJECT_MEMBER and r.props.get("role") == BUILDER_ROLE
    }
    out = []
    for fn in (r for r in resources if r.type == FUNCTION):
        account = (fn.props.get("buildConfig") or {}).get("serviceAccount")
        if account is None:
            out.append((fn.name, "builds as the project's default build account; set buildConfig.serviceAccount"))
            continue
        if not isinstance(account, str):
            continue
        email = account.rsplit("/", 1)[-1]
        if email.endswith(DEFAULT_BUILDERS):
            out.append((fn.name, f"builds as the default account {email}"))
        elif f"serviceAccount:{email}" not in {grants[u] for u in fn.dependencies if u in grants}:
            out.append((fn.name, f"does not wait for {email} to hold {BUILDER_ROLE}"))
    return out


SERVICE_IDENTITY = "gcp:projects/serviceIdentity:ServiceIdentity"
LOG_SINKS = ("gcp:logging/projectSink:ProjectSink",)
#: service-<project number>@gcp-sa-<service>.iam.gserviceaccount.com
SERVICE_AGENT = re.compile(r"serviceAccount:service-\d+@gcp-sa-[a-z0-9-]+\.iam\.gserviceaccount\.com")


def service_agents_exist_before_their_grants(resources: list) -> list[tuple[str, str]]:
    """ "Create and grant roles to service agents", https://cloud.google.com/iam/docs/create-service-agents:
    a service's agent is created when the service is first used, and "if a service
    agent hasn't been created yet, then you can't grant roles to the service agent";
    Google can be asked to create it first (Service Usage `generateServiceIdentity`,
    the `ServiceIdentity` resource). A grant to a service agent takes the agent's
    identity from the resource that makes it exist (a ServiceIdentity, or the log sink
    whose writer it is), never from a formula over the project number."""
    makers = {r.urn for r in resources if r.type in (SERVICE_IDENTITY, *LOG_SINKS)}
    out = []
    for r in resources:
        member = r.props.get("member")
        if not isinstance(member, str) or not SERVICE_AGENT.fullmatch(member):
            continue
        if not makers & set(r.deps("member")):
            out.append((r.name, f"grants {r.props.get('role')} to {member}, which nothing here makes exist first"))
    return out


PER_INSTANCE_CONFIGS = (
    "gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig",
    "gcp:compute/perInstanceConfig:PerInstanceConfig",
)
MIGS = (
    "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager",
    "gcp:compute/instanceGroupManager:InstanceGroupManager",
)


def stateful_groups_are_their_configs(resources: list) -> list[tuple[str, str]]:
    """ "Stateful MIGs: per-instance configurations",
    https://cloud.google.com/compute/docs/instance-groups/stateful-migs#per-instance_configs:
    a per-instance config names its VM and the MIG creates that VM. The provider
    documents (RegionPerInstanceConfig, and `target_size`: "If a value is required, such
    as to specify a creation-time target size for the MIG, lifecycle.ignore_changes can
    be used") and its issue tracker confirms (hashicorp/terraform-provider-google#15911,
    #20662) that a group of target size N with per-instance configs creates its N
    randomly named VMs besides the configs' VMs, and that the configs raise the target
    size. A group with per-instance configs is declared at size 0 and ignores
    `targetSize` on update, so its VMs are exactly its configs'."""
    by_urn = {r.urn: r for r in resources}
    groups = {
        u: by_urn[u]
        for config in resources
        if config.type in PER_INSTANCE_CONFIGS
        for prop in ("regionInstanceGroupManager", "instanceGroupManager")
        for u in config.deps(prop)
        if u in by_urn and by_urn[u].type in MIGS
    }
    out = []
    for group in groups.values():
        size = group.props.get("targetSize", 0)
        if isinstance(size, (int, float)) and size != 0:
            out.append((group.name, f"target size {size:g} adds VMs beside its per-instance configs'; declare 0"))
        if "targetSize" not in group.ignore_changes:
            out.append((group.name, "an update would resize it back; ignore changes to targetSize"))
    return out


HEALTH_CHECKS = ("gcp:compute/regionHealthCheck:RegionHealthCheck", "gcp:compute/healthCheck:HealthCheck")
FIREWALL = "gcp:compute/firewall:Firewall"
#: "Health checks overview: firewall rules": where Google's probers come from.
PROBER_RANGES = ("35.191.0.0/16", "130.211.0.0/22")


def _port_of(check) -> object:
    for kind in ("httpHealthCheck", "httpsHealthCheck", "http2HealthCheck", "tcpHealthCheck", "grpcHealthCheck"):
        if check.props.get(kind):
            return check.props[kind].get("port")
    return None


def _admits(rule, port: int) -> bool:
    for allow in rule.props.get("allows") or []:
        if allow.get("protocol") not in ("tcp", "all"):
            continue
        ports = allow.get("ports") or []
        for p in ports:
            low, _, high = str(p).partition("-")
            if int(low) <= port <= int(high or low):
                return True
        if not ports:
            return True
    return False


def health_checks_reach_their_port(resources: list) -> list[tuple[str, str]]:
    """ "Health checks overview: firewall rules",
    https://cloud.google.com/load-balancing/docs/health-check-concepts#ip-ranges: probes
    come from 35.191.0.0/16 and 130.211.0.0/22, and an ingress rule must admit them to
    the port the health check probes; otherwise every VM is unhealthy and auto-healing
    recreates it again and again. Every health check's port is admitted from both."""
    rules = [r for r in resources if r.type == FIREWALL and r.props.get("direction", "INGRESS") == "INGRESS"]
    out = []
    for check in (r for r in resources if r.type in HEALTH_CHECKS):
        port = _port_of(check)
        if not isinstance(port, (int, float)):
            continue
        for prober in PROBER_RANGES:
            if not any(prober in (r.props.get("sourceRanges") or []) and _admits(r, int(port)) for r in rules):
                out.append((check.name, f"no firewall rule admits Google's probers from {prober} to port {port:g}"))
    return out


def node_image_pinned(r) -> list[str]:
    """ "Image families best practices", https://cloud.google.com/compute/docs/images/image-families-best-practices:
    a family points to its newest image, so a VM created from a family boots whatever
    image is newest at that moment; a specific image stays the same. A template names
    a specific image (`.../global/images/<name>`), never a family, so nodes created by
    repairs, resizes and preemption replacements boot what the deployment chose."""
    if r.type not in TEMPLATES:
        return []
    out = []
    for disk in r.props.get("disks") or []:
        image = disk.get("sourceImage")
        if isinstance(image, str) and ("/images/family/" in image or "/global/images/" not in image):
            out.append(f"boot image {image!r} is not one pinned image (projects/<p>/global/images/<name>)")
    return out


def groups_update_opportunistically(r) -> list[str]:
    """ "Apply VM configuration updates in a MIG",
    https://cloud.google.com/compute/docs/instance-groups/updating-migs: a PROACTIVE
    update replaces every VM of the group as soon as its template changes; an
    OPPORTUNISTIC one applies the new template only when a VM is recreated for another
    reason (repair, resize, a preempted VM). A GPU fleet's groups update
    opportunistically, so a `pulumi up` never rolls a running job's nodes."""
    if r.type not in MIGS:
        return []
    kind = (r.props.get("updatePolicy") or {}).get("type", "PROACTIVE")
    return [] if kind == "OPPORTUNISTIC" or not isinstance(kind, str) else [f"update type {kind} rolls every VM"]


LOG_METRIC = "gcp:logging/metric:Metric"


def log_metrics_extract_their_labels(r) -> list[str]:
    """ "Log-based metrics labels", https://cloud.google.com/logging/docs/logs-based-metrics/labels:
    every label of a log-based metric's descriptor is filled by a label extractor of the
    same key, and an extractor names a declared label. "Configure counter metrics",
    https://cloud.google.com/logging/docs/logs-based-metrics/counter-metrics: a counter
    is a DELTA metric of INT64."""
    if r.type != LOG_METRIC:
        return []
    descriptor = r.props.get("metricDescriptor") or {}
    labels = {label.get("key") for label in descriptor.get("labels") or []}
    extractors = set(r.props.get("labelExtractors") or {})
    out = [f"label {k} has no extractor" for k in sorted(labels - extractors)]
    out += [f"extractor {k} fills no declared label" for k in sorted(extractors - labels)]
    kind, value = descriptor.get("metricKind"), descriptor.get("valueType")
    if not r.props.get("bucketOptions") and descriptor and (kind, value) != ("DELTA", "INT64"):
        out.append(f"a counter is DELTA INT64, not {kind} {value}")
    return out


def a3_has_its_gpu_nics(r) -> list[str]:
    """ "Maximize GPU network bandwidth with GPUDirect-TCPX and multi-networking",
    https://cloud.google.com/compute/docs/gpus/gpudirect: an A3 High VM reaches its GPU
    network bandwidth through four NICs besides the host's (GPUDirect-TCPX), an A3 Mega
    VM through eight (GPUDirect-TCPXO), each in its own VPC network. A template of one
    with a single NIC runs NCCL over that NIC."""
    if r.type not in TEMPLATES:
        return []
    machine = r.props.get("machineType")
    need = next((n for prefix, n in machines.GPUDIRECT_NICS.items() if str(machine).startswith(prefix)), None)
    nics = r.props.get("networkInterfaces") or []
    if need is None or len(nics) >= need:
        return []
    return [f"{machine} has {len(nics)} NIC(s); GPUDirect needs {need}, one per GPU network and the host's"]


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
    (
        "gcp-functions-build-identity",
        "Functions build as their own account, which holds roles/run.builder before the build.",
        functions_build_as_their_own_account,
        True,
    ),
    (
        "gcp-service-agents-exist-first",
        "Grants to Google service agents wait for the resource that creates the agent.",
        service_agents_exist_before_their_grants,
        True,
    ),
    (
        "gcp-stateful-group-is-its-configs",
        "A group with per-instance configs is declared at size 0 and is never resized by an update.",
        stateful_groups_are_their_configs,
        True,
    ),
    (
        "gcp-health-checks-reachable",
        "A firewall rule admits Google's health checkers to every health check's port.",
        health_checks_reach_their_port,
        True,
    ),
    ("gcp-node-image-pinned", "Templates boot one pinned image, never a family.", node_image_pinned, False),
    (
        "gcp-groups-update-opportunistically",
        "Instance groups apply new templates only to VMs recreated for other reasons.",
        groups_update_opportunistically,
        False,
    ),
    (
        "gcp-log-metrics-extract-their-labels",
        "Log-based counters are DELTA INT64 with one extractor per declared label.",
        log_metrics_extract_their_labels,
        False,
    ),
    ("gcp-a3-gpu-nics", "A3 templates have the NICs GPUDirect-TCPX/TCPXO needs.", a3_has_its_gpu_nics, False),
)
