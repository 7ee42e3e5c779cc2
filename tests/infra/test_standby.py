"""A standby environment (``standbyOf``) on AWS and GCP: what it shares with its home
stack, what it adds, and the one-line refusals of a standby that does not match its home."""

from __future__ import annotations

import base64
import json
import re
import time

import pytest

from ftfleet.cli import main
from ftfleet.errors import ConfigError
from ftfleet.infra import offline, settings, stackfile
from ftfleet.infra.aws import standby
from tests.infra.conftest import _variant_of, recording

HOME, STANDBY = "aws-prod", "aws-prod-standby"
GROUP = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"


def run_standby(tmp_path, home_outputs=None, **changes) -> offline.Recording:
    """aws-prod-standby with some keys changed (None removes one), against aws-prod's
    recorded outputs unless ``home_outputs`` stands for them."""
    outputs = recording(HOME).outputs if home_outputs is None else home_outputs
    return _variant_of(STANDBY, tmp_path, STANDBY, lambda: {HOME: outputs})(**changes)


def node_env(rec: offline.Recording) -> dict[str, str]:
    """The trainer environment rendered into the first launch template's user data."""
    script = base64.b64decode(rec.of_type(LT)[0].inputs["userData"]).decode()
    return dict(re.findall(r"^(FTFLEET_[A-Z_]+)=(\S*)$", script, re.M))


def test_the_home_publishes_what_a_standby_needs():
    home = recording(HOME)
    source = home.outputs[standby.OUTPUT]
    assert set(source) == set(standby.FIELDS)
    assert source["region"] == "us-east-1" and source["replica_region"] == "us-west-2"
    assert source["primary_bucket"] == home.outputs["primary_bucket"]
    assert source["replica_bucket"] == home.outputs["replica_bucket"]
    assert source["repository_name"] == "ftfleet-aws-prod/trainer"
    assert source["checkpoint_root"] == "checkpoints/llm-prod"


def test_the_standby_creates_no_bucket_or_key_and_trains_on_the_homes_replica():
    home, rec = recording(HOME).outputs, recording(STANDBY)
    types = {r.type for r in rec.resources}
    assert not types & {"aws:s3/bucket:Bucket", "aws:kms/key:Key", "aws:kms/replicaKey:ReplicaKey"}
    assert rec.outputs["primary_bucket"] == home["replica_bucket"]
    assert rec.outputs["replica_bucket"] == home["primary_bucket"]
    assert rec.outputs["standby_of"] == HOME and standby.OUTPUT not in rec.outputs
    env = node_env(rec)
    assert env["FTFLEET_CKPT_URI"] == f"s3://{home['replica_bucket']}/checkpoints/llm-prod"
    assert env["FTFLEET_CKPT_REPLICA_URI"] == f"s3://{home['primary_bucket']}/checkpoints/llm-prod"
    # One lease for both regions: the home's key in the home's primary bucket.
    assert env["FTFLEET_LEASE_URI"] == node_env(recording(HOME))["FTFLEET_LEASE_URI"]
    assert env["FTFLEET_LEASE_URI"] == f"s3://{home['primary_bucket']}/ftfleet-leases/llm-prod.json"
    assert env["FTFLEET_LEASE_HOLDER"] == "aws-prod-standby/us-west-2"
    # What `ftfleet failover` reads (infra/failover.py NEEDED) names the same lease.
    assert env["FTFLEET_LEASE_URI"] == rec.outputs["lease_uri"] == recording(HOME).outputs["lease_uri"]
    assert (rec.outputs["region"], rec.outputs["run_id"]) == ("us-west-2", "llm-prod")
    # The file system is in this region, linked to the home's replica bucket, and
    # encrypted with the home key's replica here.
    dra = rec.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")[0]
    assert dra.inputs["dataRepositoryPath"] == f"s3://{home['replica_bucket']}/checkpoints/"
    fsx = rec.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")[0]
    assert rec.region_of(fsx) == "us-west-2"
    assert fsx.inputs["kmsKeyId"] == home[standby.OUTPUT]["replica_key_arn"]


