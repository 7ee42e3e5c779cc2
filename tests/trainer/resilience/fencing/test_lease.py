"""The run lease: one holder commits a run. Created, renewed, refused to another holder
while current, taken over only after it ran out plus the allowed skew, lost for good by a
holder whose epoch was taken, and run out for a holder cut off from the store (also
across a real partition, a TCP link cut: tests/tcplink.py); the same on a local file, on
S3 (moto's conditional writes) and on GCS (fake-gcs-server's generation preconditions)."""

from __future__ import annotations

import json

import pytest

from ftfleet.contract import EXIT_FENCED
from ftfleet.errors import UserError
from ftfleet.trainer.checkpoint.tiers.base import TierUnavailable, VersionConflict
from ftfleet.trainer.resilience import fencing
from ftfleet.trainer.resilience.fencing import lease as lease_mod
from ftfleet.trainer.resilience.fencing.lease import LeaseError, LeaseHeld, LocalObject, RunLease, open_lease_store


class Clocks:
    """A wall clock and a monotonic one that move together, and only when told; the
    wall clock may be offset (another machine's)."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def advance(self, s: float) -> None:
        self.t += s

    def lease(self, store, name="lease.json", holder="aws-prod/us-east-1", offset=0.0, **kw) -> RunLease:
        return RunLease(
            store,
            name,
            run_id="llm",
            holder=holder,
            ttl_s=120.0,
            skew_s=10.0,
            clock=lambda: self.t + offset,
            monotonic=lambda: self.t,
            **kw,
        )


def semantics(store, clocks: Clocks) -> None:
    """The lease's contract on ``store``."""
    east = clocks.lease(store)
    west = clocks.lease(store, holder="aws-prod-standby/us-west-2")
    assert east.problem() == "the run lease of llm is not held"
    east.acquire()
    assert east.epoch == 1 and east.problem() is None
    with pytest.raises(LeaseHeld) as held:
        west.acquire()
    line = str(held.value)
    assert "held by aws-prod/us-east-1" in line and "\n" not in line and held.value.exit_code == EXIT_FENCED
    clocks.advance(45)
    east.renew()  # east commits until 45 + 120 - 10 - 30; another job takes it after 45 + 120 + 10
    clocks.advance(75)
    assert east.problem() is None
    clocks.advance(10)
    assert "ran out" in east.problem()  # cut off (no renewal since): it stops committing first
    clocks.advance(40)
    with pytest.raises(LeaseHeld):
        west.acquire()  # expired 5 s ago: not yet past the skew allowed
    clocks.advance(6)
    west.acquire()  # 11 s past expiry: taken over
    assert west.epoch == 2
    east.renew()
    assert "taken over: it names aws-prod-standby/us-west-2" in east.problem() and "(epoch 2)" in east.problem()
    east.renew()  # lost for good: a renewal does not bring it back
    assert east.problem().startswith("the run lease was taken over")
    west.release()
    east.acquire()  # released: taken at once
    assert east.epoch == 3 and east.problem() is None


def test_the_lease_on_a_local_file(tmp_path):
    semantics(LocalObject(tmp_path), Clocks())


def test_a_second_job_of_the_same_holder_is_refused_while_the_first_renews(tmp_path):
    """A relaunch beside a job that still runs (another store, the same stack and region)."""
    clocks = Clocks()
    first = clocks.lease(LocalObject(tmp_path), job="store 10.0.0.1:29400")
    again = clocks.lease(LocalObject(tmp_path), job="store 10.0.0.1:29400")  # the same job's next attempt
    second = clocks.lease(LocalObject(tmp_path), job="store 10.0.0.9:29400")
    first.acquire()
    again.acquire()
    assert again.epoch == 1
    with pytest.raises(LeaseHeld, match="held by aws-prod/us-east-1 .store 10.0.0.1:29400"):
        second.acquire()
    clocks.advance(131)  # the first job stopped renewing: past expiry and skew
    second.acquire()
    assert second.epoch == 2
    first.renew()
    assert "taken over" in first.problem()


