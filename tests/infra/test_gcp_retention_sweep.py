"""The GCP retention sweep as the program declares it (infra/gcp/functions.py,
infra/gcp/alerts.py), its two keys (infra/gcp/settings.py, infra/gcp/keys.py) and its
source archive (infra/gcp/function_package.py)."""

from __future__ import annotations

import ast

import pytest

from ftfleet import retention
from ftfleet.cli import main
from ftfleet.infra import stackfile
from ftfleet.infra.gcp import alerts, boot, function_package, functions, keys
from ftfleet.lambdas.gcp_replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.gcp_retention_sweep import config as sweep_config
from ftfleet.lambdas.gcp_retention_sweep.config import Config as SweepConfig
from tests.infra.conftest import recording
from tests.infra.test_gcp_config import bad_stack

SWEEP = "gcp_retention_sweep"
FUNCTION = "gcp:cloudfunctionsv2/function:Function"
JOB = "gcp:cloudscheduler/job:Job"
ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
ALERT = "gcp:monitoring/alertPolicy:AlertPolicy"


def sweep_function(rec):
    return next((f for f in rec.of_type(FUNCTION) if f.inputs["description"].split()[1] == SWEEP), None)


def sweep_config_of(rec) -> SweepConfig:
    """What the function's cold start reads."""
    return SweepConfig.from_env(sweep_function(rec).inputs["serviceConfig"]["environmentVariables"])


def account_grants(rec, fn) -> set[tuple[str, str]]:
    member = f"serviceAccount:{fn.inputs['serviceConfig']['serviceAccountEmail']}"
    return {(r.type, r.inputs["role"]) for r in rec.resources if r.inputs.get("member") == member}


def sweep_parts(rec) -> dict[str, list]:
    """The sweep's function, schedule, custom role and grants, as declared."""
    fn = sweep_function(rec)
    return {
        "function": [fn] if fn else [],
        "schedule": [j for j in rec.of_type(JOB) if j.name.endswith("-sweep")],
        "role": [r for r in rec.of_type(ROLE) if r.name.endswith("-sweep-role")],
        "grants": [r for r in rec.resources if r.name.endswith(("-sweep-sweep", "-sweep-metrics"))],
        "alerts": [a for a in rec.of_type(ALERT) if a.name.endswith(("-retention-failures", "-sweep-silent"))],
    }