def test_the_nodes_may_hold_the_homes_lease_and_write_it_with_the_homes_key():
    home = recording(HOME).outputs[standby.OUTPUT]
    rec = recording(STANDBY)
    (doc,) = [
        json.loads(p.inputs["policy"])
        for p in rec.of_type("aws:iam/rolePolicy:RolePolicy")
        if "-nodes-" in p.name and "HoldRunLease" in p.inputs["policy"] and "worker" in p.name
    ]
    sids = {st["Sid"]: st for st in doc["Statement"]}
    lease = f"arn:aws:s3:::{home['primary_bucket']}/ftfleet-leases/llm-prod.json"
    assert sids["HoldRunLease"]["Resource"] == [lease]
    assert sids["FindRunLease"]["Resource"] == [f"arn:aws:s3:::{home['primary_bucket']}"]
    assert sids["WriteRunLeaseKey"]["Resource"] == [home["key_arn"]]
    assert sids["WriteRunLeaseKey"]["Condition"]["StringEquals"]["kms:ViaService"] == "s3.us-east-1.amazonaws.com"
    # Checkpoints are written to the home's replica bucket only; the home's primary is read.
    assert sids["ReadWriteCheckpoints"]["Resource"] == [f"arn:aws:s3:::{home['replica_bucket']}/checkpoints/llm-prod/*"]
    assert sids["ReadReplicaCheckpoints"]["Resource"] == [
        f"arn:aws:s3:::{home['primary_bucket']}/checkpoints/llm-prod/*"
    ]
    # A home's nodes get no key grant for the lease: it is in their own primary bucket.
    (home_doc,) = [
        json.loads(p.inputs["policy"])
        for p in recording(HOME).of_type("aws:iam/rolePolicy:RolePolicy")
        if "-nodes-" in p.name and "HoldRunLease" in p.inputs["policy"] and "worker" in p.name
    ]
    assert "WriteRunLeaseKey" not in {st["Sid"] for st in home_doc["Statement"]}


def test_what_the_standby_writes_replicates_back_to_the_home_region():
    home = recording(HOME).outputs[standby.OUTPUT]
    rec = recording(STANDBY)
    (config,) = rec.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    assert rec.region_of(config) == "us-west-2" and config.inputs["bucket"] == home["replica_bucket"]
    (rule,) = config.inputs["rules"]
    assert rule["destination"]["bucket"] == f"arn:aws:s3:::{home['primary_bucket']}"
    assert rule["destination"]["encryptionConfiguration"]["replicaKmsKeyId"] == home["key_arn"]
    assert rule["deleteMarkerReplication"]["status"] == "Enabled"
    assert rule["destination"]["replicationTime"]["status"] == "Enabled"  # replicationTimeControl: true
    (policy,) = [p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if "-standby-replication" in p.name]
    sids = {st["Sid"]: st for st in json.loads(policy.inputs["policy"])["Statement"]}
    assert sids["ReadSourceConfig"]["Resource"] == [f"arn:aws:s3:::{home['replica_bucket']}"]
    assert sids["WriteReplica"]["Resource"] == [f"arn:aws:s3:::{home['primary_bucket']}/*"]
    assert sids["DecryptSource"]["Resource"] == [home["replica_key_arn"]]
    assert sids["DecryptSource"]["Condition"]["StringLike"]["kms:ViaService"] == "s3.us-west-2.amazonaws.com"
    assert sids["EncryptReplica"]["Condition"]["StringLike"]["kms:ViaService"] == "s3.us-east-1.amazonaws.com"


def test_the_home_registry_replicates_its_image_into_the_standbys_repository(tmp_path):
    rec = recording(STANDBY)
    (repo,) = rec.of_type("aws:ecr/repository:Repository")
    assert repo.inputs["name"] == "ftfleet-aws-prod/trainer" and rec.region_of(repo) == "us-west-2"
    (replication,) = rec.of_type("aws:ecr/replicationConfiguration:ReplicationConfiguration")
    assert rec.region_of(replication) == "us-east-1"
    (rule,) = replication.inputs["replicationConfiguration"]["rules"]
    assert rule["destinations"] == [{"region": "us-west-2", "registryId": offline.MOCK_ACCOUNT}]
    assert rule["repositoryFilters"] == [{"filter": "ftfleet-aws-prod/trainer", "filterType": "PREFIX_MATCH"}]
    # ECR creates a destination repository that does not exist: this one comes first.
    assert repo.urn in replication.dependencies
    # `existing`: the account's replication made the repository; it is looked up, not created.
    existing = run_standby(tmp_path, standbyImageReplication="existing")
    assert not existing.of_type("aws:ecr/replicationConfiguration:ReplicationConfiguration")
    assert not existing.of_type("aws:ecr/repository:Repository")
    lookups = [a for token, a, _ in existing.invokes if token == "aws:ecr/getRepository:getRepository"]
    assert lookups == [{"name": "ftfleet-aws-prod/trainer"}]
    assert existing.outputs["trainer_image"].endswith("/ftfleet-aws-prod/trainer:0.1.0")


