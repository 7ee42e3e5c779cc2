"""The remediation functions as the program declares them: each with its trigger, the
permission for it, a scoped role, a dead-letter queue, a timeout, bounded retries and a
log group with retention; each switch removes its function, rules and alarms."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ftfleet import contract
from ftfleet.infra.aws import lambda_package, remediation_patterns
from ftfleet.lambdas.capacity_watch.config import Config as CapacityConfig
from ftfleet.lambdas.common.config import FunctionConfig
from ftfleet.lambdas.lifecycle_handoff.config import Config as HandoffConfig
from ftfleet.lambdas.replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.retention_sweep.config import Config as SweepConfig
from ftfleet.lambdas.spot_interruption.config import Config as SpotConfig
from ftfleet.lambdas.storage_drift.config import DESIRED_FILE
from ftfleet.lambdas.storage_drift.config import Config as DriftConfig
from ftfleet.lambdas.storage_drift.desired import api_shape
from ftfleet.lambdas.unhealthy_node.config import Config as UnhealthyConfig
from tests.infra.conftest import recording

FUNCTION = "aws:lambda/function:Function"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
PERMISSION = "aws:lambda/permission:Permission"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
FOLDERS = (
    "spot_interruption",
    "lifecycle_handoff",
    "unhealthy_node",
    "storage_drift",
    "replication_watch",
    "capacity_watch",
    "retention_sweep",
)
CONFIGS: dict[str, type[FunctionConfig]] = {
    "spot_interruption": SpotConfig,
    "lifecycle_handoff": HandoffConfig,
    "unhealthy_node": UnhealthyConfig,
    "storage_drift": DriftConfig,
    "replication_watch": WatchConfig,
    "capacity_watch": CapacityConfig,
    "retention_sweep": SweepConfig,
}
#: Rules (by the end of their physical name) each function is triggered by.
TRIGGERS = {
    "spot_interruption": {"spot-interruption", "rebalance"},
    "lifecycle_handoff": {"lifecycle-action"},
    "unhealthy_node": {"node-sweep"},
    "storage_drift": {"bucket-calls", "association-calls"},
    "replication_watch": {"replication-watch"},
    "capacity_watch": {"capacity-watch"},
    "retention_sweep": {"retention-sweep"},
}
SWITCHES = {
    "remediationSpotInterruption": "spot_interruption",
    "remediationLifecycleHandoff": "lifecycle_handoff",
    "remediationUnhealthyNodes": "unhealthy_node",
    "remediationStorageDrift": "storage_drift",
    "remediationReplicationLag": "replication_watch",
    "remediationCapacityWatch": "capacity_watch",
    "remediationRetentionSweep": "retention_sweep",
}


def functions(rec):
    return {r.inputs["handler"].split(".")[2]: r for r in rec.of_type(FUNCTION)}


def by_urn(rec):
    return rec.by_urn()


def triggers_of(rec, fn):
    """The rules whose target is ``fn``."""
    urns = by_urn(rec)
    return [urns[t.deps("rule")[0]] for t in rec.of_type(TARGET) if fn.urn in t.deps("arn")]


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_every_function_is_deployed_with_its_triggers_permission_dlq_timeout_and_logs(stack):
    rec = recording(stack)
    fns = functions(rec)
    assert set(fns) == set(FOLDERS)
    urns = by_urn(rec)
    for folder, fn in fns.items():
        i = fn.inputs
        assert i["runtime"] == lambda_package.RUNTIME and i["handler"] == lambda_package.handler_path(folder)
        assert 0 < i["timeout"] <= 900
        # triggers, each with a permission for exactly that rule
        rules = triggers_of(rec, fn)
        assert {r.inputs["name"].removeprefix(f"ftfleet-{stack}-") for r in rules} == TRIGGERS[folder]
        for rule in rules:
            perms = [p for p in rec.of_type(PERMISSION) if rule.urn in p.deps("sourceArn")]
            assert len(perms) == 1 and perms[0].inputs["principal"] == "events.amazonaws.com"
            assert fn.urn in perms[0].deps("function")
            target = next(t for t in rec.of_type(TARGET) if rule.urn in t.deps("rule"))
            assert target.inputs["retryPolicy"]["maximumRetryAttempts"] <= 185
            assert target.inputs["deadLetterConfig"]["arn"] == i["deadLetterConfig"]["targetArn"]
        # its own dead-letter queue, role and log group
        (dlq,) = [urns[u] for u in fn.deps("deadLetterConfig")]
        assert dlq.type == "aws:sqs/queue:Queue" and dlq.inputs["name"].endswith("-dlq")
        (role,) = [urns[u] for u in fn.deps("role")]
        others = [f for f in fns.values() if f is not fn]
        assert all(role.urn not in f.deps("role") for f in others)
        groups = [
            r for r in rec.of_type("aws:cloudwatch/logGroup:LogGroup") if r.inputs["name"] == f"/aws/lambda/{i['name']}"
        ]
        assert len(groups) == 1 and groups[0].inputs["retentionInDays"] == 30
        assert groups[0].urn in fn.dependencies
        # bounded retries of asynchronous invocations
        (invoke,) = [
            r
            for r in rec.of_type("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")
            if fn.urn in r.deps("functionName")
        ]
        assert invoke.inputs["maximumRetryAttempts"] <= 2


def test_the_environment_the_program_renders_is_what_each_function_accepts_at_cold_start(tmp_path):
    for folder, fn in functions(recording("aws-prod")).items():
        env = dict(fn.inputs["environment"]["variables"])
        if folder == "storage_drift":
            desired = fn.inputs["code"]["assets"][f"ftfleet/lambdas/storage_drift/{DESIRED_FILE}"]["text"]
            (tmp_path / DESIRED_FILE).write_text(desired)
            env["FTFLEET_DESIRED_FILE"] = str(tmp_path / DESIRED_FILE)
        cfg = CONFIGS[folder].from_env(env)
        assert cfg.stack == "aws-prod" and cfg.run_id == "llm-prod"


def test_the_handoff_waits_as_long_as_the_hook_and_beats_within_it():
    fns = functions(recording("aws-prod"))
    cfg = HandoffConfig.from_env(fns["lifecycle_handoff"].inputs["environment"]["variables"])
    assert cfg.max_wait_s == 300 and cfg.heartbeat_s < 300
    assert fns["lifecycle_handoff"].inputs["timeout"] >= cfg.max_wait_s + 30
    assert set(cfg.groups) == {g.outputs["name"] for g in recording("aws-prod").of_type("aws:autoscaling/group:Group")}


def test_storage_drift_restores_exactly_what_the_bucket_resources_declare():
    rec = recording("aws-prod")
    fn = functions(rec)["storage_drift"]
    desired = json.loads(fn.inputs["code"]["assets"][f"ftfleet/lambdas/storage_drift/{DESIRED_FILE}"]["text"])
    urns = by_urn(rec)
    buckets = {b.urn: b.outputs["bucket"] for b in rec.of_type("aws:s3/bucket:Bucket")}
    ckpt = {urn: name for urn, name in buckets.items() if name in desired["buckets"]}
    assert len(ckpt) == 2

    def settings(type_token):
        return {ckpt[r.deps("bucket")[0]]: r.inputs for r in rec.of_type(type_token) if r.deps("bucket")[0] in ckpt}

    for name, sse in settings(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).items():
        assert desired["buckets"][name]["encryption"] == {"Rules": api_shape(sse["rules"])}
    for name, lifecycle in settings("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").items():
        assert desired["buckets"][name]["lifecycle"] == {"Rules": api_shape(lifecycle["rules"])}
    for name, policy in settings("aws:s3/bucketPolicy:BucketPolicy").items():
        assert desired["buckets"][name]["policy"] == json.loads(policy["policy"])
    for name, pab in settings("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").items():
        assert desired["buckets"][name]["public_access_block"] == api_shape(
            {k: v for k, v in pab.items() if k != "bucket"}
        )
    for name, versioning in settings("aws:s3/bucketVersioning:BucketVersioning").items():
        assert desired["buckets"][name]["versioning"] == api_shape(versioning["versioningConfiguration"])
    (replication,) = rec.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    primary = ckpt[replication.deps("bucket")[0]]
    assert desired["buckets"][primary]["replication"] == {
        "Role": replication.inputs["role"],
        "Rules": api_shape(replication.inputs["rules"]),
    }
    (dra,) = rec.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert desired["association"]["s3"] == api_shape(dra.inputs["s3"])
    assert desired["association"]["file_system_path"] == dra.inputs["fileSystemPath"]
    assert urns[dra.deps("fileSystemId")[0]].id == desired["association"]["file_system_id"]


@pytest.mark.integration
@pytest.mark.parametrize("folder", FOLDERS)
def test_each_package_runs_from_its_own_files(folder, tmp_path):
    """The archive alone (plus boto3, which Lambda's runtime brings) imports the handler."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for path, source in lambda_package.files(folder).items():
            z.write(source, path)
    zipfile.ZipFile(buffer).extractall(tmp_path)
    assert not list(tmp_path.rglob("__pycache__"))
    assert not (tmp_path / "ftfleet" / "infra").exists() and not (tmp_path / "ftfleet" / "trainer").exists()
    code = (
        "import sys, importlib, pathlib; sys.path.insert(0, sys.argv[1]);"
        f"m = importlib.import_module('{lambda_package.handler_path(folder).rsplit('.', 1)[0]}');"
        "import ftfleet; assert pathlib.Path(ftfleet.__file__).is_relative_to(sys.argv[1]), ftfleet.__file__;"
        "assert callable(m.handler); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "ok", out.stderr


def test_the_package_lists_every_module_of_the_function_and_common():
    files = lambda_package.files("lifecycle_handoff")
    assert "ftfleet/contract.py" in files and "ftfleet/lambdas/common/heartbeat.py" in files
    assert "ftfleet/lambdas/lifecycle_handoff/handler.py" in files
    assert not any("spot_interruption" in p for p in files)
    with pytest.raises(ValueError, match="no function folder"):
        lambda_package.files("nothing_here")


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_switching_a_function_off_removes_it_with_its_rules_and_alarms(variant, switch):
    folder = SWITCHES[switch]
    short = folder.replace("_", "-")
    full = variant()
    rec = variant(**{switch: False})
    assert set(functions(rec)) == set(FOLDERS) - {folder}
    names = {r.inputs.get("name") for r in rec.of_type(RULE)}
    assert not any(n.endswith(tuple(TRIGGERS[folder])) for n in names if n)
    assert not [r for r in rec.of_type(ALARM) if short in r.inputs["name"]]
    assert not [r for r in rec.of_type("aws:sqs/queue:Queue") if short in r.inputs["name"]]
    removed = {r.name for r in full.resources} - {r.name for r in rec.resources}
    assert removed and all("remediation" in n or "audit" in n for n in removed)


def test_function_specific_alarms_follow_their_function(variant):
    full = {r.inputs["name"].removeprefix("ftfleet-aws-dev-") for r in recording("aws-dev").of_type(ALARM)}
    assert {
        "replication-lag",
        "replication-latency",
        "replication-failures",
        "replacements-withheld",
        "handoff-deadline",
        "storage-drift",
    } <= full
    off = variant(remediationReplicationLag=False)
    assert not [r for r in off.of_type(ALARM) if "replication" in r.inputs["name"]]


def test_the_replication_alarms_watch_the_lag_and_rtc_metrics():
    rec = recording("aws-prod")
    alarms = {r.inputs["name"].removeprefix("ftfleet-aws-prod-"): r.inputs for r in rec.of_type(ALARM)}
    # S3 publishes ReplicationLatency in the destination's region, the failures in the source's.
    regions = {r.inputs["name"].removeprefix("ftfleet-aws-prod-"): rec.region_of(r) for r in rec.of_type(ALARM)}
    lag = alarms["replication-lag"]
    assert (lag["namespace"], lag["metricName"], lag["threshold"]) == (
        contract.METRICS_NAMESPACE,
        "ReplicationLagSeconds",
        900,
    )
    assert lag["treatMissingData"] == "breaching"  # a silent watcher is an alarm too
    (replication,) = rec.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    for name, metric in (
        ("replication-latency", "ReplicationLatency"),
        ("replication-failures", "OperationsFailedReplication"),
    ):
        assert alarms[name]["namespace"] == "AWS/S3" and alarms[name]["metricName"] == metric
        assert regions[name] == {"replication-latency": "us-west-2", "replication-failures": "us-east-1"}[name]
        assert alarms[name]["dimensions"] == {
            "SourceBucket": rec.outputs["primary_bucket"],
            "DestinationBucket": rec.outputs["replica_bucket"],
            "RuleId": replication.inputs["rules"][0]["id"],
        }


def test_cloud_trail_is_created_for_the_stack_or_left_to_the_account(variant):
    (trail,) = recording("aws-dev").of_type("aws:cloudtrail/trail:Trail")
    assert trail.inputs["isMultiRegionTrail"] and trail.inputs["includeGlobalServiceEvents"]
    assert trail.inputs["eventSelectors"] == [{"readWriteType": "WriteOnly", "includeManagementEvents": True}]
    assert not variant(cloudTrail="existing").of_type("aws:cloudtrail/trail:Trail")
    assert not variant(remediationStorageDrift=False).of_type("aws:cloudtrail/trail:Trail")


def test_the_replica_region_forwards_its_bucket_calls_to_the_primary_bus():
    rec = recording("aws-prod")
    (rule,) = [r for r in rec.of_type(RULE) if r.inputs["name"].endswith("bucket-calls-replica")]
    assert rec.region_of(rule) == "us-west-2"
    assert json.loads(rule.inputs["eventPattern"])["detail"]["requestParameters"]["bucketName"] == [
        rec.outputs["replica_bucket"]
    ]
    (target,) = [t for t in rec.of_type(TARGET) if rule.urn in t.deps("rule")]
    assert target.inputs["arn"] == "arn:aws:events:us-east-1:123456789012:event-bus/default"
    assert target.inputs["roleArn"] and target.inputs["deadLetterConfig"]["arn"]


def test_roles_reach_only_this_stack_s_groups_buckets_and_prefixes():
    rec = recording("aws-prod")
    policies = {
        r.name.removeprefix("ftfleet-aws-prod-remediation-").removesuffix("-policy"): json.loads(r.inputs["policy"])
        for r in rec.of_type("aws:iam/rolePolicy:RolePolicy")
        if "-remediation-" in r.name
    }
    groups = {g.outputs["name"] for g in rec.of_type("aws:autoscaling/group:Group")}
    primary = rec.outputs["primary_bucket"]
    for name, policy in policies.items():
        for st in policy["Statement"]:
            for resource in st["Resource"]:
                if resource == "*":
                    actions = set(st["Action"])
                    assert actions <= {
                        "ec2:DescribeInstances",
                        "autoscaling:DescribeAutoScalingGroups",
                        "autoscaling:DescribeScalingActivities",
                        "cloudwatch:GetMetricData",
                        "cloudwatch:ListMetrics",
                        "cloudwatch:PutMetricData",
                        "fsx:DescribeDataRepositoryAssociations",
                    }, (name, st["Sid"])
                    if "cloudwatch:PutMetricData" in actions:
                        assert st["Condition"]["StringEquals"]["cloudwatch:namespace"] == contract.METRICS_NAMESPACE
                elif ":autoscaling:" in resource:
                    assert resource.rsplit("/", 1)[1] in groups
                elif resource.startswith(f"arn:aws:s3:::{primary}/"):
                    assert resource.startswith(f"arn:aws:s3:::{primary}/checkpoints/llm-prod/"), (name, resource)
    lifecycle = {st["Sid"]: st for st in policies["lifecycle-handoff"]["Statement"]}
    assert lifecycle["ReadMarkers"]["Resource"] == [f"arn:aws:s3:::{primary}/checkpoints/llm-prod/markers/*"]
    # The sweep may delete only step directories of the run, in the primary bucket.
    deletes = {
        (name, resource)
        for name, policy in policies.items()
        for st in policy["Statement"]
        if "s3:DeleteObject" in st["Action"]
        for resource in st["Resource"]
    }
    assert deletes == {("retention-sweep", f"arn:aws:s3:::{primary}/checkpoints/llm-prod/{contract.STEP_DIR_PREFIX}*")}
    sweep = {st["Sid"]: st for st in policies["retention-sweep"]["Statement"]}
    assert sweep["ListPrimary"]["Condition"] == {"StringLike": {"s3:prefix": ["checkpoints/llm-prod/*"]}}
    assert not any(rec.outputs["replica_bucket"] in json.dumps(st) for st in sweep.values())


def test_the_dashboard_shows_progress_interruptions_handoffs_lag_and_checkpoint_age():
    (dash,) = recording("aws-prod").of_type("aws:cloudwatch/dashboard:Dashboard")
    text = dash.inputs["dashboardBody"]
    titles = [w["properties"]["title"] for w in json.loads(text)["widgets"]]
    for words in ("step rate per node", "per zone and type", "handoff", "Replication lag", "newest durable checkpoint"):
        assert any(words.lower() in t.lower() for t in titles), words
    assert contract.PROGRESS_METRIC.name in text and 'RunId=\\"llm-prod\\"' in text


def test_the_dashboard_reads_s3_replication_latency_in_the_replica_region():
    (dash,) = recording("aws-prod").of_type("aws:cloudwatch/dashboard:Dashboard")
    widgets = json.loads(dash.inputs["dashboardBody"])["widgets"]
    regions = {
        line[1]: w["properties"]["region"]
        for w in widgets
        for line in w["properties"]["metrics"]
        if isinstance(line[0], str) and line[0] == "AWS/S3"
    }
    assert regions == {"ReplicationLatency": "us-west-2"}
    assert {
        w["properties"]["region"]
        for w in widgets
        if not any(line[0] == "AWS/S3" for line in w["properties"]["metrics"] if isinstance(line[0], str))
    } == {"us-east-1"}


def test_schedules_follow_the_grace_period():
    assert remediation_patterns.rate(1) == "rate(1 minute)" and remediation_patterns.rate(5) == "rate(5 minutes)"
    assert remediation_patterns.sweep_minutes(600) == 2
    assert remediation_patterns.sweep_minutes(60) == 1 and remediation_patterns.sweep_minutes(86400) == 15


def test_plan_lists_each_function_with_its_triggers_dlq_and_timeout(capsys):
    from ftfleet.cli import main

    assert main(["plan", "aws-prod", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    listed = {f["function"]: f for f in plan["functions"]}
    assert set(listed) == set(FOLDERS)
    for folder, f in listed.items():
        assert f["timeout"] > 0 and f["dead_letter_queue"].endswith("-dlq")
        assert {t["rule"].removeprefix("ftfleet-aws-prod-") for t in f["triggers"]} == TRIGGERS[folder]
    ec2 = {
        json.loads(r["inputs"]["eventPattern"])["detail-type"][0]
        for r in plan["resources"]
        if r["type"] == RULE and r["inputs"].get("eventPattern")
    }
    assert {
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance-terminate Lifecycle Action",
    } <= ec2


HERE = Path(__file__)


@pytest.mark.integration
def test_the_pulumi_program_needs_no_boto3():
    """`pip install ftfleet[infra]` has no boto3: the program reads the functions' config
    modules, never their handlers."""
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None;"
        "import ftfleet.infra.aws.stack, ftfleet.infra.aws.remediation; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def documented_functions(page: str) -> set[str]:
    """The functions in the table of ``page``'s "Remediation functions" section."""
    text = (HERE.parent.parent.parent / "docs" / page).read_text()
    section = text.split("## Remediation functions", 1)[1]
    table = section.split("| function | trigger | what it does | what it never does |", 1)[1].split("\n\n", 1)[0]
    return {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}


def test_each_clouds_page_lists_every_function_folder_of_its_cloud():
    folders = {p.parent.name for p in (HERE.parent.parent.parent / "lambdas").glob("*/handler.py")}
    aws = {f for f in folders if not f.startswith("gcp_")}
    assert aws == set(FOLDERS)
    assert documented_functions("AWS.md") == aws
    assert documented_functions("GCP.md") == folders - aws
