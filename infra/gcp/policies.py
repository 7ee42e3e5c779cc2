"""The invariants of every GCP stack, each from the Google document named in its docstring.

infra/policies.py registers :data:`SPECS` into its ``POLICIES``, so the tests (over
every resource the program declares under mocks) and the CrossGuard pack run them like
the AWS ones. Checks read resources through the neutral view of infra/policies.py
(``type``, ``name``, ``urn``, ``props`` with camelCase keys, ``protect``); this module
imports nothing from it, so either can be imported first. Values unknown at preview
time (not yet a str or a number) are skipped, never guessed.
"""

from __future__ import annotations

import json
from typing import Any

from ftfleet.infra.gcp import deployable, locations
from ftfleet.infra.gcp.storage_settings import LUSTRE_TIERS

WORLD = ("0.0.0.0/0", "::/0")
PRIMITIVE_ROLES = ("roles/owner", "roles/editor", "roles/viewer")
BUCKET = "gcp:storage/bucket:Bucket"
TEMPLATES = (
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate",
    "gcp:compute/instanceTemplate:InstanceTemplate",
)
MIGS = (
    "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager",
    "gcp:compute/instanceGroupManager:InstanceGroupManager",
)
LUSTRE = "gcp:lustre/instance:Instance"
PARALLELSTORE = "gcp:parallelstore/instance:Instance"
CONNECTION = "gcp:servicenetworking/connection:Connection"
#: Stateful resources: deleting one loses checkpoints or makes them unreadable.
STATEFUL = (BUCKET, LUSTRE, PARALLELSTORE, "gcp:kms/keyRing:KeyRing", "gcp:kms/cryptoKey:CryptoKey")


def _known(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool))


def _checkpoint_bucket(r) -> bool:
    """A bucket that holds checkpoints: every bucket but the functions' source bucket,
    which holds only zips the program uploads again (label ftfleet-purpose)."""
    return r.type == BUCKET and (r.props.get("labels") or {}).get("ftfleet-purpose") != "function-source"


# --- Cloud Storage ---------------------------------------------------------------------


def public_access_prevented(r) -> list[str]:
    """ "Public access prevention", https://cloud.google.com/storage/docs/public-access-prevention:
    `enforced` keeps any IAM binding or ACL from making objects public."""
    if r.type != BUCKET or not _known(r.props.get("publicAccessPrevention", "")):
        return []
    value = r.props.get("publicAccessPrevention")
    return [] if value == "enforced" else [f"public access prevention is {value!r}, not 'enforced'"]


def uniform_access(r) -> list[str]:
    """ "Uniform bucket-level access", https://cloud.google.com/storage/docs/uniform-bucket-level-access:
    IAM alone grants access; object ACLs are off."""
    if r.type != BUCKET:
        return []
    return [] if r.props.get("uniformBucketLevelAccess") is True else ["uniform bucket-level access is off"]


def versioned(r) -> list[str]:
    """ "Object Versioning", https://cloud.google.com/storage/docs/object-versioning: an
    overwritten or deleted checkpoint stays recoverable as a noncurrent version."""
    if r.type != BUCKET:
        return []
    return [] if (r.props.get("versioning") or {}).get("enabled") is True else ["object versioning is off"]


def two_locations(r) -> list[str]:
    """ "Bucket locations", https://cloud.google.com/storage/docs/locations: a dual-region
    is a predefined pair (NAM4, EUR4, ...) or a location code with exactly two
    `customPlacementConfig.dataLocations` of that code. Turbo replication (RPO
    ASYNC_TURBO) exists only for dual-regions ("Data availability and durability",
    https://cloud.google.com/storage/docs/availability-durability#turbo-replication)."""
    if not _checkpoint_bucket(r) or not _known(r.props.get("location", "")):
        return []
    location = str(r.props.get("location", "")).upper()
    data = [d.lower() for d in (r.props.get("customPlacementConfig") or {}).get("dataLocations") or []]
    if location in locations.PREDEFINED_DUAL_REGIONS and not data:
        return []
    if len(data) == 2 and locations.dual_region(*data) == (location, tuple(d.upper() for d in data)):
        return []
    message = f"location {location} with data locations {data or 'none'} is not a dual-region"
    if r.props.get("rpo") == "ASYNC_TURBO":
        message += "; turbo replication needs one"
    return [message]