def test_the_groups_stand_at_zero_and_their_sizes_belong_to_the_failover():
    rec = recording(STANDBY)
    groups = rec.of_type(GROUP)
    assert len(groups) == 2
    for g in groups:
        assert g.inputs["minSize"] == 0 and g.inputs["desiredCapacity"] == 0, g.name
        assert set(g.ignore_changes) == {"minSize", "desiredCapacity"}, g.name
    workers = next(g for g in groups if g.name.endswith("-workers"))
    assert workers.inputs["maxSize"] == 32
    # A home's groups stay the program's.
    assert all(not g.ignore_changes for g in recording(HOME).of_type(GROUP))
    assert "standing by: 0 nodes until a failover" in rec.outputs["fleet_status"]


def test_a_file_system_on_failover_comes_with_standby_active_and_until_then_no_node_can_boot(tmp_path):
    idle = run_standby(tmp_path, standbyFastTier="on-failover", standbyAutoFailover=False)
    assert not idle.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert all(g.inputs["maxSize"] == 0 for g in idle.of_type(GROUP))
    assert idle.outputs["fsx_dns_name"] == ""
    active = run_standby(tmp_path, standbyFastTier="on-failover", standbyActive=True, standbyAutoFailover=False)
    assert len(active.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")) == 1
    assert next(g for g in active.of_type(GROUP) if g.name.endswith("-workers")).inputs["maxSize"] == 32
    # The association is what a booting node waits for, once it exists.
    (dra,) = active.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert all(dra.urn in lt.dependencies for lt in active.of_type(LT))


def test_the_standby_has_no_storage_drift_function_its_home_guards_the_buckets():
    functions = recording(STANDBY).outputs["remediation_functions"]
    assert "storage_drift" not in functions and "storage_drift" in recording(HOME).outputs["remediation_functions"]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"aws:region": "eu-west-1", "availabilityZones": ["eu-west-1a"]}, "aws:region is 'eu-west-1' here"),
        ({"replicaRegion": "eu-west-1"}, "set ftfleet:replicaRegion us-east-1"),
        ({"runId": "other-run"}, "set ftfleet:runId llm-prod"),
        ({"checkpointPrefix": "elsewhere/"}, "set ftfleet:checkpointPrefix and runId as aws-prod does"),
    ],
    ids=["region", "replica-region", "run", "prefix"],
)
def test_a_standby_that_does_not_match_its_home_is_refused_in_one_line(tmp_path, changes, says):
    with pytest.raises(Exception) as caught:
        run_standby(tmp_path, **changes)
    message = str(caught.value)
    assert says in message and "\n" not in message.strip()


def test_a_home_that_publishes_nothing_yet_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(Exception, match=r"deploy aws-prod \(`pulumi up -s aws-prod`\)"):
        run_standby(tmp_path, home_outputs={})
    partial = {standby.OUTPUT: {**recording(HOME).outputs[standby.OUTPUT], "replica_bucket": ""}}
    with pytest.raises(Exception, match="lacks replica_bucket"):
        run_standby(tmp_path, home_outputs=partial)


def test_plan_runs_the_home_beside_a_standby_file_and_refuses_without_it(tmp_path, capsys):
    assert main(["plan", STANDBY]) == 0
    out = capsys.readouterr().out
    assert "standby of aws-prod: node groups at 0 until a failover" in out and "FSx kept" in out
    lone = tmp_path / f"Pulumi.{STANDBY}.yaml"
    lone.write_text(stackfile.load(STANDBY).path.read_text())
    assert main(["plan", str(lone)]) == 2
    err = capsys.readouterr().err
    assert "names no stack file" in err and "put the home stack's file beside it" in err


