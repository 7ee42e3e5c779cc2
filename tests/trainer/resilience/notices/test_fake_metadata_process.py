import json
import signal
import subprocess
import sys
import urllib.request

import pytest

from drill.fake_metadata import FakeMetadataClient
from tests.trainer.resilience.helpers import REPO, subprocess_env

pytestmark = pytest.mark.integration


def test_the_fake_runs_as_a_process_and_is_controlled_over_http():
    proc = subprocess.Popen(
        [sys.executable, "-m", "drill.fake_metadata", "--port", "0"],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        hello = json.loads(proc.stdout.readline())
        client = FakeMetadataClient(hello["url"])
        client.preempt()
        client.schedule_spot_interruption("terminate", in_seconds=90)
        request = urllib.request.Request(
            hello["url"] + "/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
        )
        assert urllib.request.urlopen(request, timeout=5).read() == b"TRUE"
        state = client.state()
        assert state["instance_action"]["action"] == "terminate"
        client.reset()
        assert client.state()["gcp"]["preempted"] == "FALSE"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