def soft_delete_window(r) -> list[str]:
    """ "Soft delete", https://cloud.google.com/storage/docs/soft-delete: retention is 0
    (off) or 7 to 90 days."""
    if r.type != BUCKET:
        return []
    seconds = (r.props.get("softDeletePolicy") or {}).get("retentionDurationSeconds")
    if not isinstance(seconds, (int, float)) or seconds == 0 or 7 * 86400 <= seconds <= 90 * 86400:
        return []
    return [f"soft-delete retention of {seconds} s is outside 7 to 90 days"]


def aging_rules_name_their_prefix(r) -> list[str]:
    """ "Object Lifecycle Management", https://cloud.google.com/storage/docs/lifecycle: a
    rule without `matchesPrefix` applies to every object. Every rule that moves or
    deletes objects names the prefixes it ages, so pinned checkpoints never age."""
    if r.type != BUCKET:
        return []
    out = []
    for rule in r.props.get("lifecycleRules") or []:
        action = (rule.get("action") or {}).get("type")
        if action in ("Delete", "SetStorageClass") and not (rule.get("condition") or {}).get("matchesPrefixes"):
            out.append(f"lifecycle rule {action} applies to every object; name the prefixes it ages")
    return out


# --- IAM ------------------------------------------------------------------------------


def no_primitive_roles(r) -> list[str]:
    """ "Roles and permissions: basic roles", https://cloud.google.com/iam/docs/roles-overview#basic:
    Owner, Editor and Viewer grant thousands of permissions across all services;
    Google advises against them in production. No IAM member, binding or policy of
    the stack uses them."""
    if not r.type.startswith("gcp:") or "iam" not in r.type.lower():
        return []
    roles = [r.props.get("role")]
    policy = r.props.get("policyData")
    if isinstance(policy, str):
        try:
            roles += [b.get("role") for b in json.loads(policy).get("bindings", [])]
        except (json.JSONDecodeError, AttributeError):
            pass
    return [f"grants the primitive role {role}" for role in roles if role in PRIMITIVE_ROLES]


# --- Network ----------------------------------------------------------------------------


def no_world_ingress(r) -> list[str]:
    """ "VPC firewall rules", https://cloud.google.com/firewall/docs/firewalls: an ingress
    rule admits its source ranges, and one without any source (ranges, tags or service
    accounts) admits 0.0.0.0/0."""
    if r.type != "gcp:compute/firewall:Firewall" or r.props.get("direction", "INGRESS") != "INGRESS":
        return []
    if r.props.get("allows") is None and r.props.get("denies"):
        return []
    ranges = r.props.get("sourceRanges") or []
    if not ranges and not r.props.get("sourceTags") and not r.props.get("sourceServiceAccounts"):
        return ["ingress rule has no source, which means 0.0.0.0/0"]
    return [f"ingress open to {cidr}" for cidr in ranges if cidr in WORLD]


# --- Compute ----------------------------------------------------------------------------