def test_the_standing_by_cost_is_the_file_system_kept_and_the_nat_gateway(tmp_path):
    from ftfleet.infra import estimate

    kept = estimate.estimate(stackfile.load(STANDBY).settings())
    sb = kept["standby"]
    assert sb["standing_by_usd_per_month"] == pytest.approx(
        kept["storage_usd_per_month"]["fsx"] + kept["network_usd_per_month"]["nat_gateway"], abs=0.02
    )
    assert sb["fleet_after_failover_usd_per_hour"] == kept["fleet_usd_per_hour"]["with_spot"]
    assert kept["storage_usd_per_month"]["buckets_per_tib_stored"] == 0  # the home's
    raw = {**stackfile.load(STANDBY).project_config(), "standbyFastTier": "on-failover", "standbyAutoFailover": False}
    lean = estimate.estimate(settings.parse(raw, stack=STANDBY, region="us-west-2"))
    assert lean["standby"]["standing_by_usd_per_month"] == kept["network_usd_per_month"]["nat_gateway"]
    assert estimate.estimate(stackfile.load(HOME).settings())["standby"] is None


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"standbyOf": "aws-prod-standby"}, "names this stack"),
        ({"standbyOf": "Prod_1"}, "give the home stack's name"),
        ({"standbyOf": "", "standbyImageReplication": "existing"}, "stands by for none"),
        ({"standbyOf": "", "standbyActive": True}, "stands by for none"),
        ({"standbyImageReplication": "copy"}, "use create"),
        ({"standbyFastTier": "later"}, "use kept"),
        ({"remediationStorageDrift": True}, "its functions do this"),
    ],
)
def test_standby_settings_are_refused_in_one_line_naming_the_fix(changes, says):
    raw = {**stackfile.load(STANDBY).project_config(), **changes}
    with pytest.raises(ConfigError, match=re.escape(says)):
        settings.parse(raw, stack=STANDBY, region="us-west-2")


# -- GCP: the home's dual-region bucket, shared as it is ----------------------------

GCP_HOME, GCP_STANDBY = "gcp-prod", "gcp-prod-standby"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"


def run_gcp_standby(tmp_path, home_outputs=None, **changes) -> offline.Recording:
    outputs = recording(GCP_HOME).outputs if home_outputs is None else home_outputs
    return _variant_of(GCP_STANDBY, tmp_path, GCP_STANDBY, lambda: {GCP_HOME: outputs})(**changes)


def startup_env(rec: offline.Recording) -> dict[str, str]:
    template = rec.of_type("gcp:compute/regionInstanceTemplate:RegionInstanceTemplate")[0]
    return dict(re.findall(r"(FTFLEET_[A-Z_]+)=(\S+)", template.inputs["metadata"]["startup-script"]))


