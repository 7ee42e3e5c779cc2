"""Each GCP invariant catches its violation, and the CrossGuard pack runs them on the GCP stacks."""

from __future__ import annotations

import json

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from ftfleet.infra import policies
from ftfleet.infra.crossguard import build_policies
from ftfleet.infra.gcp import policies as gcp_policies
from tests.infra.conftest import recording, res_view

GCP_STACKS = ["gcp-dev", "gcp-prod"]
BUCKET = "gcp:storage/bucket:Bucket"
TEMPLATE = "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"

GOOD_BUCKET = {
    "location": "US",
    "customPlacementConfig": {"dataLocations": ["US-CENTRAL1", "US-EAST4"]},
    "rpo": "ASYNC_TURBO",
    "versioning": {"enabled": True},
    "uniformBucketLevelAccess": True,
    "publicAccessPrevention": "enforced",
    "softDeletePolicy": {"retentionDurationSeconds": 604800},
    "lifecycleRules": [
        {"action": {"type": "Delete"}, "condition": {"age": 120, "matchesPrefixes": ["checkpoints/"]}},
    ],
}
SPOT = {
    "provisioningModel": "SPOT",
    "preemptible": True,
    "automaticRestart": False,
    "onHostMaintenance": "TERMINATE",
    "instanceTerminationAction": "DELETE",
}
GOOD_MIG = {
    "distributionPolicyZones": ["us-central1-a"],
    "distributionPolicyTargetShape": "ANY_SINGLE_ZONE",
    "autoHealingPolicies": {"healthCheck": "hc", "initialDelaySec": 1200},
    "updatePolicy": {
        "type": "OPPORTUNISTIC",
        "minimalAction": "REPLACE",
        "instanceRedistributionType": "NONE",
        "maxSurgeFixed": 1,
        "maxUnavailableFixed": 1,
    },
}
FUNCTION = "gcp:cloudfunctionsv2/function:Function"
SUBSCRIPTION = "gcp:pubsub/subscription:Subscription"
INTERNAL = "ALLOW_INTERNAL_ONLY"
GOOD_FUNCTION = {
    "buildConfig": {"runtime": "python313", "serviceAccount": "projects/p/serviceAccounts/b@p.iam.gserviceaccount.com"},
    "serviceConfig": {"serviceAccountEmail": "fn@p.iam.gserviceaccount.com", "ingressSettings": INTERNAL},
}
GOOD_PUSH = {
    "name": "s",
    "pushConfig": {"pushEndpoint": "https://f"},
    "ackDeadlineSeconds": 90,
    "deadLetterPolicy": {"deadLetterTopic": "projects/p/topics/dead", "maxDeliveryAttempts": 5},
}


def res(type_token, props, name="r", **kw):
    kw.setdefault("protect", True)  # each bad resource breaks one rule; protection has its own case
    return policies.Res(type=type_token, name=name, urn=f"urn:{name}", props=props, **kw)