def spot_templates_never_restart(r) -> list[str]:
    """ "Create and use Spot VMs", https://cloud.google.com/compute/docs/instances/create-use-spot:
    a Spot VM is preemptible, cannot restart automatically, and terminates on host
    maintenance. In a managed instance group it must be DELETEd on preemption: a
    STOPped one keeps its paid disk and the group does not recreate it elsewhere."""
    if r.type not in TEMPLATES:
        return []
    sch = r.props.get("scheduling") or {}
    if sch.get("provisioningModel") != "SPOT" and sch.get("preemptible") is not True:
        return []
    out = []
    if sch.get("provisioningModel") != "SPOT" or sch.get("preemptible") is not True:
        out.append("a Spot template needs provisioningModel SPOT and preemptible true")
    if sch.get("automaticRestart") is not False:
        out.append("a Spot template must set automaticRestart false")
    if sch.get("onHostMaintenance") != "TERMINATE":
        out.append("a Spot template must TERMINATE on host maintenance")
    if sch.get("instanceTerminationAction") != "DELETE":
        out.append(f"Spot VMs are {sch.get('instanceTerminationAction') or 'STOP'}ped on preemption; DELETE them")
    return out


def gpu_templates_terminate_on_maintenance(r) -> list[str]:
    """ "GPU VMs and host maintenance", https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance:
    VMs with GPUs cannot live-migrate; their host maintenance policy is TERMINATE."""
    if r.type not in TEMPLATES:
        return []
    machine = str(r.props.get("machineType", ""))
    if not (r.props.get("guestAccelerators") or machine.startswith(("a2-", "a3-", "a4-", "g2-"))):
        return []
    policy = (r.props.get("scheduling") or {}).get("onHostMaintenance")
    return [] if policy == "TERMINATE" else [f"GPU template's host maintenance policy is {policy!r}, not TERMINATE"]


def _role(r) -> str | None:
    return (r.props.get("labels") or {}).get("ftfleet-role")


def coordinator_on_demand(r) -> list[str]:
    """The coordinator hosts the rendezvous: a preemption would stop every worker."""
    if r.type not in TEMPLATES or _role(r) != "coordinator":
        return []
    sch = r.props.get("scheduling") or {}
    if sch.get("provisioningModel") == "SPOT" or sch.get("preemptible") is True:
        return ["the coordinator template requests Spot capacity"]
    return []


def groups_heal_and_replace(r) -> list[str]:
    """ "Set up an application health check and autohealing",
    https://cloud.google.com/compute/docs/instance-groups/autohealing-instances-in-migs:
    a group with a health check recreates a VM whose application stopped answering.
    Updates REPLACE VMs (a restart keeps a wedged GPU driver and the old boot state)."""
    if r.type not in MIGS:
        return []
    out = []
    healing = r.props.get("autoHealingPolicies") or {}
    healing = healing[0] if isinstance(healing, list) and healing else healing
    if not (isinstance(healing, dict) and healing.get("healthCheck")):
        out.append("group has no auto-healing health check")
    if (r.props.get("updatePolicy") or {}).get("minimalAction") != "REPLACE":
        out.append("group updates do not REPLACE VMs")
    return out


def regional_update_policy(r) -> list[str]:
    """ "Set the target distribution shape",
    https://cloud.google.com/compute/docs/instance-groups/regional-mig-set-target-distribution-shape:
    BALANCED, ANY and ANY_SINGLE_ZONE need proactive redistribution off. "Automatically
    apply VM configuration updates in a MIG",
    https://cloud.google.com/compute/docs/instance-groups/rolling-out-updates-to-managed-instance-groups:
    a regional group's fixed maxSurge and maxUnavailable are 0 or at least its number
    of zones, and a group that preserves instance state (stateful IPs) replaces by
    RECREATE with no surge."""
    if r.type != MIGS[0]:
        return []
    policy = r.props.get("updatePolicy") or {}
    zones = r.props.get("distributionPolicyZones") or []
    out = []
    shape = r.props.get("distributionPolicyTargetShape", "EVEN")
    if shape in ("BALANCED", "ANY", "ANY_SINGLE_ZONE") and policy.get("instanceRedistributionType") != "NONE":
        out.append(f"target shape {shape} needs instanceRedistributionType NONE")
    for key in ("maxSurgeFixed", "maxUnavailableFixed"):
        value = policy.get(key)
        if isinstance(value, (int, float)) and zones and 0 < value < len(zones):
            out.append(f"{key} {value:g} is neither 0 nor at least the group's {len(zones)} zones")
    if r.props.get("statefulInternalIps") or r.props.get("statefulDisks"):
        if policy.get("replacementMethod") != "RECREATE" or policy.get("maxSurgeFixed", 0) != 0:
            out.append("a stateful group must update by RECREATE with maxSurgeFixed 0")
    return out