def test_a_gcp_standby_shares_the_homes_bucket_and_lease_and_pulls_through_a_remote_repository(tmp_path):
    home = recording(GCP_HOME).outputs
    rec = run_gcp_standby(tmp_path, standbyFastTier="kept")
    assert rec.outputs["checkpoint_bucket"] == home["checkpoint_bucket"]
    assert rec.outputs["checkpoint_uri"] == home["checkpoint_uri"]
    assert not rec.of_type("gcp:kms/cryptoKey:CryptoKey")
    # The only bucket it creates holds the remediation functions' source.
    assert all("remediation-source" in b.name for b in rec.of_type("gcp:storage/bucket:Bucket"))
    env = startup_env(rec)
    assert env["FTFLEET_LEASE_URI"] == startup_env(recording(GCP_HOME))["FTFLEET_LEASE_URI"]
    assert env["FTFLEET_LEASE_HOLDER"] == "gcp-prod-standby/us-east1"
    grants = {g.name: g.inputs for g in rec.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert all(g["bucket"] == home["checkpoint_bucket"] for g in grants.values())
    nodes = grants["ftfleet-gcp-prod-standby-nodes-checkpoints"]
    assert nodes["role"] == "roles/storage.objectAdmin"
    assert nodes["member"].endswith("ftfleet-gcp-prod-standby-nodes@ftfleet-plan.iam.gserviceaccount.com")
    (repo,) = rec.of_type("gcp:artifactregistry/repository:Repository")
    assert repo.inputs["mode"] == "REMOTE_REPOSITORY" and repo.inputs["location"] == "us-east1"
    upstream = repo.inputs["remoteRepositoryConfig"]["commonRepository"]["uri"]
    assert upstream == home["standby_source"]["repository"]
    assert upstream.endswith("/locations/us-central1/repositories/ftfleet-gcp-prod")
    assert rec.outputs["trainer_image"].startswith("us-east1-docker.pkg.dev/")


def test_a_gcp_standby_stands_at_zero_with_no_coordinator_vm_until_it_is_active(tmp_path):
    idle = run_gcp_standby(tmp_path, standbyFastTier="kept")
    groups = idle.of_type(MIG)
    assert groups and all(g.inputs["targetSize"] == 0 and g.ignore_changes == ["targetSize"] for g in groups)
    assert not idle.of_type("gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig")
    assert "worker groups at 0 and no coordinator VM" in idle.outputs["fleet_status"]
    active = run_gcp_standby(tmp_path, standbyFastTier="kept", standbyActive=True)
    assert len(active.of_type("gcp:compute/regionPerInstanceConfig:RegionPerInstanceConfig")) == 1
    assert all(g.inputs["targetSize"] == 0 for g in active.of_type(MIG))  # the failover sizes the workers


def test_a_gcp_standby_with_its_file_system_on_failover_has_no_groups_until_active():
    rec = recording(GCP_STANDBY)  # standbyFastTier: on-failover
    assert not rec.of_type(MIG) and not rec.of_type("gcp:lustre/instance:Instance")
    assert rec.outputs["worker_group"] == "" and rec.outputs["file_system_mount"] == ""
    # The bucket's functions are the home's: only the node-facing one runs here.
    assert set(rec.outputs["remediation_functions"]) == {"gcp_preemption"}


def test_a_gcp_standby_refuses_a_home_of_another_run_or_project(tmp_path):
    with pytest.raises(Exception, match="set ftfleet:runId llm-prod"):
        run_gcp_standby(tmp_path, runId="another")
    other = {"standby_source": {**recording(GCP_HOME).outputs["standby_source"], "project": "elsewhere"}}
    with pytest.raises(Exception, match="gcp:project is 'mine' here and 'elsewhere'"):
        run_gcp_standby(tmp_path, home_outputs=other, **{"gcp:project": "mine"})


@pytest.mark.parametrize("key", ["remediationRetentionSweep", "remediationReplicationLag", "remediationStorageDrift"])
def test_a_gcp_standby_refuses_the_functions_its_home_runs_on_the_shared_bucket(key):
    raw = {**stackfile.load(GCP_STANDBY).project_config(), key: True}
    with pytest.raises(ConfigError, match=f"ftfleet:{key} is true on a standby"):
        settings.parse(raw, stack=GCP_STANDBY, region="us-east1")


def test_a_gcp_standby_may_not_set_the_aws_image_replication_key():
    raw = {**stackfile.load(GCP_STANDBY).project_config(), "standbyImageReplication": "create"}
    with pytest.raises(ConfigError, match="applies to aws stacks only"):
        settings.parse(raw, stack=GCP_STANDBY, region="us-east1")


def remediation_of(rec: offline.Recording, folder: str) -> tuple[dict, dict]:
    """A remediation function's environment and its role's policy document."""
    stem = folder.replace("_", "-")
    (fn,) = [f for f in rec.of_type("aws:lambda/function:Function") if f.name.endswith(f"-remediation-{stem}")]
    (policy,) = [
        p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith(f"-remediation-{stem}-policy")
    ]
    return dict(fn.inputs["environment"]["variables"]), json.loads(policy.inputs["policy"])


def test_the_standby_s_capacity_watch_moves_the_run_between_the_two_regions():
    from ftfleet.lambdas.capacity_watch.config import Config

    home, rec = recording(HOME), recording(STANDBY)
    source = home.outputs[standby.OUTPUT]
    env, policy = remediation_of(rec, "capacity_watch")
    pair = Config.from_env(env).failover
    assert pair is not None
    assert (pair.home.stack, pair.home.region) == (HOME, "us-east-1")
    assert (pair.home.coordinator_group, pair.home.worker_group) == (
        home.outputs["coordinator_group"],
        home.outputs["worker_group"],
    )
    assert (pair.standby.worker_group, pair.standby.bucket) == (rec.outputs["worker_group"], source["replica_bucket"])
    assert (
        pair.home.bucket == source["primary_bucket"] and pair.home.root == pair.standby.root == "checkpoints/llm-prod"
    )
    # The holders the nodes write, and the lease they contend for.
    assert pair.standby.holder == node_env(rec)["FTFLEET_LEASE_HOLDER"]
    assert pair.home.holder == node_env(home)["FTFLEET_LEASE_HOLDER"]
    assert f"s3://{pair.lease.bucket}/{pair.lease.key}" == rec.outputs["lease_uri"]
    # Its role resizes and tags both stacks' groups, and no other, and writes only the lease.
    (moving,) = [st for st in policy["Statement"] if st["Sid"] == "MoveTheRun"]
    names = {arn.rsplit("/", 1)[1] for arn in moving["Resource"]}
    assert names == {
        home.outputs["coordinator_group"],
        home.outputs["worker_group"],
        rec.outputs["coordinator_group"],
        rec.outputs["worker_group"],
    }
    assert any(":us-east-1:" in arn for arn in moving["Resource"]) and any(
        ":us-west-2:" in arn for arn in moving["Resource"]
    )
    # It writes no object: the lease is only read (the move leaves it to run out).
    assert not [st for st in policy["Statement"] if "s3:PutObject" in st["Action"]]
    (lease,) = [st for st in policy["Statement"] if st["Sid"] == "ReadLease"]
    assert lease["Resource"] == [f"arn:aws:s3:::{source['primary_bucket']}/ftfleet-leases/llm-prod.json"]
    # The home's own watch measures and alarms; it moves nothing.
    home_env, home_policy = remediation_of(home, "capacity_watch")
    assert Config.from_env(home_env).failover is None
    assert not any(st["Sid"] == "MoveTheRun" for st in home_policy["Statement"])
    # Without standbyAutoFailover, the standby's watch only measures too.


def test_a_standby_without_automatic_failover_moves_nothing(tmp_path):
    from ftfleet.lambdas.capacity_watch.config import Config

    env, policy = remediation_of(run_standby(tmp_path, standbyAutoFailover=False), "capacity_watch")
    assert Config.from_env(env).failover is None
    assert not any(st["Sid"] == "MoveTheRun" for st in policy["Statement"])


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"standbyFastTier": "on-failover"}, "a move cannot create the file system"),
        ({"remediationCapacityWatch": False}, "the capacity watch moves the run; set it true"),
    ],
)
def test_automatic_failover_that_could_not_work_is_refused_in_one_line(changes, says):
    raw = {**stackfile.load(STANDBY).project_config(), **changes}
    with pytest.raises(ConfigError, match=says):
        settings.parse(raw, stack=STANDBY, region="us-west-2")


