"""A run moved to its standby region by `ftfleet failover`, end to end on one machine:
the real trainer in the home region (S3 on moto, the run lease in the home's primary
bucket), S3 replication played by a copy, the failover against moto's Auto Scaling and
ECR, then the real trainer as the standby's node: fenced while the home holds the run
lease, it takes the lease once that has run out, restores the newest replicated
checkpoint and ends where an uninterrupted run ends.

Long (the lease's shortest TTL is about a minute): ``make chaos``."""

from __future__ import annotations

import json
import time

import boto3
import pytest

from ftfleet.contract import EXIT_FENCED
from ftfleet.infra.failover import Failover, Stack
from ftfleet.lambdas.common import aws
from tests.trainer.conftest import run_trainer

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

HOME_REGION, STANDBY_REGION = "us-east-1", "us-west-2"
PRIMARY, REPLICA = "failover-home-primary", "failover-home-replica"
ROOT = "checkpoints/run"
LEASE = "ftfleet-leases/run.json"
TTL_S = 70  # the shortest the lease's margins allow (lease.py)
TAG = "0.1.0"


def clients(moto_url: str, region: str) -> dict:
    return {s: boto3.client(s, endpoint_url=moto_url, region_name=region) for s in ("s3", "ec2", "autoscaling", "ecr")}


def group(c: dict, name: str, size: int) -> None:
    c["ec2"].create_launch_template(LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b"})
    c["autoscaling"].create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
        MinSize=size,
        MaxSize=4,
        DesiredCapacity=size,
        AvailabilityZones=[f"{c['ec2'].meta.region_name}a"],
    )


def replicate(home: dict, standby: dict) -> None:
    """S3 replication of the checkpoints (not the lease: it stays where both contend)."""
    for o in home["s3"].list_objects_v2(Bucket=PRIMARY, Prefix=f"{ROOT}/").get("Contents", []):
        body = home["s3"].get_object(Bucket=PRIMARY, Key=o["Key"])["Body"].read()
        standby["s3"].put_object(Bucket=REPLICA, Key=o["Key"], Body=body)


def stack(name: str, region: str, bucket: str, standby_of: str = "") -> Stack:
    return Stack(
        name,
        {
            "region": region,
            "run_id": "t",  # the test trainer's run (tests/trainer/conftest.py)
            "checkpoint_uri": f"s3://{bucket}/{ROOT}",
            "lease_uri": f"s3://{PRIMARY}/{LEASE}",
            "coordinator_group": f"{name}-coordinator",
            "worker_group": f"{name}-workers",
            "trainer_image": f"123456789012.dkr.ecr.{region}.amazonaws.com/trainer:{TAG}",
            "fsx_dns_name": "fs.example",
            **({"standby_of": standby_of} if standby_of else {}),
        },
    )


def node(run_dir, moto_url: str, primary: str, replica: str, holder: str, *extra: str, expect_rc: int | None = 0):
    return run_trainer(
        1,
        run_dir,
        f"checkpoint.uri=s3://{primary}/{ROOT}",
        f"checkpoint.replica_uri=s3://{replica}/{ROOT}",
        f"checkpoint.s3_endpoint_url={moto_url}",
        f"checkpoint.lease_uri=s3://{PRIMARY}/{LEASE}",
        f"checkpoint.lease_holder={holder}",
        f"checkpoint.lease_ttl_s={TTL_S}",
        "resilience.interval.fixed_steps=2",
        "checkpoint.keep=100",
        *extra,
        expect_rc=expect_rc,
        timeout=240,
    )


def test_a_run_moved_to_its_standby_ends_where_the_uninterrupted_run_ends(tmp_path, moto_url, monkeypatch, ref1):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)  # the failover's own AWS calls
    aws.reset()
    home, standby = clients(moto_url, HOME_REGION), clients(moto_url, STANDBY_REGION)
    home["s3"].create_bucket(Bucket=PRIMARY)
    standby["s3"].create_bucket(Bucket=REPLICA, CreateBucketConfiguration={"LocationConstraint": STANDBY_REGION})
    group(home, "home-coordinator", 1)
    group(home, "home-workers", 2)
    group(standby, "standby-coordinator", 0)
    group(standby, "standby-workers", 0)
    standby["ecr"].create_repository(repositoryName="trainer")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    standby["ecr"].put_image(repositoryName="trainer", imageManifest=json.dumps(manifest), imageTag=TAG)

    # The home trains until its region runs out of capacity (here: it stops at step 12,
    # its checkpoint durable), holding the lease, which it keeps: the run is not done.
    stopped = node(tmp_path / "home", moto_url, PRIMARY, REPLICA, "home/us-east-1", "train.stop_at_step=12")
    assert stopped["step"] == 12
    held = json.loads(home["s3"].get_object(Bucket=PRIMARY, Key=LEASE)["Body"].read())
    assert held["holder"] == "home/us-east-1" and held["expires_at"] > time.time()

    # A standby node started before the move is fenced: the home holds the lease.
    holder = "standby/us-west-2"
    early = node(tmp_path / "standby", moto_url, REPLICA, PRIMARY, holder, expect_rc=EXIT_FENCED)
    assert "home/us-east-1" in early["_stderr"]

    said: list[str] = []
    failover = Failover(
        stack("home", HOME_REGION, PRIMARY),
        stack("standby", STANDBY_REGION, REPLICA, standby_of="home"),
        say=said.append,
        poll_s=0.5,
        wait_s=60,
        sleep=lambda s: (replicate(home, standby), time.sleep(s)),
    )
    replicate(home, standby)  # what replication carried before the decision
    assert failover.run() == 0
    assert "resumes from step-12" in said[-2]
    desired = standby["autoscaling"].describe_auto_scaling_groups(AutoScalingGroupNames=["standby-workers"])
    assert desired["AutoScalingGroups"][0]["DesiredCapacity"] == 2

    # The move left the lease to run out: then the standby's node takes it, with the
    # next epoch, and trains.
    time.sleep(max(0.0, held["expires_at"] + 11 - time.time()))  # the taker's skew margin is 10 s
    out = node(tmp_path / "standby", moto_url, REPLICA, PRIMARY, holder)
    assert out["resumed_from"]["step"] == 12 and out["resumed_from"]["tier"] == "primary"
    assert out["state_sha256"] == ref1["state_sha256"]
    lease = json.loads(home["s3"].get_object(Bucket=PRIMARY, Key=LEASE)["Body"].read())
    assert lease["holder"] == holder and lease["epoch"] > held["epoch"]
    # What the standby wrote is in its primary, the home's replica bucket.
    keys = [o["Key"] for o in standby["s3"].list_objects_v2(Bucket=REPLICA, Prefix=f"{ROOT}/").get("Contents", [])]
    assert any(k.endswith(f"step-{out['step']}/manifest.json") for k in keys)
