"""The GCP remediation functions as the program declares them (infra/gcp/functions.py)."""

from __future__ import annotations

import copy
import json

import pytest

from ftfleet.infra import policies, stackfile
from ftfleet.infra.gcp import alerts, function_package, functions
from ftfleet.infra.gcp.function_source import desired_bucket_settings
from ftfleet.lambdas.common import push
from ftfleet.lambdas.gcp_capacity_watch import config as capacity_config
from ftfleet.lambdas.gcp_capacity_watch.config import Config as CapacityConfig
from ftfleet.lambdas.gcp_preemption.config import METRICS as PREEMPTION_METRICS
from ftfleet.lambdas.gcp_preemption.config import Config as PreemptionConfig
from ftfleet.lambdas.gcp_replication_watch import config as watch_config
from ftfleet.lambdas.gcp_replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.gcp_retention_sweep import config as sweep_config
from ftfleet.lambdas.gcp_retention_sweep.config import Config as SweepConfig
from ftfleet.lambdas.gcp_storage_drift.config import Config as DriftConfig
from tests.infra.conftest import recording, res_view

FUNCTION = "gcp:cloudfunctionsv2/function:Function"
SUBSCRIPTION = "gcp:pubsub/subscription:Subscription"
ALERT = "gcp:monitoring/alertPolicy:AlertPolicy"
DESCRIPTOR = "gcp:monitoring/metricDescriptor:MetricDescriptor"
CONFIGS = {
    "gcp_preemption": PreemptionConfig,
    "gcp_storage_drift": DriftConfig,
    "gcp_replication_watch": WatchConfig,
    "gcp_retention_sweep": SweepConfig,
    "gcp_capacity_watch": CapacityConfig,
}
SWITCHES = {
    "remediationSpotInterruption": ("gcp_preemption", "gcp:logging/projectSink:ProjectSink"),
    "remediationStorageDrift": ("gcp_storage_drift", "gcp:logging/projectSink:ProjectSink"),
    "remediationReplicationLag": ("gcp_replication_watch", "gcp:cloudscheduler/job:Job"),
    "remediationRetentionSweep": ("gcp_retention_sweep", "gcp:cloudscheduler/job:Job"),
    "remediationCapacityWatch": ("gcp_capacity_watch", "gcp:cloudscheduler/job:Job"),
}
#: Each scheduled function's metrics and alert policies, which go with it.
ALERTED = {
    "remediationReplicationLag": (watch_config.METRICS, {"replication-lag", "watch-silent"}),
    "remediationRetentionSweep": (sweep_config.METRICS, {"retention-failures", "sweep-silent"}),
    "remediationCapacityWatch": (capacity_config.METRICS, {"capacity-lost", "capacity-silent"}),
}


def by_function(rec):
    return {f.inputs["description"].split()[1]: f for f in rec.of_type(FUNCTION)}


@pytest.mark.parametrize("stack", ["gcp-dev", "gcp-prod"])
def test_every_function_is_private_runs_as_its_own_account_and_reads_back_its_config(stack):
    rec = recording(stack)
    fns = by_function(rec)
    assert set(fns) == set(CONFIGS)
    accounts = {a.outputs["email"] for a in rec.of_type("gcp:serviceaccount/account:Account")}
    emails = set()
    for name, fn in fns.items():
        service = fn.inputs["serviceConfig"]
        assert service["ingressSettings"] == "ALLOW_INTERNAL_ONLY"
        assert service["serviceAccountEmail"] in accounts and "-nodes@" not in service["serviceAccountEmail"]
        emails.add(service["serviceAccountEmail"])
        assert fn.inputs["buildConfig"]["runtime"] == function_package.RUNTIME
        cfg = CONFIGS[name].from_env(service["environmentVariables"])  # what the cold start reads
        assert cfg.stack == stack
    assert len(emails) == len(CONFIGS)


