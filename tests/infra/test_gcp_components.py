"""GCP component behaviour, read off what the program declares under mocks."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from pathlib import Path

import pytest
import yaml

from ftfleet.cli import main
from ftfleet.infra import policies, stackfile
from ftfleet.infra.gcp import boot, network
from tests.infra.conftest import recording, res_view

C = "gcp:compute/"
TEMPLATE = f"{C}regionInstanceTemplate:RegionInstanceTemplate"
MIG = f"{C}regionInstanceGroupManager:RegionInstanceGroupManager"
FIREWALL = f"{C}firewall:Firewall"
BUCKET = "gcp:storage/bucket:Bucket"


def one(rec, type_token, suffix=""):
    found = [r for r in rec.of_type(type_token) if r.name.endswith(suffix)]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


# --- Network --------------------------------------------------------------------------


def test_network_is_one_custom_subnet_with_private_google_access_and_jumbo_frames():
    rec = recording("gcp-dev")
    vpc = one(rec, f"{C}network:Network")
    assert vpc.inputs["autoCreateSubnetworks"] is False and vpc.inputs["mtu"] == network.MTU
    subnet = one(rec, f"{C}subnetwork:Subnetwork")
    assert subnet.inputs["region"] == "us-central1" and subnet.inputs["privateIpGoogleAccess"] is True
    assert subnet.inputs["ipCidrRange"] == "10.40.0.0/20"
    nat = one(rec, f"{C}routerNat:RouterNat")
    assert nat.inputs["subnetworks"][0]["name"] == subnet.id


def test_firewalls_admit_the_cluster_the_health_checkers_and_the_file_system_only():
    rec = recording("gcp-dev")
    rules = {r.name.rsplit("-net-", 1)[1]: r.inputs for r in rec.of_type(FIREWALL)}
    assert set(rules) == {"intra-cluster", "health-checks", "file-system"}
    tag = "ftfleet-gcp-dev-node"
    assert all(rule["targetTags"] == [tag] for rule in rules.values())
    assert rules["intra-cluster"]["sourceTags"] == [tag] and "sourceRanges" not in rules["intra-cluster"]
    assert rules["health-checks"]["sourceRanges"] == list(network.HEALTH_CHECK_RANGES)
    assert rules["health-checks"]["allows"] == [{"protocol": "tcp", "ports": [str(boot.HEALTH_PORT)]}]
    assert rules["file-system"]["sourceRanges"] == ["10.40.240.0/20"]
    assert rules["file-system"]["allows"] == [{"protocol": "tcp", "ports": ["988"]}]


def test_parallelstore_opens_all_tcp_from_its_range_and_takes_its_addresses_from_it(gcp_variant):
    rec = gcp_variant(gcpStorageKind="parallelstore", parallelstoreCapacityGiB=16000)
    rule = one(rec, FIREWALL, "-file-system")
    assert rule.inputs["allows"] == [{"protocol": "tcp"}]
    store = one(rec, "gcp:parallelstore/instance:Instance")
    assert store.inputs["capacityGib"] == "16000" and store.inputs["deploymentType"] == "SCRATCH"
    assert store.inputs["fileStripeLevel"] == "FILE_STRIPE_LEVEL_MAX"
    assert store.inputs["directoryStripeLevel"] == "DIRECTORY_STRIPE_LEVEL_BALANCED"
    vpc = one(rec, f"{C}network:Network")
    assert store.inputs["network"] == vpc.outputs["name"]
    assert store.inputs["reservedIpRange"] == one(rec, f"{C}globalAddress:GlobalAddress").outputs["name"]
    assert not rec.of_type("gcp:lustre/instance:Instance")
    template = one(rec, TEMPLATE, "-workers")
    startup = template.inputs["metadata"]["startup-script"]
    assert "STORAGE_KIND=parallelstore" in startup
    assert f"MOUNT_SOURCE={','.join(store.outputs['accessPoints'])}" in startup


def test_the_file_system_waits_for_private_services_access_over_a_range_inside_the_vpc_cidr():
    rec = recording("gcp-prod")
    psa = one(rec, f"{C}globalAddress:GlobalAddress")
    assert psa.inputs["purpose"] == "VPC_PEERING" and psa.inputs["prefixLength"] <= 23
    cidr = ipaddress.ip_network(f"{psa.inputs['address']}/{psa.inputs['prefixLength']}")
    assert cidr.subnet_of(ipaddress.ip_network("10.40.0.0/16"))
    assert not cidr.overlaps(ipaddress.ip_network("10.40.0.0/20"))
    peering = one(rec, "gcp:servicenetworking/connection:Connection")
    assert peering.inputs["reservedPeeringRanges"] == [psa.outputs["name"]]
    lustre = one(rec, "gcp:lustre/instance:Instance")
    assert peering.urn in lustre.dependencies
    assert lustre.inputs["network"] == one(rec, f"{C}network:Network").id
    assert lustre.inputs["location"] == "us-central1-a"
    assert (lustre.inputs["capacityGib"], lustre.inputs["perUnitStorageThroughput"]) == ("36000", "500")


# --- Fleet ----------------------------------------------------------------------------


def test_spot_workers_never_restart_are_deleted_on_preemption_and_leave_the_beta_notice_off():
    rec = recording("gcp-dev")
    worker = one(rec, TEMPLATE, "-workers")
    assert worker.inputs["scheduling"] == {
        "provisioningModel": "SPOT",
        "preemptible": True,
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
        "instanceTerminationAction": "DELETE",
    }
    coordinator = one(rec, TEMPLATE, "-coordinator")
    assert coordinator.inputs["scheduling"]["provisioningModel"] == "STANDARD"
    assert coordinator.inputs["scheduling"]["preemptible"] is False


def test_an_extended_notice_is_the_users_choice_and_the_advisory_policy_names_the_beta_field(gcp_variant):
    rec = gcp_variant(gcpPreemptionNoticeSeconds=90)
    worker = one(rec, TEMPLATE, "-workers")
    assert worker.inputs["scheduling"]["preemptionNoticeDuration"] == {"seconds": 90}
    found = [(p, n) for p, n, _ in policies.evaluate(res_view(rec)) if p == "gcp-beta-preemption-notice"]
    assert found == [("gcp-beta-preemption-notice", worker.name)]
    assert "FTFLEET_PREEMPTION_NOTICE_S=120" in worker.inputs["metadata"]["startup-script"]


def test_templates_use_gvnic_no_external_address_the_node_account_and_one_pinned_image():
    rec = recording("gcp-prod")
    account = one(rec, "gcp:serviceaccount/account:Account", "-nodes-sa")
    images = set()
    for t in rec.of_type(TEMPLATE):
        nic = t.inputs["networkInterfaces"][0]
        assert nic["nicType"] == "GVNIC" and "accessConfigs" not in nic
        assert t.inputs["serviceAccount"]["email"] == account.outputs["email"]
        assert t.inputs["tags"] == ["ftfleet-gcp-prod-node"]
        assert t.inputs["metadata"]["block-project-ssh-keys"] == "TRUE"
        assert "guestAccelerators" not in t.inputs  # A2 Ultra brings its own A100s
        images.add(t.inputs["disks"][0]["sourceImage"])
    # The pinned image, by name: nothing is resolved, so the next `pulumi up` boots the same.
    assert images == {
        "projects/ubuntu-os-accelerator-images/global/images/ubuntu-accelerator-2204-amd64-with-nvidia-580-v20260825"
    }
    assert rec.outputs["node_image"] == images.pop()
    assert not [i for i in rec.invokes if i[0] == "gcp:compute/getImage:getImage"]


def test_the_image_changes_only_when_the_stack_names_another(gcp_variant):
    first, again = gcp_variant(), gcp_variant()
    other = gcp_variant(gcpImage="ubuntu-accelerator-2204-amd64-with-nvidia-580-v20261101")

    def template_inputs(rec):
        return {t.name: t.inputs for t in rec.of_type(TEMPLATE)}

    # Two runs of one stack declare identical templates: nothing to replace, nothing rolls.
    assert template_inputs(first) == template_inputs(again)
    changed = template_inputs(other)
    assert {t["disks"][0]["sourceImage"].rsplit("/", 1)[1] for t in changed.values()} == {
        "ubuntu-accelerator-2204-amd64-with-nvidia-580-v20261101"
    }


def test_groups_take_a_new_template_only_on_vms_recreated_for_other_reasons():
    for g in recording("gcp-prod").of_type(MIG):
        assert g.inputs["updatePolicy"]["type"] == "OPPORTUNISTIC"
        assert g.inputs["instanceLifecyclePolicy"]["forceUpdateOnRepair"] == "YES"


@pytest.mark.parametrize(
    "type_token, change, policy",
    [
        (
            TEMPLATE,
            lambda r: r.props["disks"][0].update(sourceImage="projects/p/global/images/family/f"),
            "gcp-node-image-pinned",
        ),
        (MIG, lambda r: r.props["updatePolicy"].update(type="PROACTIVE"), "gcp-groups-update-opportunistically"),
    ],
)
def test_a_family_image_or_a_proactive_group_is_caught(type_token, change, policy):
    view = copy.deepcopy(res_view(recording("gcp-dev")))
    target = next(r for r in view if r.type == type_token)
    change(target)
    assert [(p, n) for p, n, _ in policies.evaluate(view) if p == policy] == [(policy, target.name)]


def test_the_coordinator_keeps_its_reserved_address_through_every_replacement():
    rec = recording("gcp-prod")
    address = one(rec, f"{C}address:Address")
    assert address.inputs["addressType"] == "INTERNAL" and address.inputs["address"] == "10.40.0.10"
    group = one(rec, MIG, "-coordinator")
    assert group.inputs["distributionPolicyZones"] == ["us-central1-a"]
    assert group.inputs["statefulInternalIps"] == [{"interfaceName": "nic0", "deleteRule": "NEVER"}]
    policy = group.inputs["updatePolicy"]
    assert (policy["replacementMethod"], policy["maxSurgeFixed"]) == ("RECREATE", 0)
    config = one(rec, f"{C}regionPerInstanceConfig:RegionPerInstanceConfig")
    assert config.inputs["regionInstanceGroupManager"] == group.outputs["name"]
    ip = config.inputs["preservedState"]["internalIps"][0]
    assert ip == {"interfaceName": "nic0", "autoDelete": "NEVER", "ipAddress": {"address": address.outputs["selfLink"]}}
    for t in rec.of_type(TEMPLATE):
        assert "FTFLEET_RDZV_ENDPOINT=10.40.0.10:29400" in t.inputs["metadata"]["startup-script"]
    assert rec.outputs["coordinator_address"].startswith("10.40.0.10:29400")


def test_the_coordinator_group_is_exactly_its_one_per_instance_config():
    rec = recording("gcp-prod")
    group = one(rec, MIG, "-coordinator")
    # The config creates the one VM and raises the size to 1; the group adds none of its own.
    assert group.inputs["targetSize"] == 0 and group.ignore_changes == ["targetSize"]
    (config,) = rec.of_type(f"{C}regionPerInstanceConfig:RegionPerInstanceConfig")
    assert group.urn in config.deps("regionInstanceGroupManager")
    assert config.inputs["name"] == "ftfleet-gcp-prod-coordinator" and config.inputs["removeInstanceOnDestroy"] is True
    assert rec.outputs["coordinator_group"] == group.outputs["name"]


def test_a_stateful_group_that_would_add_or_resize_vms_beside_its_config_is_caught():
    view = copy.deepcopy(res_view(recording("gcp-dev")))
    group = next(r for r in view if r.type == MIG and r.name.endswith("-coordinator"))
    group.props["targetSize"] = 1
    group.ignore_changes = []
    found = [(n, m) for p, n, m in policies.evaluate(view) if p == "gcp-stateful-group-is-its-configs"]
    assert [n for n, _ in found] == [group.name, group.name]
    assert "declare 0" in found[0][1] and "ignore changes to targetSize" in found[1][1]
    for worker in (r for r in view if r.type == MIG and not r.name.endswith("-coordinator")):
        assert worker.ignore_changes == []  # a group without configs keeps its declared size


def test_every_group_auto_heals_and_replaces_on_update():
    rec = recording("gcp-prod")
    check = one(rec, f"{C}regionHealthCheck:RegionHealthCheck")
    # The node health agent, not the trainer: a node between runs is healthy.
    assert check.inputs["httpHealthCheck"] == {"port": boot.HEALTH_PORT, "requestPath": boot.HEALTH_PATH}
    assert "tcpHealthCheck" not in check.inputs and boot.HEALTH_PORT != boot.METRICS_PORT
    groups = rec.of_type(MIG)
    assert len(groups) == 3
    for g in groups:
        assert g.inputs["autoHealingPolicies"]["healthCheck"] == check.id
        assert g.inputs["updatePolicy"]["minimalAction"] == "REPLACE"
        assert g.inputs["updatePolicy"]["instanceRedistributionType"] == "NONE"
        assert g.inputs["waitForInstances"] is False


def test_prod_keeps_a2_ultra_nodes_in_one_zone_with_an_on_demand_base_and_spot_for_the_rest():
    rec = recording("gcp-prod")
    spot = one(rec, MIG, "-workers")
    on_demand = one(rec, MIG, "-workers-ondemand")
    assert (spot.inputs["targetSize"], on_demand.inputs["targetSize"]) == (14, 2)
    for g in (spot, on_demand):
        assert g.inputs["distributionPolicyZones"] == ["us-central1-a"]
        assert g.inputs["distributionPolicyTargetShape"] == "ANY_SINGLE_ZONE"
    assert {t.inputs["machineType"] for t in rec.of_type(TEMPLATE)} == {"a2-ultragpu-8g"}
    standard = one(rec, TEMPLATE, "-workers-ondemand")
    assert standard.inputs["scheduling"]["provisioningModel"] == "STANDARD"


def test_a_stack_with_a3_nodes_is_refused_in_one_line_until_their_gpu_networking_is_declared(tmp_path, capsys):
    config = yaml.safe_load((stackfile.STACKS_DIR / "Pulumi.gcp-prod.yaml").read_text())["config"]
    config.update(
        {"ftfleet:coordinatorInstanceType": "a3-highgpu-8g", "ftfleet:workerInstanceTypes": ["a3-highgpu-8g"]}
    )
    path = tmp_path / "Pulumi.a3.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a3-highgpu-8g" in err and "GPUDirect-TCPX/TCPXO" in err


def test_an_a3_template_with_one_nic_is_caught():
    view = copy.deepcopy(res_view(recording("gcp-dev")))
    template = next(r for r in view if r.type == TEMPLATE)
    template.props["machineType"] = "a3-highgpu-8g"
    found = [(n, m) for p, n, m in policies.evaluate(view) if p == "gcp-a3-gpu-nics"]
    assert found == [
        (template.name, "a3-highgpu-8g has 1 NIC(s); GPUDirect needs 5, one per GPU network and the host's")
    ]
    template.props["networkInterfaces"] = template.props["networkInterfaces"] * 5
    assert not [p for p, _, _ in policies.evaluate(view) if p == "gcp-a3-gpu-nics"]


def test_spot_workers_may_spread_over_zones_when_their_gpus_do_not_need_one(gcp_variant):
    rec = gcp_variant(gcpSingleZone=False)
    workers = one(rec, MIG, "-workers")
    assert workers.inputs["distributionPolicyZones"] == ["us-central1-a", "us-central1-b"]
    assert workers.inputs["distributionPolicyTargetShape"] == "BALANCED"
    assert workers.inputs["updatePolicy"]["maxSurgeFixed"] == 2  # at least the number of zones
    assert one(rec, MIG, "-coordinator").inputs["distributionPolicyZones"] == ["us-central1-a"]


def test_n1_nodes_attach_their_guest_gpus(gcp_variant):
    rec = gcp_variant(
        workerInstanceTypes=["n1-standard-16"],
        coordinatorInstanceType="n1-standard-16",
        gcpGpuType="nvidia-tesla-t4",
        gcpGpuCount=4,
    )
    for t in rec.of_type(TEMPLATE):
        assert t.inputs["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 4}]
        assert "FTFLEET_NPROC_PER_NODE=4" in t.inputs["metadata"]["startup-script"]


def test_standard_workers_form_one_on_demand_group(gcp_variant):
    rec = gcp_variant(gcpWorkerProvisioningModel="STANDARD", gcpPreemptionNoticeSeconds=0, gcpAutomaticRestart=True)
    assert sorted(g.name.rsplit("-", 1)[1] for g in rec.of_type(MIG)) == ["coordinator", "workers"]
    workers = one(rec, TEMPLATE, "-workers")
    assert workers.inputs["scheduling"]["provisioningModel"] == "STANDARD"
    assert workers.inputs["scheduling"]["automaticRestart"] is True
    assert one(rec, MIG, "-workers").inputs["targetSize"] == 2


# --- Buckets, registry, identity ----------------------------------------------------------


def test_dev_bucket_is_a_configurable_dual_region_and_prod_the_predefined_nam4():
    dev = one(recording("gcp-dev"), BUCKET, "-ckpt-bucket").inputs
    assert dev["location"] == "US" and dev["customPlacementConfig"] == {"dataLocations": ["US-CENTRAL1", "US-EAST4"]}
    prod = one(recording("gcp-prod"), BUCKET, "-ckpt-bucket").inputs
    assert prod["location"] == "NAM4" and "customPlacementConfig" not in prod
    for b in (dev, prod):
        assert b["rpo"] == "ASYNC_TURBO" and b["versioning"] == {"enabled": True}
        assert b["publicAccessPrevention"] == "enforced" and b["uniformBucketLevelAccess"] is True
        assert b["forceDestroy"] is False
    assert prod["softDeletePolicy"] == {"retentionDurationSeconds": 14 * 86400}


def test_lifecycle_ages_checkpoints_but_never_the_pinned_prefix():
    rules = one(recording("gcp-prod"), BUCKET, "-ckpt-bucket").inputs["lifecycleRules"]
    actions = [(r["action"]["type"], r["action"].get("storageClass")) for r in rules]
    assert actions == [
        ("AbortIncompleteMultipartUpload", None),
        ("SetStorageClass", "NEARLINE"),
        ("SetStorageClass", "COLDLINE"),
        ("Delete", None),
        ("Delete", None),
    ]
    assert rules[0]["condition"] == {"age": 2}
    assert [r["condition"].get("age") for r in rules[1:3]] == [30, 90]
    assert rules[3]["condition"] == {
        "daysSinceNoncurrentTime": 30,
        "matchesPrefixes": ["checkpoints/"],
        "withState": "ARCHIVED",
    }
    for rule in rules[1:4]:
        assert rule["condition"]["matchesPrefixes"] == ["checkpoints/"]
    # The run lease's old versions (it is rewritten every quarter of its TTL).
    assert rules[4]["condition"] == {
        "daysSinceNoncurrentTime": 1,
        "matchesPrefixes": ["ftfleet-leases/"],
        "withState": "ARCHIVED",
    }
    assert "pinned/" not in json.dumps(rules)


def test_dev_expires_old_checkpoints_and_turbo_replication_follows_config(gcp_variant):
    rules = one(recording("gcp-dev"), BUCKET, "-ckpt-bucket").inputs["lifecycleRules"]
    assert rules[-1] == {
        "action": {"type": "Delete"},
        "condition": {"age": 120, "matchesPrefixes": ["checkpoints/"], "withState": "LIVE"},
    }
    assert one(gcp_variant(gcsTurboReplication=False), BUCKET, "-ckpt-bucket").inputs["rpo"] == "DEFAULT"


def test_prod_bucket_is_encrypted_with_a_key_the_storage_agent_may_use_before_the_bucket_exists():
    rec = recording("gcp-prod")
    key = one(rec, "gcp:kms/cryptoKey:CryptoKey")
    ring = one(rec, "gcp:kms/keyRing:KeyRing")
    assert ring.inputs["location"] == "nam4" and key.inputs["rotationPeriod"] == "7776000s"
    bucket = one(rec, BUCKET, "-ckpt-bucket")
    assert bucket.inputs["encryption"] == {"defaultKmsKeyName": key.id}
    grant = one(rec, "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember")
    assert grant.inputs["cryptoKeyId"] == key.id
    assert grant.inputs["member"].endswith("@gs-project-accounts.iam.gserviceaccount.com")
    assert grant.urn in bucket.dependencies
    assert not recording("gcp-dev").of_type("gcp:kms/cryptoKey:CryptoKey")


def test_registry_keeps_releases_immutable_and_cleans_untagged_images():
    repo = one(recording("gcp-dev"), "gcp:artifactregistry/repository:Repository").inputs
    assert repo["format"] == "DOCKER" and repo["dockerConfig"] == {"immutableTags": True}
    policies = {p["id"]: p for p in repo["cleanupPolicies"]}
    assert policies["delete-untagged"]["condition"] == {"tagState": "UNTAGGED", "olderThan": "1209600s"}
    assert policies["keep-releases"] == {"id": "keep-releases", "action": "KEEP", "condition": {"tagState": "TAGGED"}}
    assert repo["cleanupPolicyDryRun"] is False


def test_the_node_account_holds_only_what_nodes_need():
    rec = recording("gcp-prod")
    email = one(rec, "gcp:serviceaccount/account:Account", "-nodes-sa").outputs["email"]
    bucket = one(rec, BUCKET, "-ckpt-bucket").outputs["name"]
    grants = {
        (r.type.split(":")[1], r.inputs["role"])
        for r in rec.resources
        if "member" in r.inputs and email in r.inputs["member"]
    }
    assert grants == {
        ("storage/bucketIAMMember", "roles/storage.objectAdmin"),
        ("artifactregistry/repositoryIamMember", "roles/artifactregistry.reader"),
        ("projects/iAMMember", "roles/logging.logWriter"),
        ("projects/iAMMember", "roles/monitoring.metricWriter"),
    }
    assert one(rec, "gcp:storage/bucketIAMMember:BucketIAMMember", "-nodes-checkpoints").inputs["bucket"] == bucket


def test_every_resource_carries_the_stack_labels_through_the_provider():
    rec = recording("gcp-prod")
    provider = one(rec, "pulumi:providers:gcp")
    assert json.loads(provider.inputs["defaultLabels"]) == {
        "ftfleet-stack": "gcp-prod",
        "ftfleet-run": "llm-prod",
        "managed-by": "pulumi",
        "team": "ml-platform",
        "env": "prod",
        "cost-center": "research",
    }
    assert provider.inputs["region"] == "us-central1"
    assert all(r.provider == provider.urn for r in rec.resources if r.custom and r.type.startswith("gcp:"))


# --- The plan -------------------------------------------------------------------------


def test_plan_table_lists_every_gcp_resource_and_the_estimate(capsys):
    assert main(["plan", "gcp-dev"]) == 0
    out = capsys.readouterr().out
    for r in recording("gcp-dev").resources:
        if r.custom and not r.type.startswith("pulumi:providers:"):
            assert r.name in out
    assert "ESTIMATE" in out and "/hour with Spot" in out and "Managed Lustre (9,000 GiB at 1000 MB/s/TiB)" in out
    assert "per TiB written" in out


def test_plan_json_of_gcp_prod_has_the_documented_shape(capsys):
    assert main(["plan", "gcp-prod", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"stack", "resources", "outputs", "estimate", "functions"}
    fns = {f["function"]: f for f in doc["functions"]}
    assert set(fns) == {
        "gcp_preemption",
        "gcp_storage_drift",
        "gcp_replication_watch",
        "gcp_retention_sweep",
        "gcp_capacity_watch",
    }
    for f in fns.values():
        assert f["runtime"] == "python313" and f["timeout"] > 0 and f["retries"] == 4
        assert f["dead_letter_queue"].endswith("-dead-letters") and len(f["triggers"]) == 1
    assert fns["gcp_replication_watch"]["triggers"] == [{"schedule": "*/5 * * * *"}]
    assert fns["gcp_retention_sweep"]["triggers"] == [{"schedule": "0 * * * *"}]
    assert "compute.instances.preempted" in fns["gcp_preemption"]["triggers"][0]["filter"]
    lustre = next(r for r in doc["resources"] if r["type"] == "gcp:lustre/instance:Instance")
    assert lustre["inputs"]["capacityGib"] == "36000" and lustre["parent"].endswith("-fs")
    est = doc["estimate"]
    assert "ESTIMATE" in est["label"] and est["prices_as_of"] and est["cloud"] == "gcp"
    assert 0 < est["fleet_usd_per_hour"]["with_spot"] < est["fleet_usd_per_hour"]["all_on_demand"]
    assert est["nodes"] == {
        "coordinator_on_demand": 1,
        "workers_on_demand": 2,
        "workers_spot": 14,
        "workers_spare": 0,
        "gpus": 136,
    }
    assert est["replication_usd_per_tib_written"] > 0
    assert doc["outputs"]["checkpoint_uri"].startswith("gs://") and doc["outputs"]["checkpoint_uri"].endswith(
        "/checkpoints/llm-prod"
    )


def test_spare_nodes_grow_the_main_worker_groups_target_size(gcp_variant):
    plain, spared = gcp_variant(), gcp_variant(spareNodes=2)
    assert one(spared, MIG, "-workers").inputs["targetSize"] == one(plain, MIG, "-workers").inputs["targetSize"] + 2
    assert one(spared, MIG, "-coordinator").inputs["targetSize"] == 0


def test_a_health_check_whose_port_the_firewall_does_not_open_to_googles_probers_is_caught():
    view = copy.deepcopy(res_view(recording("gcp-dev")))
    check = next(r for r in view if r.type == f"{C}regionHealthCheck:RegionHealthCheck")
    check.props["httpHealthCheck"]["port"] = boot.METRICS_PORT  # probing some other port
    found = [(n, m) for p, n, m in policies.evaluate(view) if p == "gcp-health-checks-reachable"]
    assert [n for n, _ in found] == [check.name, check.name]
    assert "35.191.0.0/16" in found[0][1] and "130.211.0.0/22" in found[1][1]


def test_every_stack_output_the_gcp_runbook_reads_is_one_the_program_exports():
    text = (Path(__file__).parents[2] / "docs" / "VERIFY-ON-GCP.md").read_text()
    used = set(re.findall(r"pulumi stack output (\w+)", text))
    assert {"coordinator_group", "worker_group", "checkpoint_bucket", "trainer_image", "node_image"} <= used
    assert used <= set(recording("gcp-dev").outputs)