BAD_RESOURCES = {
    "gcs-public-access-prevented": res(BUCKET, {**GOOD_BUCKET, "publicAccessPrevention": "inherited"}),
    "gcs-uniform-access": res(BUCKET, {**GOOD_BUCKET, "uniformBucketLevelAccess": False}),
    "gcs-versioning-enabled": res(BUCKET, {**GOOD_BUCKET, "versioning": {"enabled": False}}),
    "gcs-two-locations": res(BUCKET, {**GOOD_BUCKET, "location": "US-CENTRAL1", "customPlacementConfig": None}),
    "gcs-soft-delete-window": res(BUCKET, {**GOOD_BUCKET, "softDeletePolicy": {"retentionDurationSeconds": 3600}}),
    "gcs-aging-rules-name-prefixes": res(
        BUCKET, {**GOOD_BUCKET, "lifecycleRules": [{"action": {"type": "Delete"}, "condition": {"age": 30}}]}
    ),
    "gcp-no-primitive-roles": res(
        "gcp:projects/iAMMember:IAMMember", {"project": "p", "role": "roles/editor", "member": "serviceAccount:x"}
    ),
    "gcp-no-world-ingress": res(
        "gcp:compute/firewall:Firewall",
        {"direction": "INGRESS", "sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp", "ports": ["22"]}]},
    ),
    "gcp-spot-never-restarts": res(
        TEMPLATE, {"machineType": "g2-standard-8", "scheduling": {**SPOT, "instanceTerminationAction": "STOP"}}
    ),
    "gcp-gpu-terminates-on-maintenance": res(
        TEMPLATE,
        {
            "machineType": "a2-ultragpu-8g",
            "scheduling": {"provisioningModel": "STANDARD", "onHostMaintenance": "MIGRATE"},
        },
    ),
    "gcp-coordinator-on-demand": res(
        TEMPLATE, {"machineType": "n2-standard-8", "labels": {"ftfleet-role": "coordinator"}, "scheduling": SPOT}
    ),
    "gcp-groups-heal-and-replace": res(MIG, {**GOOD_MIG, "autoHealingPolicies": None}),
    "gcp-regional-update-policy": res(
        MIG, {**GOOD_MIG, "updatePolicy": {**GOOD_MIG["updatePolicy"], "instanceRedistributionType": "PROACTIVE"}}
    ),
    "gcp-lustre-valid": res(
        "gcp:lustre/instance:Instance", {"capacityGib": "10000", "perUnitStorageThroughput": "1000", "filesystem": "f"}
    ),
    "gcp-parallelstore-valid": res(
        "gcp:parallelstore/instance:Instance", {"capacityGib": "14000", "deploymentType": "SCRATCH"}
    ),
    "gcp-stateful-protected": res(BUCKET, GOOD_BUCKET, protect=False),
    "gcp-functions-own-identity": res(FUNCTION, {**GOOD_FUNCTION, "serviceConfig": {"ingressSettings": INTERNAL}}),
    "gcp-functions-internal-only": res(
        FUNCTION, {**GOOD_FUNCTION, "serviceConfig": {**GOOD_FUNCTION["serviceConfig"], "ingressSettings": "ALLOW_ALL"}}
    ),
    "gcp-functions-runtime": res(FUNCTION, {**GOOD_FUNCTION, "buildConfig": {"runtime": "python37"}}),
    "gcp-push-dead-letters": res(SUBSCRIPTION, {**GOOD_PUSH, "deadLetterPolicy": None}),
    "gcp-node-image-pinned": res(
        TEMPLATE,
        {
            "machineType": "g2-standard-8",
            "scheduling": SPOT,
            "disks": [{"boot": True, "sourceImage": "projects/ubuntu-os-accelerator-images/global/images/family/x"}],
        },
    ),
    "gcp-groups-update-opportunistically": res(
        MIG, {**GOOD_MIG, "updatePolicy": {**GOOD_MIG["updatePolicy"], "type": "PROACTIVE"}}
    ),
    "gcp-log-metrics-extract-their-labels": res(
        "gcp:logging/metric:Metric",
        {
            "filter": "x",
            "metricDescriptor": {"metricKind": "DELTA", "valueType": "INT64", "labels": [{"key": "zone"}]},
            "labelExtractors": {"zones": "EXTRACT(jsonPayload.zone)"},
        },
    ),
    "gcp-a3-gpu-nics": res(
        TEMPLATE,
        {
            "machineType": "a3-megagpu-8g",
            "scheduling": {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"},
            "networkInterfaces": [{"subnetwork": "s", "nicType": "GVNIC"}],
        },
    ),
    "gcp-beta-preemption-notice": res(
        TEMPLATE, {"machineType": "g2-standard-8", "scheduling": {**SPOT, "preemptionNoticeDuration": {"seconds": 90}}}
    ),
    "gcp-alert-durations": res(
        "gcp:monitoring/alertPolicy:AlertPolicy",
        {"conditions": [{"displayName": "c", "conditionThreshold": {"duration": "90s"}}]},
    ),
    "artifact-registry-remote-upstream": res(
        "gcp:artifactregistry/repository:Repository",
        {"mode": "REMOTE_REPOSITORY", "format": "DOCKER", "remoteRepositoryConfig": {"description": "none"}},
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_RESOURCES))
def test_gcp_resource_policy_reports_its_violation(name):
    resource_policies = [p for p in policies.POLICIES if not p.stack]
    found = [p.name for p in resource_policies if p.check(BAD_RESOURCES[name])]
    assert found == [name]