def home_with_lease(stack: str, bucket: str, holder: str, expires_in_s: float) -> offline.Recording:
    """The home's offline plan with the run lease in its bucket, held by ``holder``."""
    doc = {"format": "ftfleet-lease/1", "run_id": "llm-prod", "holder": holder, "epoch": 2}
    doc.update(expires_at=time.time() + expires_in_s, ttl_s=120)
    return offline.run(
        stackfile.load(stack), objects={f"{bucket}/ftfleet-leases/llm-prod.json": json.dumps(doc).encode()}
    )


def test_a_home_whose_run_trains_in_its_standby_keeps_its_groups_at_0():
    home = recording(HOME)

    def with_lease(holder: str, expires_in_s: float) -> offline.Recording:
        return home_with_lease(HOME, home.outputs["primary_bucket"], holder, expires_in_s)

    def sizes(rec: offline.Recording) -> list[tuple[int, int]]:
        return sorted((g.inputs["minSize"], g.inputs["desiredCapacity"]) for g in rec.of_type(GROUP))

    moved = with_lease("aws-prod-standby/us-west-2", 60)
    assert sizes(moved) == [(0, 0), (0, 0)]
    assert moved.outputs["fleet_status"].startswith(
        "the groups held at 0 nodes: the run trains with aws-prod-standby/us-west-2"
    )
    assert "`ftfleet failover aws-prod-standby --to aws-prod` brings it back" in moved.outputs["fleet_status"]
    # Its own lease, one run out, or no lease at all: the configured sizes.
    for rec in (with_lease("aws-prod/us-east-1", 60), with_lease("aws-prod-standby/us-west-2", -1), home):
        assert sizes(rec) == sizes(home) and sizes(home) != [(0, 0), (0, 0)]
        assert rec.outputs["fleet_status"].startswith("running")


