"""`ftfleet failover` against moto: two regions' groups, buckets, registry and the run
lease; every refusal leaves everything as it was. Moto does not replicate between
buckets: the tests copy the objects where S3 replication would."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from moto import mock_aws

from ftfleet.cli import main
from ftfleet.errors import UserError
from ftfleet.infra.failover import Failover, Refused, Stack
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.common.move import LeaseRef, Move, Side
from ftfleet.trainer.checkpoint.manifest import Manifest, checksum_file, object_key, write_manifest

HOME_REGION, STANDBY_REGION = "us-east-1", "us-west-2"
RUN = "llm"
PRIMARY, REPLICA = "home-primary", "home-replica"
IMAGE_REPO, TAG = "ftfleet-home/trainer", "0.1.0"
LEASE_KEY = f"ftfleet-leases/{RUN}.json"


def outputs(name: str, region: str, bucket: str, standby_of: str = "", fsx: str = "fs.example") -> dict:
    return {
        "region": region,
        "run_id": RUN,
        "checkpoint_uri": f"s3://{bucket}/checkpoints/{RUN}",
        "lease_uri": f"s3://{PRIMARY}/{LEASE_KEY}",
        "coordinator_group": f"{name}-coordinator",
        "worker_group": f"{name}-workers",
        "trainer_image": f"123456789012.dkr.ecr.{region}.amazonaws.com/{IMAGE_REPO}:{TAG}",
        "fsx_dns_name": fsx,
        **({"standby_of": standby_of} if standby_of else {}),
    }


def group(region: str, name: str, size: int, max_size: int) -> None:
    ec2, asg = boto3.client("ec2", region_name=region), boto3.client("autoscaling", region_name=region)
    ec2.create_launch_template(LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b"})
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
        MinSize=min(size, 1),
        MaxSize=max_size,
        DesiredCapacity=size,
        AvailabilityZones=[f"{region}a"],
    )


def sizes(region: str, name: str) -> tuple[int, int, int]:
    g = boto3.client("autoscaling", region_name=region).describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    g = g["AutoScalingGroups"][0]
    return g["MinSize"], g["DesiredCapacity"], len(g["Instances"])


def step_objects(tmp_path, step: int, truncate: bool = False) -> dict[str, bytes]:
    """A one-file checkpoint of ``step``: key under the run's root -> bytes (the data file
    one byte short with ``truncate``: its manifest then does not verify)."""
    d = tmp_path / f"step-{step}-{'cut' if truncate else 'whole'}"
    d.mkdir(exist_ok=True)
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * step)
    m = Manifest(
        step=step,
        run_id=RUN,
        config_hash="c",
        world_size=1,
        files={"__0_0.distcp": checksum_file(d / "__0_0.distcp")},
        torch_version="t",
    )
    write_manifest(d, m)
    body = (d / "__0_0.distcp").read_bytes()
    return {
        object_key(step, "__0_0.distcp"): body[:-1] if truncate else body,
        f"step-{step}/manifest.json": (d / "manifest.json").read_bytes(),
    }


def lease_bytes(holder: str, expires_in_s: float) -> bytes:
    """The run lease as a holder writes it, current for ``expires_in_s`` more seconds."""
    doc = {
        "format": "ftfleet-lease/1",
        "run_id": RUN,
        "holder": holder,
        "job": "store 10.0.0.1:29400",
        "epoch": 3,
        "expires_at": time.time() + expires_in_s,
        "ttl_s": 120,
    }
    return json.dumps(doc).encode()


def put_step(tmp_path, bucket: str, region: str, step: int, truncate: bool = False) -> None:
    s3 = boto3.client("s3", region_name=region)
    for key, body in step_objects(tmp_path, step, truncate).items():
        s3.put_object(Bucket=bucket, Key=f"checkpoints/{RUN}/{key}", Body=body)


def replicate() -> None:
    """What S3 replication does between the home's buckets."""
    src, dst = boto3.client("s3", region_name=HOME_REGION), boto3.client("s3", region_name=STANDBY_REGION)
    for o in src.list_objects_v2(Bucket=PRIMARY, Prefix="checkpoints/").get("Contents", []):
        body = src.get_object(Bucket=PRIMARY, Key=o["Key"])["Body"].read()
        dst.put_object(Bucket=REPLICA, Key=o["Key"], Body=body)


