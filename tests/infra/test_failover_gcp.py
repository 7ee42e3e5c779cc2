"""`ftfleet failover` between two GCP stacks, against the stand-in for Compute Engine's
REST API (drill/gcp_standin.py) and the Cloud Storage emulator (fake-gcs-server): both
sides read one dual-region bucket (checkpoints, lease and the move's record), as a GCP
home and its standby do. Every refusal leaves the groups and the bucket as they were."""

from __future__ import annotations

import json

import pytest

from drill.gcp_standin import Compute
from ftfleet.cli import main
from ftfleet.infra.failover import Failover, Refused, Stack, side
from ftfleet.lambdas.common import gcp, gcp_groups
from ftfleet.lambdas.common.gcp_fleet import record_key
from tests.gcs_emulator import gcs_client
from tests.infra.test_failover import RUN, lease_bytes, step_objects

PROJECT = "proj-test"
HOME_REGION, STANDBY_REGION = "us-central1", "us-east1"
ROOT = f"checkpoints/{RUN}"
LEASE_KEY = f"ftfleet-leases/{RUN}.json"


def outputs(name: str, region: str, bucket: str, standby_of: str = "", fs: str = "10.0.0.9@tcp:/lustrefs") -> dict:
    return {
        "region": region,
        "project": PROJECT,
        "run_id": RUN,
        "checkpoint_uri": f"gs://{bucket}/{ROOT}",
        "lease_uri": f"gs://{bucket}/{LEASE_KEY}",
        "coordinator_group": f"{name}-coordinator" if fs else "",
        "worker_group": f"{name}-workers" if fs else "",
        "worker_groups": [f"{name}-workers", f"{name}-workers-ondemand"] if fs else [],
        "file_system_mount": fs,
        **({"standby_of": standby_of} if standby_of else {}),
    }


def put_step(tmp_path, bucket: str, step: int, truncate: bool = False) -> None:
    b = gcs_client().bucket(bucket)
    for key, body in step_objects(tmp_path, step, truncate).items():
        b.blob(f"{ROOT}/{key}").upload_from_string(body)


def put_lease(bucket: str, holder: str, expires_in_s: float) -> None:
    gcs_client().bucket(bucket).blob(LEASE_KEY).upload_from_string(lease_bytes(holder, expires_in_s))