def test_every_gcp_policy_is_registered_and_cites_its_document():
    names = {p.name for p in policies.POLICIES}
    for name, _, check, *_ in gcp_policies.SPECS:
        assert name in names
        assert check.__doc__ and ("https://" in check.__doc__ or name == "gcp-coordinator-on-demand"), name
    resource_specs = {name for name, _, _, stack, *_ in gcp_policies.SPECS if not stack}
    assert resource_specs == set(BAD_RESOURCES)


def test_the_good_examples_pass_so_each_bad_one_fails_for_its_own_reason():
    good = [
        res(BUCKET, GOOD_BUCKET, protect=True),
        res(TEMPLATE, {"machineType": "g2-standard-8", "scheduling": SPOT}),
        res(MIG, GOOD_MIG),
        res(FUNCTION, GOOD_FUNCTION, dependencies=["urn:builder"]),
        res(
            "gcp:projects/iAMMember:IAMMember",
            {"role": "roles/run.builder", "member": "serviceAccount:b@p.iam.gserviceaccount.com"},
            name="builder",
        ),
        res(SUBSCRIPTION, GOOD_PUSH),
        *forwarding_grants(),
    ]
    assert policies.evaluate(good) == []


def forwarding_grants(topic="projects/p/topics/dead", subscription="s"):
    """Pub/Sub's agent (made to exist by a ServiceIdentity) may forward dead letters."""
    agent = "serviceAccount:service-1@gcp-sa-pubsub.iam.gserviceaccount.com"
    made_by = {"member": ["urn:agent"]}
    return [
        res("gcp:projects/serviceIdentity:ServiceIdentity", {"service": "pubsub.googleapis.com"}, name="agent"),
        res(
            "gcp:pubsub/topicIAMMember:TopicIAMMember",
            {"topic": topic, "role": "roles/pubsub.publisher", "member": agent},
            property_dependencies=made_by,
        ),
        res(
            "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember",
            {"subscription": subscription, "role": "roles/pubsub.subscriber", "member": agent},
            property_dependencies=made_by,
        ),
    ]


@pytest.mark.parametrize("drop", [0, 1])
def test_dead_letters_the_pubsub_agent_cannot_forward_are_caught(drop):
    grants = forwarding_grants()
    del grants[1 + drop]
    found = gcp_policies.dead_letters_can_be_forwarded([res(SUBSCRIPTION, GOOD_PUSH, name="push"), *grants])
    assert len(found) == 1 and found[0][0] == "push"
    assert ("publish to the dead-letter topic dead" if drop == 0 else "acknowledge on subscription s") in found[0][1]


def test_a_sink_whose_writer_may_not_publish_to_its_topic_is_caught():
    sink = res(
        "gcp:logging/projectSink:ProjectSink",
        {"destination": "pubsub.googleapis.com/projects/p/topics/t", "writerIdentity": "serviceAccount:w@x"},
        name="sink",
    )
    grant = res(
        "gcp:pubsub/topicIAMMember:TopicIAMMember",
        {"topic": "t", "role": "roles/pubsub.publisher", "member": "serviceAccount:w@x"},
    )
    assert gcp_policies.sinks_can_publish([sink, grant]) == []
    assert gcp_policies.sinks_can_publish([sink]) == [("sink", "its writer identity may not publish to t")]


def test_the_function_source_bucket_is_held_to_the_bucket_rules_but_not_to_checkpoint_placement():
    source = {**GOOD_BUCKET, "location": "US-CENTRAL1", "customPlacementConfig": None}
    source["labels"] = {"ftfleet-purpose": "function-source"}
    assert policies.evaluate([res(BUCKET, source, protect=False)]) == []
    assert policies.evaluate([res(BUCKET, {**source, "uniformBucketLevelAccess": False}, protect=False)])


@pytest.mark.parametrize(
    "props, message",
    [
        (
            {"direction": "INGRESS", "allows": [{"protocol": "all"}]},
            "ingress rule has no source, which means 0.0.0.0/0",
        ),
        ({"sourceRanges": ["10.0.0.0/8", "::/0"], "allows": [{"protocol": "tcp"}]}, "ingress open to ::/0"),
    ],
)
def test_world_ingress_includes_a_rule_without_a_source_and_ipv6(props, message):
    assert gcp_policies.no_world_ingress(res("gcp:compute/firewall:Firewall", props)) == [message]