# --- File systems -----------------------------------------------------------------------


def lustre_valid(r) -> list[str]:
    """ "Managed Lustre performance tiers", https://cloud.google.com/managed-lustre/docs/performance-tiers:
    each tier has a minimum, a maximum and a capacity step; the file system name has at
    most 8 characters ("Create a Managed Lustre instance")."""
    if r.type != LUSTRE:
        return []
    out = []
    try:
        tput, cap = int(r.props.get("perUnitStorageThroughput")), int(r.props.get("capacityGib"))
    except (TypeError, ValueError):
        return []
    if tput not in LUSTRE_TIERS:
        return [f"throughput {tput} MB/s/TiB is not a Managed Lustre tier"]
    low, high, step, coarse = LUSTRE_TIERS[tput]
    unit = coarse[1] if coarse and cap > coarse[0] else step
    if not low <= cap <= high or cap % unit:
        out.append(f"capacity {cap} GiB is not valid for the {tput} MB/s/TiB tier ({low}-{high} GiB, steps of {unit})")
    fs = r.props.get("filesystem")
    if isinstance(fs, str) and not 1 <= len(fs) <= 8:
        out.append(f"file system name {fs!r} is not 1 to 8 characters")
    return out


def parallelstore_valid(r) -> list[str]:
    """ "Create a Parallelstore instance", https://cloud.google.com/parallelstore/docs/create-instance:
    12 to 100 TiB in multiples of 4 TiB (12,000 to 100,000 GiB in steps of 4,000), and
    a SCRATCH or PERSISTENT deployment."""
    if r.type != PARALLELSTORE:
        return []
    out = []
    try:
        cap = int(r.props.get("capacityGib"))
    except (TypeError, ValueError):
        cap = None
    if cap is not None and (not 12_000 <= cap <= 100_000 or cap % 4_000):
        out.append(f"capacity {cap} GiB is not 12,000 to 100,000 in steps of 4,000")
    kind = r.props.get("deploymentType")
    if _known(kind or "") and kind not in (None, "SCRATCH", "PERSISTENT"):
        out.append(f"deployment type {kind!r} is not SCRATCH or PERSISTENT")
    return out


def file_system_has_private_access(resources: list) -> list[tuple[str, str]]:
    """ "Managed Lustre: configure a VPC network", https://cloud.google.com/managed-lustre/docs/vpc,
    and "Parallelstore: configure a VPC network", https://cloud.google.com/parallelstore/docs/vpc:
    the file system's network has private services access (a servicenetworking
    connection) over an allocated range of /23 or larger per Managed Lustre instance,
    /24 or larger for Parallelstore."""
    connections = [r for r in resources if r.type == CONNECTION]
    ranges = {r.props.get("name"): r for r in resources if r.type == "gcp:compute/globalAddress:GlobalAddress"}
    out = []
    for fs in (r for r in resources if r.type in (LUSTRE, PARALLELSTORE)):
        network = fs.props.get("network")
        if not isinstance(network, str):
            continue
        matching = [
            c for c in connections if str(c.props.get("network", "")).rsplit("/", 1)[-1] == network.rsplit("/", 1)[-1]
        ]
        if not matching:
            out.append((fs.name, f"network {network} has no private services access connection"))
            continue
        widest = 24 if fs.type == PARALLELSTORE else 23
        for c in matching:
            for name in c.props.get("reservedPeeringRanges") or []:
                prefix = (ranges.get(name).props if name in ranges else {}).get("prefixLength")
                if isinstance(prefix, (int, float)) and prefix > widest:
                    out.append(
                        (fs.name, f"private services range {name} is a /{prefix:g}; it needs /{widest} or larger")
                    )
    return out


