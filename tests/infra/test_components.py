"""Component behaviour, read off what the program declares under mocks."""

from __future__ import annotations

import base64
import json

from ftfleet import contract
from ftfleet.infra import bootscript
from tests.infra.conftest import recording


def one(rec, type_token, suffix=""):
    found = [r for r in rec.of_type(type_token) if r.name.endswith(suffix)]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def test_network_creates_private_subnets_per_zone_and_an_s3_gateway_endpoint():
    rec = recording("aws-dev")
    private = [r for r in rec.of_type("aws:ec2/subnet:Subnet") if "-private-" in r.name]
    assert sorted(r.inputs["availabilityZone"] for r in private) == ["us-east-1a", "us-east-1b"]
    assert all(r.inputs["mapPublicIpOnLaunch"] is False for r in private)
    endpoint = one(rec, "aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["serviceName"] == "com.amazonaws.us-east-1.s3"


def test_network_adopts_existing_subnets_without_creating_a_vpc(variant):
    rec = variant(existingVpcId="vpc-0abc", existingSubnetIds=["subnet-a", "subnet-b"])
    assert not rec.of_type("aws:ec2/vpc:Vpc") and not rec.of_type("aws:ec2/subnet:Subnet")
    group = one(rec, "aws:autoscaling/group:Group", "-workers")
    assert group.inputs["vpcZoneIdentifiers"] == ["subnet-a", "subnet-b"]
    assert one(rec, "aws:fsx/lustreFileSystem:LustreFileSystem").inputs["subnetIds"] == "subnet-a"


def test_lustre_ports_are_open_only_from_the_cluster_and_the_file_servers():
    rec = recording("aws-dev")
    sgs = {r.id: r.name for r in rec.of_type("aws:ec2/securityGroup:SecurityGroup")}
    rules = [r for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule") if "-fsx-" in r.name]
    ports = {(r.inputs["fromPort"], r.inputs["toPort"]) for r in rules}
    assert ports == {(988, 988), (1018, 1023)}
    for r in rules:
        assert "cidrIpv4" not in r.inputs
        assert sgs[r.inputs["referencedSecurityGroupId"]].endswith(("-cluster", "-fsx"))
    efa = one(rec, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "cluster-self-in")
    assert efa.inputs["ipProtocol"] == "-1"
    assert efa.inputs["referencedSecurityGroupId"] == efa.inputs["securityGroupId"]


def test_fsx_exports_new_and_changed_files_but_never_deletions():
    rec = recording("aws-prod")
    fs = one(rec, "aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fs.inputs["deploymentType"] == "PERSISTENT_2"
    assert fs.inputs["kmsKeyId"].startswith("arn:aws:kms:us-east-1")
    dra = one(rec, "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert sorted(dra.inputs["s3"]["autoExportPolicy"]["events"]) == ["CHANGED", "NEW"]
    assert dra.inputs["deleteDataInFilesystem"] is False
    primary = rec.outputs["primary_bucket"]
    assert dra.inputs["dataRepositoryPath"] == f"s3://{primary}/checkpoints/"


def test_lifecycle_ages_checkpoints_but_never_the_pinned_prefix():
    rec = recording("aws-prod")
    lifecycles = rec.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    checkpoint_buckets = [lc for lc in lifecycles if "-ckpt-" in lc.name]
    assert len(checkpoint_buckets) == 2
    for lc in checkpoint_buckets:
        rules = {r["id"]: r for r in lc.inputs["rules"]}
        assert rules["abort-incomplete-multipart-uploads"]["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 2
        age = rules["checkpoints-age"]
        assert age["filter"]["prefix"] == "checkpoints/"
        assert [t["storageClass"] for t in age["transitions"]] == ["STANDARD_IA", "GLACIER_IR"]
        assert age["noncurrentVersionExpiration"]["noncurrentDays"] == 30
        lease = rules["lease-versions"]  # the run lease, rewritten every quarter of its TTL
        assert lease["filter"]["prefix"] == "ftfleet-leases/"
        assert lease["noncurrentVersionExpiration"]["noncurrentDays"] == 1
        for rule in rules.values():
            prefix = rule["filter"]["prefix"]
            if rule.get("expiration") or rule.get("transitions") or rule.get("noncurrentVersionExpiration"):
                assert prefix and not "pinned/".startswith(prefix)


def test_replication_uses_rtc_metrics_delete_markers_and_the_replica_key():
    rec = recording("aws-prod")
    rule = one(rec, "aws:s3/bucketReplicationConfig:BucketReplicationConfig").inputs["rules"][0]
    dest = rule["destination"]
    assert dest["replicationTime"] == {"status": "Enabled", "time": {"minutes": 15}}
    assert dest["metrics"]["status"] == "Enabled"
    assert rule["deleteMarkerReplication"]["status"] == "Enabled"
    assert dest["encryptionConfiguration"]["replicaKmsKeyId"].startswith("arn:aws:kms:us-west-2")


def test_replication_time_control_follows_config(variant):
    rec = variant(replicationTimeControl=False)
    dest = rec.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")[0].inputs["rules"][0]["destination"]
    assert "replicationTime" not in dest and dest["metrics"]["status"] == "Enabled"


def test_no_bucket_the_fsx_export_writes_is_object_locked():
    for stack in ("aws-dev", "aws-prod"):
        rec = recording(stack)
        assert not rec.of_type("aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration")
        assert all(not b.inputs.get("objectLockEnabled") for b in rec.of_type("aws:s3/bucket:Bucket"))


def test_replication_role_is_least_privilege():
    rec = recording("aws-dev")
    policy = json.loads(one(rec, "aws:iam/rolePolicy:RolePolicy", "-ckpt-replication").inputs["policy"])
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert all(not a.endswith("*") for a in actions)
    assert "s3:ReplicateObject" in actions and "kms:Decrypt" in actions


def test_node_role_reaches_only_the_run_checkpoint_prefix():
    rec = recording("aws-prod")
    policy = json.loads(one(rec, "aws:iam/rolePolicy:RolePolicy", "-worker-checkpoints").inputs["policy"])
    statements = {s["Sid"]: s for s in policy["Statement"]}
    for resource in statements["ReadWriteCheckpoints"]["Resource"]:
        assert resource.endswith("/checkpoints/llm-prod/*")
    # The run lease: its one key, readable, writable (conditionally: S3 has no separate
    # action) and listable, so that a missing lease reads as missing.
    primary = statements["ReadWriteCheckpoints"]["Resource"][0].split("/")[0]  # the bucket's ARN
    assert statements["HoldRunLease"]["Resource"] == [f"{primary}/ftfleet-leases/llm-prod.json"]
    assert statements["HoldRunLease"]["Action"] == ["s3:GetObject", "s3:PutObject"]
    listed = statements["FindRunLease"]
    assert listed["Action"] == ["s3:ListBucket"] and listed["Resource"] == [primary]
    assert listed["Condition"] == {"StringEquals": {"s3:prefix": ["ftfleet-leases/llm-prod.json"]}}
    assert statements["PutTrainerMetrics"]["Condition"]["StringEquals"]["cloudwatch:namespace"] == "ftfleet"
    assert not rec.of_type("aws:iam/rolePolicy:RolePolicy") or all(
        "route53" not in r.inputs["policy"]
        for r in rec.of_type("aws:iam/rolePolicy:RolePolicy")
        if "-worker-" in r.name
    )


def test_coordinator_is_one_on_demand_node_and_workers_mix_spot_above_the_base():
    rec = recording("aws-prod")
    coord = one(rec, "aws:autoscaling/group:Group", "-coordinator")
    assert (coord.inputs["minSize"], coord.inputs["maxSize"]) == (1, 1)
    assert "mixedInstancesPolicy" not in coord.inputs
    workers = one(rec, "aws:autoscaling/group:Group", "-workers")
    dist = workers.inputs["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist == {
        "onDemandBaseCapacity": 2,
        "onDemandPercentageAboveBaseCapacity": 10,
        "onDemandAllocationStrategy": "prioritized",
        "spotAllocationStrategy": "price-capacity-optimized",
    }
    assert workers.inputs["capacityRebalance"] is True
    assert workers.inputs["instanceRefresh"]["strategy"] == "Rolling"
    # A pinned version (not $Latest) so that an instance refresh starts on change.
    spec = workers.inputs["mixedInstancesPolicy"]["launchTemplate"]["launchTemplateSpecification"]
    assert spec["version"] == "1"


def test_every_group_holds_terminating_nodes_for_the_emergency_checkpoint():
    rec = recording("aws-prod")
    groups = {r.inputs.get("name") or r.outputs["name"] for r in rec.of_type("aws:autoscaling/group:Group")}
    hooks = rec.of_type("aws:autoscaling/lifecycleHook:LifecycleHook")
    assert {h.inputs["autoscalingGroupName"] for h in hooks} == groups
    for h in hooks:
        assert h.inputs["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
        assert h.inputs["heartbeatTimeout"] >= 120  # AWS's spot notice is 2 minutes


def test_launch_templates_require_imdsv2_encrypt_root_and_keep_credentials_one_hop_away():
    for lt in recording("aws-dev").of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        meta = lt.inputs["metadataOptions"]
        # The trainer container uses the host's network, so one hop reaches IMDS.
        assert meta["httpTokens"] == "required" and meta["httpPutResponseHopLimit"] == 1
        ebs = lt.inputs["blockDeviceMappings"][0]["ebs"]
        assert ebs["volumeType"] == "gp3" and ebs["encrypted"] == "true"


def test_placement_group_pins_the_fleet_to_the_fsx_zone():
    rec = recording("aws-prod")
    pg = one(rec, "aws:ec2/placementGroup:PlacementGroup")
    fs_subnet = one(rec, "aws:fsx/lustreFileSystem:LustreFileSystem").inputs["subnetIds"]
    for group in rec.of_type("aws:autoscaling/group:Group"):
        assert group.inputs["placementGroup"] == pg.id
        assert group.inputs["vpcZoneIdentifiers"] == [fs_subnet]


def test_user_data_gives_the_trainer_the_whole_contract():
    rec = recording("aws-prod")
    for lt in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        values = bootscript.rendered_values(base64.b64decode(lt.inputs["userData"]).decode())
        env = dict(line.split("=", 1) for line in values["TRAINER_ENV"].splitlines())
        node_env = {"FTFLEET_NODE_ID": "i-0123456789abcdef0", "FTFLEET_RUN_DIR": "/fsx/runs/llm-prod/i-0"}
        contract.check_env({**env, **node_env})  # raises if anything required is missing or invalid
        assert set(env) | set(node_env) <= contract.ENV_NAMES
        assert env["FTFLEET_CKPT_URI"] == rec.outputs["checkpoint_uri"]
        bucket = rec.outputs["checkpoint_uri"].removeprefix("s3://").split("/")[0]
        assert env["FTFLEET_LEASE_URI"] == f"s3://{bucket}/ftfleet-leases/llm-prod.json"
        assert env["FTFLEET_LEASE_HOLDER"] == "aws-prod/us-east-1"
        assert env["FTFLEET_CKPT_DIR"] == values["CKPT_DIR"] == "/fsx/checkpoints/llm-prod"
        assert values["RUN_ROOT"] == "/fsx/runs/llm-prod"
        # The in-process launcher (the default): 16 workers and the coordinator train, no spare node.
        assert env["FTFLEET_NPROC_PER_NODE"] == "8" and env["FTFLEET_NNODES"] == "17"
        assert env["FTFLEET_LAUNCHER"] == "inprocess" and env["FTFLEET_SPARE_NODES"] == "0"
        assert values["LAUNCHER"] == "inprocess"
        assert values["EFA_ENABLED"] == "true"
        assert values["NODE_FINAL_EXITS"].split() == [str(c) for c in contract.NODE_FINAL_EXITS]
        assert values["TRAINER_UID"] == str(contract.TRAINER_UID)
        assert values["ROLE"] == lt.inputs["tagSpecifications"][0]["tags"]["ftfleet:role"]


def test_the_image_entrypoint_reads_only_contract_variables():
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "trainer" / "docker-entrypoint").read_text()
    names = set(re.findall(r"\$\{?(FTFLEET_\w+)", script))
    assert {"FTFLEET_NNODES", "FTFLEET_RDZV_ENDPOINT"} <= names <= contract.ENV_NAMES


def test_registry_is_immutable_and_scans_on_push():
    repo = one(recording("aws-dev"), "aws:ecr/repository:Repository")
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"]["scanOnPush"] is True