def test_a_primitive_role_inside_an_iam_policy_document_is_caught():
    policy = json.dumps({"bindings": [{"role": "roles/owner", "members": ["user:a@example.com"]}]})
    found = gcp_policies.no_primitive_roles(res("gcp:storage/bucketIAMPolicy:BucketIAMPolicy", {"policyData": policy}))
    assert found == ["grants the primitive role roles/owner"]


def test_a_stateful_group_must_recreate_without_surge():
    group = res(MIG, {**GOOD_MIG, "statefulInternalIps": [{"interfaceName": "nic0", "deleteRule": "NEVER"}]})
    assert gcp_policies.regional_update_policy(group) == [
        "a stateful group must update by RECREATE with maxSurgeFixed 0"
    ]


def test_a_regional_surge_between_zero_and_the_zone_count_is_caught():
    group = res(MIG, {**GOOD_MIG, "distributionPolicyZones": ["a", "b", "c"]})
    assert gcp_policies.regional_update_policy(group) == [
        "maxSurgeFixed 1 is neither 0 nor at least the group's 3 zones",
        "maxUnavailableFixed 1 is neither 0 nor at least the group's 3 zones",
    ]


def test_a_predefined_dual_region_and_a_country_dual_region_are_two_locations():
    nam4 = res(BUCKET, {**GOOD_BUCKET, "location": "NAM4", "customPlacementConfig": None})
    de = res(
        BUCKET,
        {
            **GOOD_BUCKET,
            "location": "DE",
            "customPlacementConfig": {"dataLocations": ["EUROPE-WEST3", "EUROPE-WEST10"]},
        },
    )
    mislabelled = res(BUCKET, {**GOOD_BUCKET, "location": "EU"})
    assert gcp_policies.two_locations(nam4) == gcp_policies.two_locations(de) == []
    assert gcp_policies.two_locations(mislabelled) == [
        "location EU with data locations ['us-central1', 'us-east4'] is not a dual-region; turbo replication needs one"
    ]


def test_a_file_system_without_private_services_access_is_caught():
    network = "projects/p/global/networks/n"
    lustre = res("gcp:lustre/instance:Instance", {"network": network}, name="fs")
    other = res("gcp:servicenetworking/connection:Connection", {"network": "projects/p/global/networks/other"})
    assert policies.evaluate([lustre, other]) == [
        ("gcp-file-system-private-access", "fs", f"network {network} has no private services access connection")
    ]


def test_a_private_services_range_too_small_for_the_file_system_is_caught():
    network = "projects/p/global/networks/n"
    store = res("gcp:parallelstore/instance:Instance", {"network": "n"}, name="fs")
    peering = res("gcp:servicenetworking/connection:Connection", {"network": network, "reservedPeeringRanges": ["psa"]})
    small = res("gcp:compute/globalAddress:GlobalAddress", {"name": "psa", "prefixLength": 26})
    assert gcp_policies.file_system_has_private_access([store, peering, small]) == [
        ("fs", "private services range psa is a /26; it needs /24 or larger")
    ]


def test_a_cmek_bucket_whose_key_is_not_granted_to_the_storage_agent_is_caught():
    key = "projects/p/locations/us/keyRings/r/cryptoKeys/k"
    bucket = res(BUCKET, {**GOOD_BUCKET, "encryption": {"defaultKmsKeyName": key}}, name="b")
    to_nodes = res(
        "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember",
        {
            "cryptoKeyId": key,
            "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
            "member": "serviceAccount:n@p.iam.gserviceaccount.com",
        },
    )
    assert gcp_policies.cmek_grants_the_storage_agent([bucket, to_nodes]) == [
        ("b", f"the Cloud Storage service agent is not granted encrypt/decrypt on {key}")
    ]


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_gcp_stack_passes_every_invariant_advisory_included(stack):
    assert policies.evaluate(res_view(recording(stack))) == []


def test_every_stateful_gcp_resource_of_prod_is_protected():
    rec = recording("gcp-prod")
    stateful = [
        r
        for r in rec.resources
        if r.type in gcp_policies.STATEFUL
        and (r.inputs.get("labels") or {}).get("ftfleet-purpose") != "function-source"
    ]
    assert {r.type for r in stateful} == set(gcp_policies.STATEFUL) - {"gcp:parallelstore/instance:Instance"}
    assert all(r.protect for r in stateful)