def test_the_lease_on_s3_with_conditional_writes(s3, bucket, moto_url):
    store, name = open_lease_store(f"s3://{bucket}/runs/llm/lease.json", endpoint_url=moto_url)
    semantics(store, Clocks())
    doc = json.loads(s3.get_object(Bucket=bucket, Key="runs/llm/lease.json")["Body"].read())
    assert doc["holder"] == "aws-prod/us-east-1" and doc["epoch"] == 3 and doc["format"] == "ftfleet-lease/1"


@pytest.mark.integration
def test_the_lease_on_gcs_with_generation_preconditions(gcs_bucket):
    store, name = open_lease_store(f"gs://{gcs_bucket}/runs/llm/lease.json")
    semantics(store, Clocks())


def test_a_conditional_write_from_a_stale_version_is_refused(s3, bucket, moto_url, tmp_path):
    store, _ = open_lease_store(f"s3://{bucket}/x/lease.json", endpoint_url=moto_url)
    for st in (store, LocalObject(tmp_path)):
        st.write_if("lease.json", b"1", None)
        _, version = st.read_versioned("lease.json")
        with pytest.raises(VersionConflict):
            st.write_if("lease.json", b"2", None)  # create-only, and it exists
        st.write_if("lease.json", b"3", version)
        with pytest.raises(VersionConflict):
            st.write_if("lease.json", b"4", version)  # the version moved on


def test_two_holders_racing_from_the_same_state_give_one_lease(tmp_path):
    """West reads the absent lease, east creates it, west's create is refused: it reads
    again and finds east's current lease."""
    clocks = Clocks()
    store = LocalObject(tmp_path)
    east = clocks.lease(store)

    class Racing(LocalObject):
        def write_if(self, rel, data, version):
            if east.epoch is None:
                east.acquire()  # lands between west's read and west's write
            return super().write_if(rel, data, version)

    west = clocks.lease(Racing(tmp_path), holder="west")
    with pytest.raises(LeaseHeld, match="held by aws-prod/us-east-1"):
        west.acquire()
    assert east.problem() is None


def test_a_commit_without_the_lease_is_refused_through_the_fence(tmp_path, monkeypatch):
    clocks = Clocks()
    mine = clocks.lease(LocalObject(tmp_path))
    mine.acquire()
    lease_mod.install(mine)
    try:
        assert fencing.problem_of(None) is None
        clocks.advance(81)  # past 120 - 10 - 30
        assert "ran out" in fencing.problem_of(None)
    finally:
        lease_mod.install(None)
    assert fencing.problem_of(None) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "does not read"),
        (json.dumps({"format": "other"}), "does not read"),
        (
            json.dumps({"format": "ftfleet-lease/1", "run_id": "other", "holder": "x", "epoch": 1, "expires_at": 0}),
            "is run 'other''s",
        ),
    ],
)
def test_a_lease_that_does_not_read_is_refused_in_one_line_and_left_alone(tmp_path, text, words):
    (tmp_path / "lease.json").write_text(text)
    with pytest.raises(LeaseError) as exc:
        Clocks().lease(LocalObject(tmp_path)).acquire()
    assert words in str(exc.value) and "\n" not in str(exc.value)
    assert (tmp_path / "lease.json").read_text() == text


def test_bad_lease_settings_are_one_line():
    from ftfleet.errors import ConfigError
    from ftfleet.trainer.checkpoint.config import CheckpointConfig

    with pytest.raises(ConfigError, match="needs checkpoint.lease_holder"):
        CheckpointConfig(lease_uri="s3://b/run/lease.json")
    with pytest.raises(ConfigError, match="lease_ttl_s=30"):
        CheckpointConfig(lease_ttl_s=30)
    with pytest.raises(UserError, match="name the lease object"):
        open_lease_store("s3://bucket")