def put_lease(holder: str, expires_in_s: float) -> None:
    s3 = boto3.client("s3", region_name=HOME_REGION)
    s3.put_object(Bucket=PRIMARY, Key=LEASE_KEY, Body=lease_bytes(holder, expires_in_s))


def two_regions(tmp_path) -> None:
    """In moto: the home's buckets (step-12 committed, step-10 replicated), its lease
    held, its groups training on 3 workers; the standby's groups at 0."""
    boto3.client("s3", region_name=HOME_REGION).create_bucket(Bucket=PRIMARY)
    boto3.client("s3", region_name=STANDBY_REGION).create_bucket(
        Bucket=REPLICA, CreateBucketConfiguration={"LocationConstraint": STANDBY_REGION}
    )
    put_step(tmp_path, PRIMARY, HOME_REGION, 10)
    replicate()
    put_step(tmp_path, PRIMARY, HOME_REGION, 12)
    put_lease("home/us-east-1", 60)
    group(HOME_REGION, "home-coordinator", 1, 1)
    group(HOME_REGION, "home-workers", 3, 8)
    group(STANDBY_REGION, "standby-coordinator", 0, 1)
    group(STANDBY_REGION, "standby-workers", 0, 8)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """The home (3 workers training, step-12 committed, step-10 replicated so far) and its
    standby (groups at 0, the image pushed)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", HOME_REGION)
    aws.reset()
    with mock_aws():
        two_regions(tmp_path)
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
        for region in (HOME_REGION, STANDBY_REGION):  # pushed at home, replicated to the standby
            ecr = boto3.client("ecr", region_name=region)
            ecr.create_repository(repositoryName=IMAGE_REPO)
            ecr.put_image(repositoryName=IMAGE_REPO, imageManifest=json.dumps(manifest), imageTag=TAG)
        home = Stack("home", outputs("home", HOME_REGION, PRIMARY))
        standby = Stack("standby", outputs("standby", STANDBY_REGION, REPLICA, standby_of="home"))
        yield home, standby


def failover(home: Stack, standby: Stack, said: list[str], **kw) -> Failover:
    ticks = iter(range(10_000))
    kw.setdefault("sleep", lambda _s: None)
    return Failover(home, standby, say=said.append, clock=lambda: float(next(ticks)), poll_s=1, wait_s=30, **kw)


def unchanged() -> bool:
    return (
        sizes(HOME_REGION, "home-workers")[:2] == (1, 3)
        and sizes(STANDBY_REGION, "standby-workers")[:2] == (0, 0)
        and sizes(STANDBY_REGION, "standby-coordinator")[:2] == (0, 0)
    )


def test_the_job_moves_once_the_standby_holds_the_homes_newest_step(world):
    home, standby = world
    said: list[str] = []
    # Replication carries step-12 while the command waits.
    sleeps = iter(range(100))
    assert failover(home, standby, said, sleep=lambda _s: next(sleeps) and replicate()).run() == 0
    assert sizes(HOME_REGION, "home-coordinator") == (0, 0, 0)
    assert sizes(HOME_REGION, "home-workers") == (0, 0, 0)
    assert sizes(STANDBY_REGION, "standby-coordinator")[:2] == (1, 1)
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (3, 3)  # the home's size
    text = "\n".join(said)
    assert "step-10 verified" in text and "holds step-10, home's newest is step-12" in text
    assert "resumes from step-12" in text
    # The lease is left to run out: the standby's nodes take it then.
    lease = lease_doc()
    assert lease["holder"] == "home/us-east-1" and lease["expires_at"] > 0 and lease["epoch"] == 3


def lease_doc() -> dict:
    return json.loads(
        boto3.client("s3", region_name=HOME_REGION).get_object(Bucket=PRIMARY, Key=LEASE_KEY)["Body"].read()
    )


def test_a_move_a_function_began_is_finished_by_the_command(world):
    home, standby = world
    lease = LeaseRef.parse(home["lease_uri"], HOME_REGION, RUN)
    began: list[str] = []
    source = Side("home", HOME_REGION, "home-coordinator", "home-workers", PRIMARY, f"checkpoints/{RUN}")
    target = Side("standby", STANDBY_REGION, "standby-coordinator", "standby-workers", REPLICA, f"checkpoints/{RUN}")
    move = Move(source, target, lease, say=began.append)
    assert move.advance() is False and "stopping home" in began[-1]
    assert move.fleet.record(source)["to"] == "standby" and sizes(HOME_REGION, "home-workers")[:2] == (0, 0)
    replicate()
    said: list[str] = []
    assert failover(home, standby, said).run() == 0
    # It went on from the move's state: the move's own checks were its first step.
    assert not any(line.startswith("checked: s3://") for line in said) and "resumes from step-12" in said[-2]
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (3, 3) and move.fleet.record(source) == {}


def test_a_move_elsewhere_is_refused_while_one_is_under_way(world):
    home, standby = world
    lease = LeaseRef.parse(home["lease_uri"], HOME_REGION, RUN)
    source = Side("home", HOME_REGION, "home-coordinator", "home-workers", PRIMARY, f"checkpoints/{RUN}")
    target = Side("standby", STANDBY_REGION, "standby-coordinator", "standby-workers", REPLICA, f"checkpoints/{RUN}")
    Move(source, target, lease, say=lambda _l: None).advance()
    third = Side("third", "eu-west-1", "third-coordinator", "third-workers", "third", f"checkpoints/{RUN}")
    with pytest.raises(Refused, match="home is being moved to standby, not third: finish that move first"):
        Move(source, third, lease).advance()


def _sides() -> tuple[Side, Side]:
    source = Side("home", HOME_REGION, "home-coordinator", "home-workers", PRIMARY, f"checkpoints/{RUN}")
    target = Side("standby", STANDBY_REGION, "standby-coordinator", "standby-workers", REPLICA, f"checkpoints/{RUN}")
    return source, target


def test_a_concurrent_movers_record_is_kept(world):
    """Tags take no precondition; the record is read just before it is written, so a
    second mover beginning after the first wrote keeps the first's record (its --workers)."""
    from ftfleet.lambdas.common.aws_fleet import AwsFleet
    from ftfleet.lambdas.common.move import Record

    source, _ = _sides()
    fleet = AwsFleet()
    fleet.write_record(source, Record("standby", (5,), 100.0))
    fleet.write_record(source, Record("standby", (3,), 200.0))
    assert fleet.record(source) == {"to": "standby", "workers": "5", "since": "100"}