def cmek_grants_the_storage_agent(resources: list) -> list[tuple[str, str]]:
    """ "Use customer-managed encryption keys",
    https://cloud.google.com/storage/docs/encryption/using-customer-managed-keys: the
    project's Cloud Storage service agent must hold Encrypter/Decrypter on a bucket's
    default key, or every write to the bucket fails."""
    grants = {
        (r.props.get("cryptoKeyId"), r.props.get("role"))
        for r in resources
        if r.type == "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember"
        and "@gs-project-accounts.iam.gserviceaccount.com" in str(r.props.get("member", ""))
    }
    out = []
    for b in (r for r in resources if r.type == BUCKET):
        key = (b.props.get("encryption") or {}).get("defaultKmsKeyName")
        if isinstance(key, str) and (key, "roles/cloudkms.cryptoKeyEncrypterDecrypter") not in grants:
            out.append((b.name, f"the Cloud Storage service agent is not granted encrypt/decrypt on {key}"))
    return out


def stateful_protected(r) -> list[str]:
    """Pulumi's `protect` resource option, https://www.pulumi.com/docs/iac/concepts/options/protect/:
    buckets, file systems and keys refuse deletion until unprotected, so a typo or a
    replacing change cannot delete checkpoints."""
    if r.type not in STATEFUL or getattr(r, "protect", None) is not False:
        return []
    if r.type == BUCKET and not _checkpoint_bucket(r):
        return []
    return [f"{r.type.rsplit(':', 1)[-1]} is not protected"]


# --- Remediation functions ----------------------------------------------------------------

FUNCTION = "gcp:cloudfunctionsv2/function:Function"
SUBSCRIPTION = "gcp:pubsub/subscription:Subscription"
#: "Runtime support", https://cloud.google.com/functions/docs/runtime-support (as of 2026-11).
SUPPORTED_PYTHON = ("python310", "python311", "python312", "python313")
DEFAULT_COMPUTE_SA = "-compute@developer.gserviceaccount.com"


def functions_run_as_their_own_account(r) -> list[str]:
    """ "Function identity", https://cloud.google.com/functions/docs/securing/function-identity:
    without a service account a function runs as the Compute Engine default service
    account, which often holds the Editor role on the whole project."""
    if r.type != FUNCTION:
        return []
    email = (r.props.get("serviceConfig") or {}).get("serviceAccountEmail")
    if email is None:
        return ["runs as the default compute service account; set serviceConfig.serviceAccountEmail"]
    if isinstance(email, str) and email.endswith(DEFAULT_COMPUTE_SA):
        return [f"runs as the default compute service account {email}"]
    return []


def functions_internal_only(r) -> list[str]:
    """ "Configure network settings", https://cloud.google.com/functions/docs/networking/network-settings:
    ALLOW_INTERNAL_ONLY admits requests from the project's VPC and from Pub/Sub, Cloud
    Scheduler and Eventarc of the project; ALLOW_ALL puts the function on the internet."""
    if r.type != FUNCTION:
        return []
    ingress = (r.props.get("serviceConfig") or {}).get("ingressSettings", "ALLOW_ALL")
    return [] if ingress == "ALLOW_INTERNAL_ONLY" or not _known(ingress) else [f"ingress is {ingress}"]


def functions_supported_runtime(r) -> list[str]:
    """ "Runtime support", https://cloud.google.com/functions/docs/runtime-support: a
    runtime past its decommission date can no longer be deployed."""
    if r.type != FUNCTION:
        return []
    runtime = (r.props.get("buildConfig") or {}).get("runtime")
    if not _known(runtime) or runtime in SUPPORTED_PYTHON:
        return []
    return [f"runtime {runtime} is not one of {', '.join(SUPPORTED_PYTHON)}"]


