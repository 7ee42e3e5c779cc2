"""The lifecycle handoff for real: the Auto Scaling group terminates a node (the fake
metadata service turns autoscaling/target-lifecycle-state to Terminated), the trainer
(torchrun, 2 workers) commits its emergency checkpoint, writes its commit marker and
then completes its lifecycle action against a local AWS endpoint: moto's server behind
drill/aws_standin.py, which answers CompleteLifecycleAction (moto lacks it). The same
endpoint receives the node's TrainerSteps heartbeat."""

from __future__ import annotations

import datetime
import json
import re
import time

import boto3
import pytest

from drill.aws_standin import AwsStandIn
from drill.fake_metadata import FakeMetadataServer
from ftfleet import contract
from ftfleet.contract import CommitMarker, Interruption, InterruptionPrior, marker_key
from tests.trainer.conftest import start_trainer, wait_for
from tests.trainer.resilience.aws_group import GROUP, make_group
from tests.trainer.scenarios.test_under_fire import PACED, assert_emergency, events, finish, started

pytestmark = pytest.mark.integration

RUN_ID = "handoff"


@pytest.fixture
def standin():
    with AwsStandIn() as server:
        yield server


def test_a_group_termination_commits_marks_and_then_completes_the_lifecycle_action(tmp_path, standin):
    instance = make_group(standin.moto_url)
    run_dir = tmp_path / "run"
    # The fleet's interruption prior on the fast tier (as an FSx association imports it):
    # three job interruptions 10 h apart, so the trainer's MTBF prior becomes ~15 h.
    prior, now = InterruptionPrior("aws", RUN_ID, time.time()), time.time()
    for i, hours in enumerate((30, 20, 10)):
        prior, _ = prior.with_interruption(Interruption(f"i-{i}", now - hours * 3600, "us-east-1a", "p5"), now)
    prior_path = run_dir / "checkpoints" / contract.INTERRUPTION_PRIOR_KEY
    prior_path.parent.mkdir(parents=True)
    prior_path.write_text(prior.to_json())
    with FakeMetadataServer(instance_id=instance, group_name=GROUP) as imds:
        env = {
            "FTFLEET_CLOUD": "aws",
            "FTFLEET_REGION": "us-east-1",
            "FTFLEET_RUN_ID": RUN_ID,
            "FTFLEET_NODE_ID": instance,
            "FTFLEET_METADATA_ENDPOINT": imds.url,
            "AWS_ENDPOINT_URL": standin.url,
        }
        proc = start_trainer(2, run_dir, *PACED, f"run_id={RUN_ID}", "resilience.node_metrics.period_s=0.3", env=env)
        wait_for(lambda: started(run_dir), 90, 0.1, "the first step")
        time.sleep(0.7)  # a heartbeat or two with steps in them
        noticed = time.time()
        imds.terminate_in_group()
        finish(proc)

    s = assert_emergency(run_dir, 120, instance)
    (notice,) = events(run_dir, "notice")
    assert (notice["kind"], notice["source"]) == ("termination", "aws-target-lifecycle-state")
    marker = CommitMarker.from_json((run_dir / "checkpoints" / marker_key(instance)).read_text())

    (call,) = standin.completions()
    assert call["params"] == {
        "LifecycleHookName": contract.TERMINATION_HOOK_NAME,
        "AutoScalingGroupName": GROUP,
        "InstanceId": instance,
        "LifecycleActionResult": "CONTINUE",
    }
    assert call["at"] >= marker.written_at, "the action was completed before the marker was written"
    assert s["emergency"]["lifecycle"]["result"] == "completed"
    assert re.search(r"MTBF prior 540\d\ds from the fleet's interruptions", (tmp_path / "run.log").read_text())

    # The node's heartbeat reached CloudWatch with the contract's name and dimensions.
    cw = boto3.session.Session(aws_access_key_id="t", aws_secret_access_key="t", region_name="us-east-1").client(
        "cloudwatch", endpoint_url=standin.moto_url
    )
    now = datetime.datetime.now(datetime.UTC)
    points = cw.get_metric_statistics(
        Namespace=contract.METRICS_NAMESPACE,
        MetricName=contract.PROGRESS_METRIC.name,
        Dimensions=contract.PROGRESS_METRIC.dimensions(RUN_ID, instance),
        StartTime=now - datetime.timedelta(minutes=10),
        EndTime=now + datetime.timedelta(minutes=1),
        Period=60,
        Statistics=["Sum"],
    )["Datapoints"]
    assert sum(p["Sum"] for p in points) > 0

    figures = {
        "notice_to_completion_s": round(call["at"] - noticed, 3),
        "trainer_notice_to_completion_s": round(call["at"] - notice["received_at"], 3),
        "notice_to_commit_s": s["emergency"]["seconds_to_commit"],
        "marker_to_completion_s": round(call["at"] - marker.written_at, 3),
    }
    (tmp_path / "handoff.json").write_text(json.dumps(figures))
    print(f"lifecycle handoff: {json.dumps(figures)}")