@pytest.fixture
def world(gcs_bucket, tmp_path, monkeypatch):
    """The home trains on 1 coordinator, 3 Spot and 1 on-demand worker, holding the lease;
    the standby (active: its file system, groups at 0) shares the bucket."""
    compute = Compute(PROJECT)
    monkeypatch.setenv("FTFLEET_COMPUTE_ENDPOINT", compute.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    gcp_groups.reset()
    gcp.reset()
    compute.group("home-coordinator", 1, ready=1, region=HOME_REGION)
    compute.group("home-workers", 3, ready=3, region=HOME_REGION)
    compute.group("home-workers-ondemand", 1, ready=1, region=HOME_REGION)
    compute.group("standby-coordinator", 1, ready=1, region=STANDBY_REGION)  # active: its VM runs
    compute.group("standby-workers", 0, region=STANDBY_REGION)
    compute.group("standby-workers-ondemand", 0, region=STANDBY_REGION)
    put_step(tmp_path, gcs_bucket, 12)
    put_lease(gcs_bucket, f"home/{HOME_REGION}", 60)
    home = Stack("home", outputs("home", HOME_REGION, gcs_bucket))
    standby = Stack("standby", outputs("standby", STANDBY_REGION, gcs_bucket, standby_of="home"))
    yield home, standby, compute
    compute.close()
    gcp_groups.reset()
    gcp.reset()


def targets(compute: Compute) -> dict[str, int]:
    return {name: g["target"] for name, g in compute.groups.items()}


def failover(source: Stack, target: Stack, said: list[str], compute: Compute | None = None, **kw) -> Failover:
    """Each wait of the command lets the stand-in's VMs finish leaving or booting."""
    sleep = (lambda s: compute.settle()) if compute else (lambda s: None)
    return Failover(source, target, say=said.append, sleep=sleep, poll_s=0.0, wait_s=5.0, **kw)


def test_the_job_moves_once_the_homes_instances_are_gone(world, gcs_bucket):
    home, standby, compute = world
    said: list[str] = []
    move = failover(home, standby, said).move
    assert move.advance() is False
    assert targets(compute) == {
        "home-coordinator": 0,
        "home-workers": 0,
        "home-workers-ondemand": 0,
        "standby-coordinator": 1,
        "standby-workers": 0,
        "standby-workers-ondemand": 0,
    }
    record = json.loads(gcs_client().bucket(gcs_bucket).blob(record_key(side(home))).download_as_bytes())
    assert record["to"] == "standby" and record["workers"] == "3,1"
    # Each VM runs its shutdown script (the emergency checkpoint) before it goes.
    assert move.advance() is False and said[-1] == "waiting: 5 instance(s) of home still leaving"
    compute.settle()
    assert move.advance() is True
    assert targets(compute) | {} == {
        "home-coordinator": 0,
        "home-workers": 0,
        "home-workers-ondemand": 0,
        "standby-coordinator": 1,
        "standby-workers": 3,
        "standby-workers-ondemand": 1,
    }
    assert "  us-east1 standby-workers: target size 3" in said
    # A coordinator VM is deleted by name, never resized: a resize up would make one
    # without its per-instance config's name and address.
    calls = {(method, path) for method, path in compute.calls if "coordinator" in path}
    assert ("POST", "home-coordinator/deleteInstances") in calls
    assert not {c for c in calls if c[1].endswith("/resize")}
    assert "  us-east1 standby-coordinator: target size 1, its per-instance config's VM (never resized up)" in said
    assert (
        said[-1]
        == "started standby: 1 coordinator + 4 workers; it resumes from step-12 once home's run lease has run out"
    )
    assert not gcs_client().bucket(gcs_bucket).blob(record_key(side(home))).exists()


def test_the_command_finishes_a_move_a_function_began_and_a_failback_is_the_same_command(world):
    home, standby, compute = world
    failover(home, standby, []).move.advance()  # what a standby's capacity watch did
    compute.settle()
    said: list[str] = []
    assert failover(home, standby, said).run() == 0
    assert said[-1] == "standby takes the lease when home's runs out"
    compute.settle()
    back: list[str] = []
    # The standby's nodes hold the lease now; moving back checks it as the move out did.
    put_lease(home["checkpoint_uri"].split("/")[2], f"standby/{STANDBY_REGION}", 60)
    with pytest.raises(Refused, match=r"home's coordinator VM is not there .* then `pulumi up --refresh -s home`"):
        failover(standby, home, back, compute).run()
    compute.group("home-coordinator", 1, ready=1, region=HOME_REGION)  # what `pulumi up --refresh -s home` does
    assert failover(standby, home, back, compute, workers=2).run() == 0
    assert targets(compute)["home-workers"] == 2 and targets(compute)["standby-workers"] == 0


def unchanged(compute: Compute, bucket: str, home: Stack) -> bool:
    return (
        targets(compute)["home-workers"] == 3
        and targets(compute)["standby-workers"] == 0
        and not gcs_client().bucket(bucket).blob(record_key(side(home))).exists()
    )


@pytest.mark.parametrize(
    ("holder", "says"),
    [
        (f"standby/{STANDBY_REGION}", "standby holds the run lease already"),
        ("third/europe-west4", "the run lease is held by third/europe-west4, neither home nor standby"),
    ],
)
def test_a_lease_the_move_must_not_take_is_refused_and_nothing_changes(world, gcs_bucket, holder, says):
    home, standby, compute = world
    put_lease(gcs_bucket, holder, 60)
    with pytest.raises(Refused, match=says):
        failover(home, standby, []).run()
    assert unchanged(compute, gcs_bucket, home)


def test_no_verified_checkpoint_is_refused_and_nothing_changes(world, gcs_bucket, tmp_path):
    home, standby, compute = world
    for blob in gcs_client().bucket(gcs_bucket).list_blobs(prefix=f"{ROOT}/"):
        blob.delete()
    put_step(tmp_path, gcs_bucket, 20, truncate=True)
    with pytest.raises(Refused, match=f"gs://{gcs_bucket}/{ROOT} holds no checkpoint that verifies"):
        failover(home, standby, []).run()
    assert unchanged(compute, gcs_bucket, home)


def test_a_standby_without_its_file_system_is_refused_before_anything_is_read(world, gcs_bucket, tmp_path, capsys):
    home, standby, compute = world
    (tmp_path / "home.json").write_text(json.dumps(home.outputs))
    (tmp_path / "standby.json").write_text(json.dumps(outputs("standby", STANDBY_REGION, gcs_bucket, "home", fs="")))
    assert main(["failover", "home", "--to", "standby", "--outputs", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: standby has no file system yet: `pulumi config set ftfleet:standbyActive true -s standby` "
        "and `pulumi up -s standby` first"
    )
    assert compute.calls == [] and unchanged(compute, gcs_bucket, home)


def test_a_record_that_does_not_read_is_named_and_nothing_changes(world, gcs_bucket):
    home, standby, compute = world
    gcs_client().bucket(gcs_bucket).blob(record_key(side(home))).upload_from_string(b"{not json")
    with pytest.raises(Refused, match=r"failover-from-home.json is not a move's record: look at it, delete it"):
        failover(home, standby, []).run()
    assert targets(compute)["home-workers"] == 3


def test_a_list_longer_than_the_pages_read_is_one_line_naming_the_rerun(world, monkeypatch):
    from ftfleet.errors import UserError

    home, standby, compute = world
    monkeypatch.setattr(gcp_groups, "PAGES", 0)  # every list of managed instances runs past it
    with pytest.raises(UserError, match=r"^TooLong: .*more than 0 pages of 500; .*run the same command again$"):
        failover(home, standby, [], compute).run()


def test_a_group_the_standby_lacks_is_refused_naming_the_pulumi_up(world, gcs_bucket):
    home, standby, compute = world
    del compute.groups["standby-workers-ondemand"]
    with pytest.raises(Refused, match=r"standby's group standby-workers-ondemand is not in proj-test/us-east1: run"):
        failover(home, standby, []).run()
    assert unchanged(compute, gcs_bucket, home)


def test_the_command_line_moves_a_gcp_run_and_a_dry_run_changes_nothing(world, gcs_bucket, tmp_path, capsys):
    home, standby, compute = world
    for stack in (home, standby):
        (tmp_path / f"{stack.name}.json").write_text(json.dumps(stack.outputs))
    assert main(["failover", "home", "--to", "standby", "--outputs", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "checked: standby has its file system\n" in out
    assert "would stop home's groups and start standby's with 1 coordinator + 4 workers" in out
    assert unchanged(compute, gcs_bucket, home)