def push_subscriptions_dead_letter(r) -> list[str]:
    """ "Handle message failures", https://cloud.google.com/pubsub/docs/handling-failures:
    a dead-letter policy takes 5 to 100 delivery attempts, and without one a message
    that always fails is redelivered until it expires (7 days); "Subscription
    properties", https://cloud.google.com/pubsub/docs/subscription-properties: the
    acknowledgement deadline is 10 to 600 s."""
    if r.type != SUBSCRIPTION or not r.props.get("pushConfig"):
        return []
    out = []
    attempts = (r.props.get("deadLetterPolicy") or {}).get("maxDeliveryAttempts")
    if attempts is None:
        out.append("push subscription has no dead-letter policy")
    elif isinstance(attempts, (int, float)) and not 5 <= attempts <= 100:
        out.append(f"maxDeliveryAttempts is {attempts:g}; Pub/Sub takes 5 to 100")
    deadline = r.props.get("ackDeadlineSeconds")
    if isinstance(deadline, (int, float)) and not 10 <= deadline <= 600:
        out.append(f"ackDeadlineSeconds is {deadline:g}; Pub/Sub takes 10 to 600")
    return out


def dead_letters_can_be_forwarded(resources: list) -> list[tuple[str, str]]:
    """ "Handle message failures", https://cloud.google.com/pubsub/docs/handling-failures#grant_forwarding_permissions:
    Pub/Sub's service agent forwards a dead letter only with the Publisher role on the
    dead-letter topic and the Subscriber role on the source subscription; without them
    failed messages stay in the subscription."""
    agent = "@gcp-sa-pubsub.iam.gserviceaccount.com"
    topics = {
        r.props.get("topic")
        for r in resources
        if r.type == "gcp:pubsub/topicIAMMember:TopicIAMMember"
        and r.props.get("role") == "roles/pubsub.publisher"
        and agent in str(r.props.get("member", ""))
    }
    subs = {
        r.props.get("subscription")
        for r in resources
        if r.type == "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember"
        and r.props.get("role") == "roles/pubsub.subscriber"
        and agent in str(r.props.get("member", ""))
    }

    def last(value: Any) -> str:
        return str(value).rsplit("/", 1)[-1]

    out = []
    for sub in (r for r in resources if r.type == SUBSCRIPTION):
        dead = (sub.props.get("deadLetterPolicy") or {}).get("deadLetterTopic")
        if not isinstance(dead, str):
            continue
        if last(dead) not in {last(t) for t in topics}:
            out.append((sub.name, f"Pub/Sub's service agent cannot publish to the dead-letter topic {last(dead)}"))
        name = sub.props.get("name")
        if isinstance(name, str) and name not in {last(x) for x in subs}:
            out.append((sub.name, f"Pub/Sub's service agent cannot acknowledge on subscription {name}"))
    return out


def push_outlasts_its_function(resources: list) -> list[tuple[str, str]]:
    """ "Subscription properties", https://cloud.google.com/pubsub/docs/subscription-properties:
    a push subscription redelivers a message not acknowledged within its acknowledgement
    deadline, and a push endpoint acknowledges by answering. A deadline shorter than the
    function's timeout (``serviceConfig.timeoutSeconds``) lets a run still working be
    delivered again: two sweeps, or two repairs, at once."""
    functions = {r.urn: r for r in resources if r.type == FUNCTION}
    out = []
    for sub in (r for r in resources if r.type == SUBSCRIPTION and r.props.get("pushConfig")):
        deadline = sub.props.get("ackDeadlineSeconds")
        for urn in sub.deps("pushConfig"):
            fn = functions.get(urn)
            timeout = ((fn.props.get("serviceConfig") or {}) if fn is not None else {}).get("timeoutSeconds")
            if isinstance(deadline, int | float) and isinstance(timeout, int | float) and deadline < timeout:
                out.append(
                    (sub.name, f"ackDeadlineSeconds {deadline:g} is shorter than {fn.name}'s timeout {timeout:g} s")
                )
    return out