def test_the_capacity_alarms_say_who_moves_the_run(tmp_path):
    def description(rec: offline.Recording) -> str:
        (alarm,) = [
            a for a in rec.of_type("aws:cloudwatch/metricAlarm:MetricAlarm") if a.name.endswith("-capacity-lost")
        ]
        return alarm.inputs["alarmDescription"]

    assert "this stack's capacity_watch moves the run back to aws-prod" in description(recording(STANDBY))
    assert "move the run back to aws-prod with `ftfleet failover`" in description(
        run_standby(tmp_path, standbyAutoFailover=False)
    )
    assert "its standby's capacity_watch moves the run (standbyAutoFailover)" in description(recording(HOME))


def test_a_gcp_standby_with_automatic_failover_moves_between_both_stacks_groups(tmp_path):
    from ftfleet.infra.gcp import functions
    from ftfleet.lambdas.gcp_capacity_watch.config import Config

    home = recording(GCP_HOME)
    rec = run_gcp_standby(tmp_path, standbyFastTier="kept", standbyActive=True, standbyAutoFailover=True)
    (watch,) = [
        f
        for f in rec.of_type("gcp:cloudfunctionsv2/function:Function")
        if f.inputs["description"].split()[1] == "gcp_capacity_watch"
    ]
    pair = Config.from_env(watch.inputs["serviceConfig"]["environmentVariables"]).failover
    source = home.outputs["standby_source"]
    assert (pair.home.stack, pair.home.region, pair.home.coordinator_group) == (
        GCP_HOME,
        "us-central1",
        home.outputs["coordinator_group"],
    )
    assert pair.home.worker_groups == tuple(home.outputs["worker_groups"])
    assert pair.standby.worker_groups == tuple(rec.outputs["worker_groups"])
    assert pair.standby.coordinator_group == rec.outputs["coordinator_group"]
    assert {pair.home.bucket, pair.standby.bucket} == {source["bucket"]} and pair.home.cloud == "gcp"
    assert f"gs://{pair.lease.bucket}/{pair.lease.key}" == home.outputs["lease_uri"] == rec.outputs["lease_uri"]
    # One run at a time; it may resize the groups, which the home's watch may not.
    assert watch.inputs["serviceConfig"]["maxInstanceCount"] == 1
    roles = {
        r.inputs["title"]: r.inputs["permissions"] for r in rec.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    }
    (moving,) = [p for t, p in roles.items() if "capacity watch" in t]
    assert sorted(moving) == sorted(functions.MOVE_PERMISSIONS)
    home_roles = {
        r.inputs["title"]: r.inputs["permissions"] for r in home.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    }
    assert [p for t, p in home_roles.items() if "capacity watch" in t] == [list(functions.CAPACITY_PERMISSIONS)]


def test_gcp_automatic_failover_needs_the_standbys_coordinator_running(tmp_path):
    with pytest.raises(Exception, match="standbyAutoFailover is true on a GCP standby without standbyActive"):
        run_gcp_standby(tmp_path, standbyFastTier="kept", standbyAutoFailover=True)


def test_a_gcp_home_whose_run_trains_in_its_standby_keeps_its_workers_at_0():
    home = recording(GCP_HOME)

    def with_lease(holder: str, expires_in_s: float) -> offline.Recording:
        return home_with_lease(GCP_HOME, home.outputs["checkpoint_bucket"], holder, expires_in_s)

    def workers(rec: offline.Recording) -> dict[str, int]:
        return {g.name: g.inputs["targetSize"] for g in rec.of_type(MIG) if "workers" in g.name}

    moved = with_lease("gcp-prod-standby/us-east1", 60)
    assert workers(moved) and set(workers(moved).values()) == {0}
    assert moved.outputs["fleet_status"].startswith(
        "the worker groups held at 0 nodes: the run trains with gcp-prod-standby/us-east1"
    )
    assert "`ftfleet failover gcp-prod-standby --to gcp-prod` brings it back" in moved.outputs["fleet_status"]
    for rec in (with_lease("gcp-prod/us-central1", 60), with_lease("gcp-prod-standby/us-east1", -1), home):
        assert workers(rec) == workers(home) and set(workers(home).values()) != {0}
        assert rec.outputs["fleet_status"].startswith("running")