def test_the_sweep_is_on_by_default_with_its_schedule_its_account_and_only_its_grants():
    rec = recording("gcp-dev")
    parts = sweep_parts(rec)
    assert {k: len(v) for k, v in parts.items()} == {"function": 1, "schedule": 1, "role": 1, "grants": 2, "alerts": 2}
    (fn,), (job,), (role,) = parts["function"], parts["schedule"], parts["role"]
    bucket = next(b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-ckpt-bucket"))
    assert account_grants(rec, fn) == {
        ("gcp:storage/bucketIAMMember:BucketIAMMember", role.outputs["name"]),
        ("gcp:projects/iAMMember:IAMMember", "roles/monitoring.metricWriter"),
    }
    (binding,) = [g for g in parts["grants"] if g.type == "gcp:storage/bucketIAMMember:BucketIAMMember"]
    assert binding.inputs["bucket"] == bucket.outputs["name"]
    # List, read and delete objects: no write, no bucket or IAM permission.
    assert (
        sorted(role.inputs["permissions"])
        == sorted(functions.SWEEP_PERMISSIONS)
        == [
            "storage.objects.delete",
            "storage.objects.get",
            "storage.objects.list",
        ]
    )
    assert job.inputs["schedule"] == functions.RETENTION_SCHEDULE == "0 * * * *"
    assert job.inputs["timeZone"] == "Etc/UTC"
    (push,) = [s for s in rec.of_type("gcp:pubsub/subscription:Subscription") if fn.urn in s.deps("pushConfig")]
    assert job.inputs["pubsubTarget"]["topicName"] == push.inputs["topic"]


def test_switched_off_the_sweep_takes_its_function_schedule_account_grants_and_alerts(gcp_variant):
    rec = gcp_variant(remediationRetentionSweep=False)
    assert {k: len(v) for k, v in sweep_parts(rec).items()} == dict.fromkeys(sweep_parts(rec), 0)
    assert not [a for a in rec.of_type("gcp:serviceaccount/account:Account") if a.name.endswith("-sweep-sa")]
    assert not {m.type for m in sweep_config.METRICS} & {
        d.inputs["type"] for d in rec.of_type("gcp:monitoring/metricDescriptor:MetricDescriptor")
    }
    assert sweep_function(rec) is None and len(list(rec.of_type(FUNCTION))) == 4


def test_with_only_the_sweep_on_the_functions_source_and_the_sweep_are_declared(gcp_variant):
    rec = gcp_variant(
        remediationSpotInterruption=False,
        remediationStorageDrift=False,
        remediationReplicationLag=False,
        remediationCapacityWatch=False,
    )
    assert [f.inputs["description"].split()[1] for f in rec.of_type(FUNCTION)] == [SWEEP]
    assert [b for b in rec.of_type("gcp:storage/bucket:Bucket") if b.name.endswith("-source-bucket")]


def test_the_sweep_reads_the_watchs_root_of_the_stacks_bucket_with_the_default_schedule():
    rec = recording("gcp-prod")
    cfg = sweep_config_of(rec)
    watch = WatchConfig.from_env(
        next(f for f in rec.of_type(FUNCTION) if "gcp_replication_watch" in f.inputs["description"]).inputs[
            "serviceConfig"
        ]["environmentVariables"]
    )
    assert (cfg.bucket, cfg.root) == (watch.bucket, watch.root)
    assert cfg.root == boot.checkpoint_root(stackfile.load("gcp-prod").settings())
    assert cfg.rules == retention.DEFAULT_SCHEDULE and cfg.stack == "gcp-prod"


def test_the_sweeps_deadline_is_its_timeout_and_pubsub_waits_for_it():
    rec = recording("gcp-prod")
    fn = sweep_function(rec)
    timeout = fn.inputs["serviceConfig"]["timeoutSeconds"]
    assert sweep_config_of(rec).timeout_s == timeout == functions.SWEEP_TIMEOUT_S
    (push,) = [s for s in rec.of_type("gcp:pubsub/subscription:Subscription") if fn.urn in s.deps("pushConfig")]
    assert timeout <= push.inputs["ackDeadlineSeconds"] <= 600  # no redelivery while it still runs


def test_checkpoint_retention_travels_to_the_function(gcp_variant):
    rec = gcp_variant(checkpointRetention=["all for 12h", "1d for 30d"])
    assert sweep_config_of(rec).rules == ("all for 12h", "1d for 30d")


@pytest.mark.parametrize(
    "value, expected",
    [
        (["all for 6h", "daily for 7d"], "ftfleet:checkpointRetention[1]: 'daily for 7d' is not a rule; use '"),
        (["all for 0h"], "ftfleet:checkpointRetention[0]: 'all for 0h' has a zero duration"),
        ("all for 6h", "ftfleet:checkpointRetention must be a list of strings"),
    ],
)
def test_a_bad_retention_rule_exits_2_with_one_line_naming_it(tmp_path, capsys, value, expected):
    assert main(["plan", bad_stack(tmp_path, {"ftfleet:checkpointRetention": value})]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert expected in captured.err and captured.out == ""


def test_both_keys_are_shared_with_aws_and_read_on_gcp():
    assert {"remediationRetentionSweep", "checkpointRetention"} <= keys.SHARED
    keys.refuse_on_gcp({"remediationRetentionSweep", "checkpointRetention"})  # no refusal
    s = stackfile.load("gcp-dev").settings()
    assert s.remediation.retention_sweep is True and s.remediation.checkpoint_retention == retention.DEFAULT_SCHEDULE


def test_the_failure_alert_fires_on_one_failed_step_and_the_silence_alert_after_missed_runs():
    policies = {a.name.rsplit("-alerts-", 1)[1]: a for a in recording("gcp-dev").of_type(ALERT)}
    (failed,) = policies["retention-failures"].inputs["conditions"]
    threshold = failed["conditionThreshold"]
    assert threshold["filter"] == (
        f'metric.type="{sweep_config.FAILURES.type}" AND resource.type="global" AND metric.label.stack="gcp-dev"'
    )
    assert (threshold["comparison"], threshold["thresholdValue"]) == ("COMPARISON_GT", 0)
    (silent,) = policies["sweep-silent"].inputs["conditions"]
    absent = silent["conditionAbsent"]
    assert sweep_config.HEARTBEAT.type in absent["filter"]
    assert int(absent["duration"].rstrip("s")) >= 2 * 3600 and alerts.SWEEP_SILENT_AFTER == absent["duration"]


def ftfleet_imports(source: bytes) -> list[tuple[str, list[str]]]:
    """``from ftfleet... import names`` of a file, at import or inside a function; not
    under ``if __name__ == "__main__":``, which an imported module never runs."""
    found = []
    todo = list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ftfleet"):
            found.append((node.module, [a.name for a in node.names]))
        todo.extend(ast.iter_child_nodes(node))
    return found


def unresolved(files: dict[str, bytes], module: str, names: list[str]) -> list[str]:
    """What of ``from module import names`` the archive cannot give: the module, or a
    name of a package that is neither a module in it nor named in its __init__."""

    def exists(dotted: str) -> bool:
        path = dotted.replace(".", "/")
        return f"{path}.py" in files or f"{path}/__init__.py" in files

    if not exists(module):
        return [module]
    init = files.get(f"{module.replace('.', '/')}/__init__.py")
    if init is None:
        return []
    return [f"{module}.{n}" for n in names if not exists(f"{module}.{n}") and n not in init.decode()]


def test_the_source_archive_holds_retention_and_every_ftfleet_module_the_sweep_imports():
    files = function_package.contents(SWEEP)
    assert "ftfleet/retention.py" in files
    assert f"from ftfleet.lambdas.{SWEEP}.handler import handler" in files["main.py"].decode()
    missing = {
        (path, gone)
        for path, data in files.items()
        if path.endswith(".py")
        for module, names in ftfleet_imports(data)
        for gone in unresolved(files, module, names)
    }
    assert not missing, "add the module to infra/aws/lambda_package.py CORE_MODULES"