def sinks_can_publish(resources: list) -> list[tuple[str, str]]:
    """ "Route logs to supported destinations", https://cloud.google.com/logging/docs/export/configure_export_v2#dest-auth:
    a sink's writer identity needs the Publisher role on its Pub/Sub topic, or nothing
    it matches arrives."""
    granted = {
        (str(r.props.get("topic")).rsplit("/", 1)[-1], r.props.get("member"))
        for r in resources
        if r.type == "gcp:pubsub/topicIAMMember:TopicIAMMember" and r.props.get("role") == "roles/pubsub.publisher"
    }
    out = []
    for sink in (r for r in resources if r.type == "gcp:logging/projectSink:ProjectSink"):
        dest, writer = sink.props.get("destination"), sink.props.get("writerIdentity")
        if not (isinstance(dest, str) and dest.startswith("pubsub.googleapis.com/") and isinstance(writer, str)):
            continue
        if (dest.rsplit("/", 1)[-1], writer) not in granted:
            out.append((sink.name, f"its writer identity may not publish to {dest.rsplit('/', 1)[-1]}"))
    return out


AR_REPOSITORY = "gcp:artifactregistry/repository:Repository"
#: A remote repository's upstream kinds, as the provider's remoteRepositoryConfig names them.
REMOTE_UPSTREAMS = (
    "commonRepository",
    "dockerRepository",
    "mavenRepository",
    "npmRepository",
    "pythonRepository",
    "aptRepository",
    "yumRepository",
)


def remote_repository_has_one_upstream(r) -> list[str]:
    """ "Create remote repositories",
    https://cloud.google.com/artifact-registry/docs/repositories/remote-repo: a remote
    repository proxies one upstream source, a standard Artifact Registry repository or
    an external registry; with none it has nothing to fetch, and a remote repository
    takes no pushes."""
    if r.type != AR_REPOSITORY or r.props.get("mode") != "REMOTE_REPOSITORY":
        return []
    config = r.props.get("remoteRepositoryConfig")
    if not isinstance(config, dict):
        return ["a remote repository without remoteRepositoryConfig has no upstream"]
    upstreams = [k for k in REMOTE_UPSTREAMS if config.get(k)]
    return [] if len(upstreams) == 1 else [f"{len(upstreams)} upstreams ({', '.join(upstreams) or 'none'}); give one"]


ALERT_POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
#: "Create metric-absence alerting policies": the trigger absence time is at most 23.5 hours.
MAX_ABSENCE_S = 84600


def _seconds(duration: Any) -> float | None:
    """A protobuf Duration string ("600s", "1.5s") as seconds; None when unknown."""
    if not isinstance(duration, str) or not duration.endswith("s"):
        return None
    try:
        return float(duration[:-1])
    except ValueError:
        return None


def alert_durations_valid(r) -> list[str]:
    """Cloud Monitoring API, AlertPolicy.Condition.MetricThreshold.duration and
    MetricAbsence.duration (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies):
    only whole minutes are accepted; "Create metric-absence alerting policies"
    (https://cloud.google.com/monitoring/alerts/metric-absence): an absence is at most
    23.5 hours."""
    if r.type != ALERT_POLICY:
        return []
    out = []
    for condition in r.props.get("conditions") or []:
        if not isinstance(condition, dict):
            continue
        name = condition.get("displayName") or "a condition"
        for kind in ("conditionThreshold", "conditionAbsent"):
            seconds = _seconds((condition.get(kind) or {}).get("duration"))
            if seconds is None:
                continue
            if seconds % 60:
                out.append(f"{name}: duration {seconds:g} s is not a whole number of minutes")
            if kind == "conditionAbsent" and not 0 < seconds <= MAX_ABSENCE_S:
                out.append(f"{name}: an absence of {seconds:g} s is outside 1 minute to 23.5 hours")
    return out