def test_a_group_gone_after_the_source_stopped_is_stuck_not_refused(world):
    """After the record is written and the source told to stop, a refusal's "nothing
    changed" would be false: the move is stuck, and says so."""
    from ftfleet.lambdas.common.move import Stuck, drive, outcome
    from ftfleet.lambdas.common.pair import Pair

    home, _ = world
    lease = LeaseRef.parse(home["lease_uri"], HOME_REGION, RUN)
    source, target = _sides()
    Move(source, target, lease, say=lambda _l: None).advance()
    # The home stack torn down while its nodes leave: the next step cannot read its groups.
    boto3.client("autoscaling", region_name=HOME_REGION).delete_auto_scaling_group(
        AutoScalingGroupName="home-coordinator", ForceDelete=True
    )
    with pytest.raises(Stuck, match="home's move to standby is under way and stuck: home's group home-coordinator"):
        Move(source, target, lease, say=lambda _l: None).advance()
    pair = Pair(source, target, lease)
    moved = drive(pair, 600.0, time.time(), lambda _side: 0.0)
    assert "under way and stuck" in moved["stuck"] and not moved.get("refused")
    assert outcome(moved, "ok", "INFO") == ("failover-stuck", "ERROR")


def test_a_failback_is_the_same_command_with_the_names_swapped(world):
    home, standby = world
    failover(home, standby, [], sleep=lambda _s: replicate()).run()
    put_lease("standby/us-west-2", -30)  # the standby's trainer held it; it ran out
    said: list[str] = []
    # The home's bucket gets what the standby wrote back (here: it already has it).
    assert failover(standby, home, said).run() == 0
    assert sizes(HOME_REGION, "home-workers")[:2] == (3, 3)
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (0, 0)