@pytest.mark.integration
def test_a_trainer_refuses_a_run_another_region_holds_and_releases_its_own_when_done(tmp_path):
    """Two starts of one run: the first finds the lease held by another holder and exits 78
    with one line, having written nothing; once that lease is released, the second trains,
    commits, and releases the lease when the run completes."""
    import time

    from tests.trainer.conftest import run_trainer

    lease_file = tmp_path / "home" / "lease.json"
    lease_file.parent.mkdir()
    other = {"format": "ftfleet-lease/1", "run_id": "t", "holder": "gcp-prod/us-central1", "epoch": 4, "ttl_s": 60}
    lease_file.write_text(json.dumps({**other, "expires_at": time.time() + 3600}))
    flags = [f"checkpoint.lease_uri={lease_file}", "checkpoint.lease_holder=aws-prod/us-east-1"]
    run_dir = tmp_path / "run"
    refused = run_trainer(1, run_dir, *flags, expect_rc=EXIT_FENCED)
    lines = [line for line in refused["_stderr"].splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "held by gcp-prod/us-central1" in lines[0]
    assert not list((run_dir / "checkpoints").glob("step-*"))
    lease_file.write_text(json.dumps({**other, "expires_at": 0}))  # released by its holder
    done = run_trainer(1, run_dir, *flags)
    assert done["status"] == "completed" and done["committed"]
    doc = json.loads(lease_file.read_text())
    assert (doc["holder"], doc["epoch"], doc["expires_at"]) == ("aws-prod/us-east-1", 5, 0.0)


def test_a_missing_lease_is_missing_where_s3_answers_403_to_a_role_that_lists_only_its_key(s3, bucket, moto_url):
    """Moto answers a GET of a missing key with 404 whatever the caller may do; AWS answers
    403 to a caller without s3:ListBucket (GetObject, API Reference), which is the
    fleet's node role: it may list the lease's key only. A stand-in that answers as AWS
    does: the first holder still finds no lease and creates it, and a real 403 (the
    listing shows the object) still raises."""
    from botocore.exceptions import ClientError

    store, name = open_lease_store(f"s3://{bucket}/ftfleet-leases/llm.json", endpoint_url=moto_url)
    real_get = store.client.get_object

    def get_as_aws(**kwargs):
        try:
            return real_get(**kwargs)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchKey":
                raise
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject") from None

    store.client.get_object = get_as_aws
    clocks = Clocks()
    first = clocks.lease(store, name)
    first.acquire()
    assert json.loads(s3.get_object(Bucket=bucket, Key="ftfleet-leases/llm.json")["Body"].read())["epoch"] == 1

    def denied(**kwargs):
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    store.client.get_object = denied  # the object is there, the role may not read it
    with pytest.raises(TierUnavailable, match="AccessDenied"):
        store.read_versioned(name)


def split(east_store, west_store, link, clocks: Clocks) -> None:
    """The lease's contract across a real network partition: ``east_store`` reaches the
    store through ``link``, ``west_store`` directly."""
    east = clocks.lease(east_store)
    west = clocks.lease(west_store, holder="aws-prod-standby/us-west-2")
    east.acquire()
    clocks.advance(30)
    link.cut()  # east's region loses its path to the store
    east.renew()  # fails: the lease keeps what the last renewal established
    assert east.problem() is None
    clocks.advance(51)  # 81 s since the last renewal: past 120 - 10 - 30
    problem = east.problem()
    assert problem.startswith("the run lease of llm ran out: not renewed for 80 s (last attempt: ")
    with pytest.raises(LeaseHeld):
        west.acquire()  # it expires 120 s after east's write; 10 s of skew more
    clocks.advance(50)
    west.acquire()  # 131 s after it: taken over, while east still cannot see the store
    assert west.epoch == 2
    link.heal()
    east.renew()
    assert "taken over: it names aws-prod-standby/us-west-2" in east.problem()


def test_a_holder_cut_off_from_s3_stops_committing_before_another_region_takes_over(s3, bucket, moto_url):
    from tests.tcplink import TcpLink

    uri = f"s3://{bucket}/runs/llm/lease.json"
    with TcpLink(moto_url) as link:
        east, _ = open_lease_store(uri, endpoint_url=link.url)
        west, _ = open_lease_store(uri, endpoint_url=moto_url)
        split(east, west, link, Clocks())


@pytest.mark.integration
def test_a_holder_cut_off_from_gcs_stops_committing_before_another_region_takes_over(gcs_bucket, monkeypatch):
    import os

    from tests.tcplink import TcpLink

    uri = f"gs://{gcs_bucket}/runs/llm/lease.json"
    with TcpLink(os.environ["STORAGE_EMULATOR_HOST"]) as link:
        west, _ = open_lease_store(uri)
        west.read_versioned("lease.json")  # its client is made now, on the direct path
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", link.url)
        east, _ = open_lease_store(uri)
        east.read_versioned("lease.json")
        split(east, west, link, Clocks())