#: (name, description, check, stack policy[, advisory]): infra/policies/ wraps them.
SPECS = (
    (
        "gcp-alert-durations",
        "Alert conditions last whole minutes; an absence at most 23.5 hours.",
        alert_durations_valid,
        False,
    ),
    (
        "artifact-registry-remote-upstream",
        "A remote Artifact Registry repository names exactly one upstream.",
        remote_repository_has_one_upstream,
        False,
    ),
    ("gcs-public-access-prevented", "Buckets enforce public access prevention.", public_access_prevented, False),
    ("gcs-uniform-access", "Buckets use uniform bucket-level access.", uniform_access, False),
    ("gcs-versioning-enabled", "Buckets keep noncurrent versions.", versioned, False),
    ("gcs-two-locations", "Checkpoint buckets are dual-region (turbo replication needs it).", two_locations, False),
    ("gcs-soft-delete-window", "Soft-delete retention is 0 or 7 to 90 days.", soft_delete_window, False),
    (
        "gcs-aging-rules-name-prefixes",
        "Lifecycle rules that age objects name their prefixes.",
        aging_rules_name_their_prefix,
        False,
    ),
    (
        "gcp-no-primitive-roles",
        "No IAM grant uses roles/owner, roles/editor or roles/viewer.",
        no_primitive_roles,
        False,
    ),
    ("gcp-no-world-ingress", "No firewall rule admits 0.0.0.0/0 or ::/0.", no_world_ingress, False),
    (
        "gcp-spot-never-restarts",
        "Spot templates never restart and are deleted on preemption.",
        spot_templates_never_restart,
        False,
    ),
    (
        "gcp-gpu-terminates-on-maintenance",
        "GPU templates terminate on host maintenance.",
        gpu_templates_terminate_on_maintenance,
        False,
    ),
    ("gcp-coordinator-on-demand", "The coordinator template is on-demand.", coordinator_on_demand, False),
    (
        "gcp-groups-heal-and-replace",
        "Instance groups auto-heal and replace VMs on update.",
        groups_heal_and_replace,
        False,
    ),
    (
        "gcp-regional-update-policy",
        "Regional group update policies fit their shape and state.",
        regional_update_policy,
        False,
    ),
    ("gcp-lustre-valid", "Managed Lustre capacity fits its performance tier.", lustre_valid, False),
    ("gcp-parallelstore-valid", "Parallelstore capacity and deployment type are valid.", parallelstore_valid, False),
    ("gcp-stateful-protected", "Buckets, file systems and keys are protected.", stateful_protected, False),
    (
        "gcp-file-system-private-access",
        "The file system's network has private services access.",
        file_system_has_private_access,
        True,
    ),
    (
        "gcp-functions-own-identity",
        "Functions run as their own service account.",
        functions_run_as_their_own_account,
        False,
    ),
    ("gcp-functions-internal-only", "Functions admit internal traffic only.", functions_internal_only, False),
    ("gcp-functions-runtime", "Functions use a supported Python runtime.", functions_supported_runtime, False),
    (
        "gcp-push-dead-letters",
        "Push subscriptions have a dead-letter policy and valid deadlines.",
        push_subscriptions_dead_letter,
        False,
    ),
    (
        "gcp-dead-letters-forwarded",
        "Pub/Sub's agent may forward dead letters.",
        dead_letters_can_be_forwarded,
        True,
    ),
    (
        "gcp-push-outlasts-function",
        "A push subscription's deadline is no shorter than its function's timeout.",
        push_outlasts_its_function,
        True,
    ),
    ("gcp-sinks-can-publish", "Log sinks may publish to their topics.", sinks_can_publish, True),
    (
        "gcp-cmek-agent-granted",
        "A CMEK bucket's key is granted to the Cloud Storage agent.",
        cmek_grants_the_storage_agent,
        True,
    ),
    *deployable.SPECS,
)