def _opts(protect: bool, ignore_changes: list[str] | None = None) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=protect,
        ignore_changes=ignore_changes or [],
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
        additional_secret_outputs=[],
    )


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_crossguard_pack_passes_the_recorded_gcp_stack_and_rejects_a_bad_resource(stack):
    rec = recording(stack)
    pack = {p.name: p for p in build_policies()}
    violations = []
    for r in rec.resources:
        args = ResourceValidationArgs(
            resource_type=r.type,
            props=r.inputs,
            urn=r.urn,
            name=r.name,
            opts=_opts(r.protect, r.ignore_changes),
            provider=None,
            config={},
        )
        for p in pack.values():
            if type(p).__name__ == "ResourceValidationPolicy":
                p.validate(args, lambda msg, urn=None, _p=p.name, _r=r.name: violations.append((_p, _r, msg)))
    providers = {
        r.urn: PolicyProviderResource(resource_type=r.type, props=r.inputs, urn=r.urn, name=r.name)
        for r in rec.resources
        if r.type.startswith("pulumi:providers:")
    }
    resources = [
        PolicyResource(
            resource_type=r.type,
            props=r.inputs,
            urn=r.urn,
            name=r.name,
            opts=_opts(r.protect, r.ignore_changes),
            provider=providers.get(r.provider),
            parent=None,
            dependencies=[],
            property_dependencies={},
        )
        for r in rec.resources
    ]
    # What `pulumi preview` hands a stack policy: each resource's dependencies, and the
    # resources each property came from, as resources.
    by_urn = {p.urn: p for p in resources}
    for policy_resource, r in zip(resources, rec.resources, strict=True):
        policy_resource.dependencies = [by_urn[u] for u in r.dependencies if u in by_urn]
        policy_resource.property_dependencies = {
            prop: [by_urn[u] for u in urns if u in by_urn] for prop, urns in r.property_dependencies.items()
        }
    for p in pack.values():
        if type(p).__name__ == "StackValidationPolicy":
            p.validate(
                StackValidationArgs(resources=resources, config={}),
                lambda msg, urn=None, _p=p.name: violations.append((_p, urn, msg)),
            )
    assert violations == []

    bad = BAD_RESOURCES["gcp-stateful-protected"]
    reported = []
    pack["gcp-stateful-protected"].validate(
        ResourceValidationArgs(
            resource_type=bad.type,
            props=bad.props,
            urn=bad.urn,
            name=bad.name,
            opts=_opts(False),
            provider=None,
            config={},
        ),
        lambda msg, urn=None: reported.append(msg),
    )
    assert reported == ["Bucket is not protected"]


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_a_push_subscription_whose_deadline_is_shorter_than_its_functions_timeout_is_caught(stack):
    from ftfleet.infra.gcp.policies import FUNCTION

    fn = res(FUNCTION, {"serviceConfig": {"timeoutSeconds": 540}}, name="sweep")
    short = res(
        SUBSCRIPTION,
        {**GOOD_PUSH, "ackDeadlineSeconds": 90},
        name="push",
        property_dependencies={"pushConfig": [fn.urn]},
    )
    found = gcp_policies.push_outlasts_its_function([fn, short])
    assert found == [("push", "ackDeadlineSeconds 90 is shorter than sweep's timeout 540 s")]
    long = res(
        SUBSCRIPTION,
        {**GOOD_PUSH, "ackDeadlineSeconds": 570},
        name="push",
        property_dependencies={"pushConfig": [fn.urn]},
    )
    assert gcp_policies.push_outlasts_its_function([fn, long]) == []
    # The recorded stack's subscriptions are linked to their functions and pass.
    resources = res_view(recording(stack))
    linked = [r for r in resources if r.type == SUBSCRIPTION and r.deps("pushConfig")]
    assert linked and gcp_policies.push_outlasts_its_function(resources) == []


def test_an_absence_longer_than_monitoring_allows_is_caught_and_the_stacks_alerts_pass():
    long = res(
        "gcp:monitoring/alertPolicy:AlertPolicy",
        {"conditions": [{"displayName": "silent", "conditionAbsent": {"duration": "86400s"}}]},
    )
    assert gcp_policies.alert_durations_valid(long) == [
        "silent: an absence of 86400 s is outside 1 minute to 23.5 hours"
    ]
    for r in res_view(recording("gcp-prod")):
        assert gcp_policies.alert_durations_valid(r) == [], r.name