def test_each_push_subscription_authenticates_backs_off_and_dead_letters_into_a_kept_topic():
    rec = recording("gcp-prod")
    urns = rec.by_urn()
    pusher = next(a for a in rec.of_type("gcp:serviceaccount/account:Account") if a.name.endswith("-push"))
    pushes = [s for s in rec.of_type(SUBSCRIPTION) if s.inputs.get("pushConfig")]
    assert len(pushes) == len(CONFIGS)
    for sub in pushes:
        (fn,) = [urns[u] for u in sub.deps("pushConfig") if urns[u].type == FUNCTION]
        assert sub.inputs["pushConfig"]["oidcToken"]["serviceAccountEmail"] == pusher.outputs["email"]
        assert sub.inputs["pushConfig"]["pushEndpoint"] == fn.outputs["url"]
        assert sub.inputs["deadLetterPolicy"]["maxDeliveryAttempts"] == functions.MAX_DELIVERY_ATTEMPTS
        assert sub.inputs["ackDeadlineSeconds"] >= fn.inputs["serviceConfig"]["timeoutSeconds"]
        dead_topic = sub.inputs["deadLetterPolicy"]["deadLetterTopic"]
        keepers = [s for s in rec.of_type(SUBSCRIPTION) if s.inputs["topic"] == dead_topic]
        assert len(keepers) == 1 and keepers[0].inputs["messageRetentionDuration"] == "604800s"
    invokers = {
        (r.inputs["name"], r.inputs["member"]) for r in rec.of_type("gcp:cloudrunv2/serviceIamMember:ServiceIamMember")
    }
    assert invokers == {(f.outputs["name"], pusher.outputs["member"]) for f in rec.of_type(FUNCTION)}