def test_a_dry_run_checks_and_changes_nothing(world):
    home, standby = world
    said: list[str] = []
    assert failover(home, standby, said).run(dry_run=True) == 0
    assert unchanged() and "step-10 verifies" in said[-1] and "would stop home's groups" in said[-1]


@pytest.mark.parametrize(
    ("arrange", "says"),
    [
        (lambda h, s: (h, Stack("other", {**s.outputs, "standby_of": "elsewhere"})), "is not home's standby"),
        (lambda h, s: (h, Stack("standby", {**s.outputs, "fsx_dns_name": ""})), "standbyActive true"),
        (lambda h, s: (h, Stack("standby", {**s.outputs, "run_id": "other"})), "different runs"),
        (
            lambda h, s: (h, Stack("standby", {**s.outputs, "trainer_image": s["trainer_image"][:-1] + "9"})),
            "push it there",
        ),
    ],
    ids=["not-its-standby", "no-file-system", "another-run", "no-image"],
)
def test_a_move_that_is_not_safe_is_refused_in_one_line_and_changes_nothing(world, arrange, says):
    home, standby = arrange(*world)
    with pytest.raises(Refused, match=says) as caught:
        failover(home, standby, []).run()
    assert "\n" not in str(caught.value) and unchanged()


def test_no_verified_checkpoint_in_the_standby_is_refused(world, tmp_path):
    home, standby = world
    s3 = boto3.client("s3", region_name=STANDBY_REGION)
    for o in s3.list_objects_v2(Bucket=REPLICA)["Contents"]:
        s3.delete_object(Bucket=REPLICA, Key=o["Key"])
    put_step(tmp_path, REPLICA, STANDBY_REGION, 14, truncate=True)  # a file shorter than its manifest says
    with pytest.raises(Refused, match="holds no checkpoint that verifies"):
        failover(home, standby, []).run()
    assert unchanged()


@pytest.mark.parametrize(
    ("holder", "says"),
    [("third/eu-west-1", "held by third/eu-west-1"), ("standby/us-west-2", "holds the run lease already")],
)
def test_a_lease_the_move_must_not_take_is_refused(world, holder, says):
    put_lease(holder, 60)
    with pytest.raises(Refused, match=says):
        failover(*world, []).run()
    assert unchanged()


def test_more_workers_than_the_standby_group_takes_is_refused(world):
    with pytest.raises(Refused, match="takes at most 8 nodes, not 9"):
        failover(*world, [], workers=9).run()
    assert unchanged()


def test_replication_that_never_catches_up_stops_the_move_before_the_standby_starts(world):
    home, standby = world
    with pytest.raises(UserError, match="waited 30 s; the steps printed above were done") as caught:
        failover(home, standby, []).run()
    assert not isinstance(caught.value, Refused)
    assert sizes(HOME_REGION, "home-workers")[:2] == (0, 0)  # stopped, as the steps said
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (0, 0)  # never started
    # Replication catches up; the same command again finishes the move, at the job's
    # size the first run recorded on the (now empty) group.
    replicate()
    assert failover(home, standby, []).run() == 0
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (3, 3)


def test_the_command_line_reads_stack_outputs_and_refuses_a_stack_not_deployed_with_them(world, tmp_path, capsys):
    home, standby = world
    (tmp_path / "home.json").write_text(json.dumps(home.outputs))
    (tmp_path / "standby.json").write_text(json.dumps({k: v for k, v in standby.outputs.items() if k != "lease_uri"}))
    assert main(["failover", "home", "--to", "standby", "--outputs", str(tmp_path), "--dry-run"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err == "error: standby is not deployed with this version of ftfleet (no lease_uri): run `pulumi up -s standby`"
    )
    (tmp_path / "standby.json").write_text(json.dumps(standby.outputs))
    assert main(["failover", "home", "--to", "standby", "--outputs", str(tmp_path), "--dry-run"]) == 0
    assert "checked: standby has its file system and the image" in capsys.readouterr().out