def test_each_function_holds_only_its_grants_on_the_stacks_bucket():
    rec = recording("gcp-prod")
    bucket = next(b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-ckpt-bucket"))
    source = next(b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-source-bucket"))
    scopes = {bucket.outputs["name"]: "bucket", source.outputs["name"]: "source"}
    grants: dict[str, set] = {}
    for name, fn in by_function(rec).items():
        member = f"serviceAccount:{fn.inputs['serviceConfig']['serviceAccountEmail']}"
        grants[name] = set()
        for r in rec.resources:
            if r.inputs.get("member") == member:
                scope = scopes.get(r.inputs.get("bucket"), r.type.split(":")[1])
                grants[name].add((scope, r.inputs["role"]))
    roles = {r.name.rsplit("-", 2)[-2]: r for r in rec.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    drift_role, sweep_role, capacity_role = roles.pop("drift"), roles.pop("sweep"), roles.pop("capwatch")
    assert not roles
    assert grants == {
        "gcp_preemption": {("bucket", "roles/storage.objectUser")},  # it writes no metric: its logs are counted
        "gcp_storage_drift": {("bucket", drift_role.outputs["name"]), ("source", "roles/storage.objectViewer")},
        "gcp_replication_watch": {
            ("bucket", "roles/storage.objectViewer"),
            ("projects/iAMMember", "roles/monitoring.metricWriter"),
        },
        "gcp_retention_sweep": {
            ("bucket", sweep_role.outputs["name"]),
            ("projects/iAMMember", "roles/monitoring.metricWriter"),
        },
        # Its state object next to the checkpoints; the groups, read through its role.
        "gcp_capacity_watch": {
            ("bucket", "roles/storage.objectUser"),
            ("projects/iAMMember", capacity_role.outputs["name"]),
            ("projects/iAMMember", "roles/monitoring.metricWriter"),
        },
    }
    assert sorted(capacity_role.inputs["permissions"]) == sorted(functions.CAPACITY_PERMISSIONS)
    assert sorted(drift_role.inputs["permissions"]) == sorted(functions.DRIFT_PERMISSIONS)
    assert sorted(sweep_role.inputs["permissions"]) == sorted(functions.SWEEP_PERMISSIONS)


def test_the_sinks_match_only_this_stack_and_their_writers_may_publish():
    rec = recording("gcp-prod")
    sinks = {s.inputs["name"]: s for s in rec.of_type("gcp:logging/projectSink:ProjectSink")}
    preempt, drift = sinks["ftfleet-gcp-prod-preempt"], sinks["ftfleet-gcp-prod-drift"]
    assert 'protoPayload.methodName="compute.instances.preempted"' in preempt.inputs["filter"]
    assert 'protoPayload.resourceName:"/instances/ftfleet-gcp-prod-"' in preempt.inputs["filter"]
    bucket = next(b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-ckpt-bucket"))
    assert f'resource.labels.bucket_name="{bucket.outputs["name"]}"' in drift.inputs["filter"]
    for sink in sinks.values():
        assert sink.inputs["uniqueWriterIdentity"] is True
        assert sink.inputs["destination"].startswith("pubsub.googleapis.com/projects/")


@pytest.mark.parametrize("key", sorted(SWITCHES))
def test_each_switch_removes_its_function_with_what_feeds_it(gcp_variant, key):
    function, feeder = SWITCHES[key]
    on, off = gcp_variant(), gcp_variant(**{key: False})
    assert function in by_function(on) and function not in by_function(off)
    assert len(list(off.of_type(feeder))) == len(list(on.of_type(feeder))) - 1
    if key in ALERTED:
        metrics, alerts_of = ALERTED[key]
        assert alerts_of <= set(alert_policies(on)) and not alerts_of & set(alert_policies(off))
        assert not {m.type for m in metrics} & {d.inputs["type"] for d in off.of_type(DESCRIPTOR)}


def test_with_every_switch_off_nothing_of_the_functions_is_declared(gcp_variant):
    rec = gcp_variant(**{key: False for key in SWITCHES})
    assert not list(rec.of_type(FUNCTION))
    assert not [r for r in rec.resources if "RemediationFunctions$" in r.urn and r.custom]


def alert_policies(rec) -> dict[str, dict]:
    return {a.name.rsplit("-alerts-", 1)[1]: a for a in rec.of_type(ALERT)}


def test_the_alerts_notify_the_configured_channels(gcp_variant):
    channel = "projects/my-project/notificationChannels/12345"
    rec = gcp_variant(gcpAlertNotificationChannels=[channel], replicationLagAlarmSeconds=1200)
    policies = alert_policies(rec)
    assert set(policies) == {
        "replication-lag",
        "watch-silent",
        "retention-failures",
        "sweep-silent",
        "capacity-lost",
        "capacity-silent",
    }
    for alert in policies.values():
        assert alert.inputs["notificationChannels"] == [channel]
    for condition in policies["replication-lag"].inputs["conditions"]:
        assert condition["conditionThreshold"]["thresholdValue"] == 1200


def test_every_custom_metric_a_function_writes_has_a_descriptor_the_function_and_alerts_wait_for():
    rec = recording("gcp-prod")
    urns = rec.by_urn()
    descriptors = {d.inputs["type"]: d for d in rec.of_type(DESCRIPTOR)}
    written = {
        m.type: m for m in (*PREEMPTION_METRICS, *watch_config.METRICS, *sweep_config.METRICS, *capacity_config.METRICS)
    }
    assert set(descriptors) == set(written)
    for metric_type, d in descriptors.items():
        metric = written[metric_type]
        assert (d.inputs["metricKind"], d.inputs["valueType"]) == ("GAUGE", "DOUBLE")
        assert [label["key"] for label in d.inputs["labels"]] == list(metric.labels)
    fns = by_function(rec)
    for name, metrics in (
        ("gcp_preemption", PREEMPTION_METRICS),
        ("gcp_replication_watch", watch_config.METRICS),
        ("gcp_retention_sweep", sweep_config.METRICS),
        ("gcp_capacity_watch", capacity_config.METRICS),
    ):
        waits = {urns[u].inputs.get("type") for u in fns[name].dependencies if urns[u].type == DESCRIPTOR}
        assert waits == {m.type for m in metrics}, name
    assert not [v for v in policies.evaluate(res_view(rec)) if v[0] == "gcp-alerts-know-their-metrics"]


def test_the_capacity_watch_reads_the_stacks_groups_and_alerts_past_capacity_loss_minutes():
    rec = recording("gcp-prod")
    cfg = CapacityConfig.from_env(
        by_function(rec)["gcp_capacity_watch"].inputs["serviceConfig"]["environmentVariables"]
    )
    groups = {
        g.outputs["name"] for g in rec.of_type("gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager")
    }
    assert set(cfg.groups) == groups and cfg.region == "us-central1" and cfg.loss_s == 20 * 60
    assert cfg.state_key == "checkpoints/llm-prod/fleet/capacity-watch-gcp-prod.json"  # a standby has its own
    (condition,) = alert_policies(rec)["capacity-lost"].inputs["conditions"]
    assert condition["conditionThreshold"]["filter"] == (
        f'metric.type="{capacity_config.CAPACITY_SHORT_SECONDS.type}" AND resource.type="global" '
        'AND metric.label.stack="gcp-prod"'
    )
    assert condition["conditionThreshold"]["thresholdValue"] == 20 * 60 - 1
    (job,) = [j for j in rec.of_type("gcp:cloudscheduler/job:Job") if j.name.endswith("-capwatch")]
    assert job.inputs["schedule"] == functions.CAPACITY_SCHEDULE


def test_the_lag_alert_watches_cloud_storages_turbo_delay_for_the_bucket_and_the_measured_lag():
    rec = recording("gcp-prod")
    bucket = next(b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-ckpt-bucket"))
    conditions = [c["conditionThreshold"] for c in alert_policies(rec)["replication-lag"].inputs["conditions"]]
    turbo, measured = (c["filter"] for c in conditions)
    assert turbo == (
        f'metric.type="{alerts.TURBO_MAX_DELAY}" AND resource.type="gcs_bucket" '
        f'AND resource.label.bucket_name="{bucket.outputs["name"]}"'
    )
    assert measured == (
        f'metric.type="{watch_config.LAG.type}" AND resource.type="global" AND metric.label.stack="gcp-prod"'
    )
    assert all(c["comparison"] == "COMPARISON_GT" and c["thresholdValue"] == 900 for c in conditions)


def test_default_replication_has_no_turbo_delay_so_only_the_measured_lag_is_alerted_on(gcp_variant):
    rec = gcp_variant(gcsTurboReplication=False)
    (condition,) = alert_policies(rec)["replication-lag"].inputs["conditions"]
    assert watch_config.LAG.type in condition["conditionThreshold"]["filter"]
    assert alerts.TURBO_MAX_DELAY not in str(alert_policies(rec))


def test_a_watch_that_stops_reporting_opens_an_incident():
    (condition,) = alert_policies(recording("gcp-dev"))["watch-silent"].inputs["conditions"]
    absent = condition["conditionAbsent"]
    assert absent["filter"] == (
        f'metric.type="{watch_config.HEARTBEAT.type}" AND resource.type="global" AND metric.label.stack="gcp-dev"'
    )
    # Longer than several runs of the five-minute schedule, so one slow run is no incident.
    assert int(absent["duration"].rstrip("s")) >= 3 * 300 and functions.REPLICATION_SCHEDULE == "*/5 * * * *"


def test_an_alert_on_a_custom_metric_without_its_descriptor_or_resource_type_is_caught():
    view = copy.deepcopy(res_view(recording("gcp-dev")))  # the recording is shared: change a copy
    lag = next(r for r in view if r.type == ALERT and r.name.endswith("-replication-lag"))
    lag.dependencies = [u for u in lag.dependencies if "MetricDescriptor" not in u]
    silent = next(r for r in view if r.type == ALERT and r.name.endswith("-watch-silent"))
    absent = silent.props["conditions"][0]["conditionAbsent"]
    absent["filter"] = absent["filter"].replace(' AND resource.type="global"', "")
    found = [(n, msg) for p, n, msg in policies.evaluate(view) if p == "gcp-alerts-know-their-metrics"]
    found = dict(found)
    assert set(found) == {lag.name, silent.name}
    assert "does not wait for" in found[lag.name] and "names no resource.type" in found[silent.name]


def test_the_source_zip_holds_the_entry_point_the_handler_and_the_shared_code():
    name, _ = function_package.archive("gcp_preemption")
    files = function_package.contents("gcp_preemption")
    assert name == f"functions/gcp_preemption-{function_package.digest(files)}.zip"
    assert "from ftfleet.lambdas.gcp_preemption.handler import handler" in files["main.py"].decode()
    assert b"functions-framework==" in files["requirements.txt"]
    for path in ("ftfleet/contract.py", "ftfleet/lambdas/common/push.py", "ftfleet/lambdas/gcp_preemption/handler.py"):
        assert path in files
    assert not any("__pycache__" in p for p in files)
    compile(files["main.py"], "main.py", "exec")  # the entry point is valid Python
    changed = {**files, "ftfleet/contract.py": files["ftfleet/contract.py"] + b"\n"}
    assert function_package.digest(changed) != function_package.digest(files)


class Request:
    def __init__(self, body):
        self.body = body

    def get_json(self, silent=False):
        return self.body


def test_a_push_request_reaches_the_handler_as_its_data_and_is_acknowledged():
    seen = []
    assert push.serve(seen.append, Request({"message": {"data": "e30="}})) == ("", 204)
    assert seen == [{"data": {"message": {"data": "e30="}}}]


def test_a_handler_failure_is_not_acknowledged_so_pubsub_redelivers():
    def failing(event):
        raise RuntimeError("transient")

    with pytest.raises(RuntimeError):
        push.serve(failing, Request({"message": {}}))


def test_functions_build_as_a_dedicated_account_that_holds_only_the_builder_role_first():
    rec = recording("gcp-prod")
    urns = rec.by_urn()
    (builder,) = [a for a in rec.of_type("gcp:serviceaccount/account:Account") if a.name.endswith("-build")]
    grants = {
        (r.type.split(":")[1], r.inputs["role"])
        for r in rec.resources
        if r.inputs.get("member") == builder.outputs["member"]
    }
    assert grants == {("projects/iAMMember", functions.BUILDER_ROLE)}
    (grant,) = [
        r for r in rec.of_type("gcp:projects/iAMMember:IAMMember") if r.inputs["role"] == functions.BUILDER_ROLE
    ]
    for fn in rec.of_type(FUNCTION):
        assert fn.inputs["buildConfig"]["serviceAccount"] == builder.outputs["name"]
        assert grant.urn in fn.dependencies
        # The build account is not one the function runs as.
        assert fn.inputs["serviceConfig"]["serviceAccountEmail"] != builder.outputs["email"]
    assert builder.urn in {u for u in grant.dependencies if u in urns}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda fn, grant: fn.props["buildConfig"].pop("serviceAccount"), "default build account"),
        (
            lambda fn, grant: fn.props["buildConfig"].update(
                serviceAccount="projects/p/serviceAccounts/123@cloudbuild.gserviceaccount.com"
            ),
            "default account",
        ),
        (lambda fn, grant: fn.dependencies.remove(grant.urn), "does not wait for"),
    ],
)
def test_a_function_building_as_a_default_or_ungranted_account_is_caught(change, message):
    view = copy.deepcopy(res_view(recording("gcp-dev")))
    fn = next(r for r in view if r.type == FUNCTION)
    grant = next(
        r for r in view if r.type == "gcp:projects/iAMMember:IAMMember" and r.props["role"] == functions.BUILDER_ROLE
    )
    change(fn, grant)
    found = [(n, msg) for p, n, msg in policies.evaluate(view) if p == "gcp-functions-build-identity"]
    assert len(found) == 1 and found[0][0] == fn.name and message in found[0][1]


def test_grants_to_pubsubs_agent_wait_for_the_service_identity_that_makes_it_exist():
    rec = recording("gcp-prod")
    (agent,) = rec.of_type("gcp:projects/serviceIdentity:ServiceIdentity")
    assert agent.inputs["service"] == "pubsub.googleapis.com"
    pubsub_api = next(
        r for r in rec.of_type("gcp:projects/service:Service") if r.inputs["service"] == "pubsub.googleapis.com"
    )
    assert pubsub_api.urn in agent.dependencies
    grants = [r for r in rec.resources if r.inputs.get("member") == agent.outputs["member"]]
    # the push identity's token creator, and per function: dead-letter publisher and subscriber
    assert len(grants) == 1 + 2 * len(CONFIGS)
    assert all(agent.urn in g.deps("member") for g in grants)


def test_a_grant_to_a_service_agent_named_from_the_project_number_is_caught():
    view = copy.deepcopy(res_view(recording("gcp-dev")))
    agent = next(r for r in view if r.type == "gcp:projects/serviceIdentity:ServiceIdentity")
    grant = next(
        r for r in view if r.type == "gcp:pubsub/topicIAMMember:TopicIAMMember" and agent.urn in r.deps("member")
    )
    grant.property_dependencies["member"] = []  # what `service-{number}@gcp-sa-pubsub...` from getProject gives
    found = [(n, msg) for p, n, msg in policies.evaluate(view) if p == "gcp-service-agents-exist-first"]
    assert found == [
        (grant.name, f"grants roles/pubsub.publisher to {grant.props['member']}, which nothing here makes exist first")
    ]


def test_the_stack_writes_the_drift_functions_desired_state_before_it_changes_the_bucket():
    rec = recording("gcp-prod")
    urns = rec.by_urn()
    bucket = next(b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-ckpt-bucket"))
    (desired,) = [o for o in rec.of_type("gcp:storage/bucketObject:BucketObject") if o.name.endswith("-desired")]
    # Every create or update of the bucket waits for the document.
    assert desired.urn in bucket.dependencies
    document = json.loads(desired.inputs["source"]["text"])
    assert document == desired_bucket_settings(stackfile.load("gcp-prod").settings())
    assert document["soft_delete_seconds"] == 14 * 86400
    source = urns[desired.deps("bucket")[0]]
    cfg = DriftConfig.from_env(by_function(rec)["gcp_storage_drift"].inputs["serviceConfig"]["environmentVariables"])
    assert cfg.desired_uri == f"gs://{source.outputs['name']}/{desired.inputs['name']}"
    assert cfg.buckets == (bucket.outputs["name"],)


def test_without_the_drift_function_there_is_no_desired_state_to_wait_for(gcp_variant):
    rec = gcp_variant(remediationStorageDrift=False)
    assert not [o for o in rec.of_type("gcp:storage/bucketObject:BucketObject") if o.name.endswith("-desired")]


def test_preemptions_are_counted_by_cloud_logging_from_the_functions_decision_lines():
    rec = recording("gcp-prod")
    (metric,) = rec.of_type("gcp:logging/metric:Metric")
    fn = by_function(rec)["gcp_preemption"]
    assert metric.inputs["filter"] == functions.preemption_count_filter("gcp-prod", fn.inputs["name"])
    assert f'resource.labels.service_name="{fn.inputs["name"]}"' in metric.inputs["filter"]
    descriptor = metric.inputs["metricDescriptor"]
    assert (descriptor["metricKind"], descriptor["valueType"]) == ("DELTA", "INT64")
    assert metric.inputs["labelExtractors"] == {
        "zone": "EXTRACT(jsonPayload.zone)",
        "machine_type": "EXTRACT(jsonPayload.machine_type)",
    }
    assert not PREEMPTION_METRICS  # the function writes no time series of its own
