"""Bad GCP stack configuration: one line naming the key and the fix, exit 2, nothing planned."""

from __future__ import annotations

import dataclasses

import pulumi
import pytest
import yaml

from ftfleet.cli import main
from ftfleet.errors import ConfigError
from ftfleet.infra import catalog, offline, reference, settings, stackfile
from ftfleet.infra.gcp import keys, locations

DEV = yaml.safe_load(open(stackfile.STACKS_DIR / "Pulumi.gcp-dev.yaml"))["config"]

BAD = {
    "alert channel not a resource name": (
        {"ftfleet:gcpAlertNotificationChannels": ["ops@example.com"]},
        "ftfleet:gcpAlertNotificationChannels holds 'ops@example.com'; use a channel's resource name, "
        "projects/<project>/notificationChannels/<id>",
    ),
    "lustre capacity below the tier minimum": (
        {"ftfleet:lustreThroughputPerTiB": 500, "ftfleet:lustreCapacityGiB": 9000},
        "ftfleet:lustreCapacityGiB is 9000; the 500 MB/s/TiB tier takes 18,000 to 20,016,000 GiB",
    ),
    "lustre capacity off the tier step": (
        {"ftfleet:lustreCapacityGiB": 10000},
        "ftfleet:lustreCapacityGiB is 10000; the 1000 MB/s/TiB tier takes multiples of 9,000 GiB "
        "(nearest: 9,000 or 18,000)",
    ),
    "lustre capacity above the threshold off the coarse step": (
        {"ftfleet:lustreCapacityGiB": 1_539_000},
        "above 1,530,000 GiB the 1000 MB/s/TiB tier takes multiples of 72,000 GiB",
    ),
    "lustre throughput not a tier": (
        {"ftfleet:lustreThroughputPerTiB": 200},
        "ftfleet:lustreThroughputPerTiB is 200; Managed Lustre tiers are 125, 250, 500, 1000 MB/s per TiB",
    ),
    "parallelstore below 12 TiB": (
        {"ftfleet:gcpStorageKind": "parallelstore", "ftfleet:parallelstoreCapacityGiB": 8000},
        "ftfleet:parallelstoreCapacityGiB is 8000; Parallelstore takes 12,000 to 100,000 GiB",
    ),
    "parallelstore not a 4 TiB step": (
        {"ftfleet:gcpStorageKind": "parallelstore", "ftfleet:parallelstoreCapacityGiB": 14000},
        "in steps of 4,000 GiB",
    ),
    "parallelstore above 100 TiB": (
        {"ftfleet:gcpStorageKind": "parallelstore", "ftfleet:parallelstoreCapacityGiB": 104000},
        "ftfleet:parallelstoreCapacityGiB is 104000",
    ),
    "parallelstore stripe level": (
        {"ftfleet:gcpStorageKind": "parallelstore", "ftfleet:parallelstoreFileStripeLevel": "huge"},
        "ftfleet:parallelstoreFileStripeLevel is 'huge'; use min, balanced or max",
    ),
    "unknown storage kind": (
        {"ftfleet:gcpStorageKind": "filestore"},
        "ftfleet:gcpStorageKind is 'filestore'; use one of: managed-lustre, parallelstore",
    ),
    "unsupported dual-region pair": (
        {"ftfleet:replicaRegion": "europe-west1"},
        "ftfleet:replicaRegion is europe-west1, which forms no Cloud Storage dual-region with us-central1; "
        "regions that pair with us-central1: us-east1, us-east4",
    ),
    "replica equals primary": ({"ftfleet:replicaRegion": "us-central1"}, "ftfleet:replicaRegion equals gcp:region"),
    "replica region GCP does not have": (
        {"ftfleet:replicaRegion": "us-east9"},
        "ftfleet:replicaRegion is 'us-east9', which is not a Compute Engine region",
    ),
    "primary region GCP does not have": (
        {"gcp:region": "us-central9"},
        "gcp:region is 'us-central9', which is not a Compute Engine region; did you mean us-central1?",
    ),
    "zone outside the region": (
        {"ftfleet:availabilityZones": ["us-central1-a", "us-east4-b"]},
        "ftfleet:availabilityZones contains 'us-east4-b', which is not a zone of us-central1",
    ),
    "not a zone name": (
        {"ftfleet:availabilityZones": ["us-central1"]},
        "ftfleet:availabilityZones contains 'us-central1', which is not a zone of us-central1",
    ),
    "guest gpu on a machine type with its own": (
        {"ftfleet:gcpGpuType": "nvidia-tesla-t4", "ftfleet:gcpGpuCount": 1},
        "ftfleet:gcpGpuType is 'nvidia-tesla-t4', but g2-standard-8 comes with its own GPUs (1 x L4)",
    ),
    "gpu an N1 cannot take": (
        {
            "ftfleet:workerInstanceTypes": ["n1-standard-8"],
            "ftfleet:coordinatorInstanceType": "n1-standard-8",
            "ftfleet:gcpGpuType": "nvidia-l4",
            "ftfleet:gcpGpuCount": 1,
        },
        "ftfleet:gcpGpuType is 'nvidia-l4', which n1-standard-8 cannot take",
    ),
    "N1 without a gpu": (
        {"ftfleet:workerInstanceTypes": ["n1-standard-8"], "ftfleet:coordinatorInstanceType": "n1-standard-8"},
        "ftfleet:gcpGpuType is required: n1-standard-8 has no GPUs of its own",
    ),
    "gpu count an N1 cannot take": (
        {
            "ftfleet:workerInstanceTypes": ["n1-standard-8"],
            "ftfleet:coordinatorInstanceType": "n1-standard-8",
            "ftfleet:gcpGpuType": "nvidia-tesla-t4",
            "ftfleet:gcpGpuCount": 3,
        },
        "ftfleet:gcpGpuCount is 3; nvidia-tesla-t4 attaches to N1 in counts of 1, 2, 4",
    ),
    "mixed gpu models": (
        {"ftfleet:workerInstanceTypes": ["g2-standard-8", "a2-highgpu-8g"]},
        "ftfleet:workerInstanceTypes mixes GPU models or counts",
    ),
    "unknown machine type": (
        {"ftfleet:workerInstanceTypes": ["a3-highgpu-9g"]},
        "ftfleet:workerInstanceTypes contains unknown machine type 'a3-highgpu-9g'",
    ),
    "spot template asked to auto-restart": (
        {"ftfleet:gcpAutomaticRestart": True},
        "ftfleet:gcpAutomaticRestart is true, but the worker template is SPOT",
    ),
    "a3 without its GPUDirect networking": (
        {"ftfleet:workerInstanceTypes": ["a3-megagpu-8g"], "ftfleet:coordinatorInstanceType": "a3-megagpu-8g"},
        "ftfleet:workerInstanceTypes contains a3-megagpu-8g, which needs GPUDirect-TCPX/TCPXO",
    ),
    "an a3 coordinator": (
        {"ftfleet:coordinatorInstanceType": "a3-highgpu-8g"},
        "ftfleet:coordinatorInstanceType contains a3-highgpu-8g, which needs GPUDirect-TCPX/TCPXO",
    ),
    "preemption notice too long": (
        {"ftfleet:gcpPreemptionNoticeSeconds": 600},
        "ftfleet:gcpPreemptionNoticeSeconds is 600; it must be at most 120",
    ),
    "preemption notice on standard workers": (
        {"ftfleet:gcpWorkerProvisioningModel": "STANDARD", "ftfleet:gcpPreemptionNoticeSeconds": 90},
        "ftfleet:gcpPreemptionNoticeSeconds applies to Spot workers only",
    ),
    "no node image": (
        {"ftfleet:gcpImage": ""},
        "ftfleet:gcpImage is required: pin the node image by name",
    ),
    "a family as the node image": (
        {"ftfleet:gcpImage": "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator"},
        "no path and no family",
    ),
    "the old family key": (
        {"ftfleet:gcpImageFamily": "ubuntu-accelerator-2204-amd64-with-nvidia-580"},
        "unknown config key ftfleet:gcpImageFamily: did you mean ftfleet:gcpImage",
    ),
    "unknown provisioning model": (
        {"ftfleet:gcpWorkerProvisioningModel": "PREEMPTIBLE"},
        "ftfleet:gcpWorkerProvisioningModel is 'PREEMPTIBLE'; use SPOT or STANDARD",
    ),
    "spares above the group's maximum": (
        {"ftfleet:spareNodes": 99},
        "ftfleet:spareNodes (99) plus workerDesiredSize",
    ),
    "unknown launcher": (
        {"ftfleet:trainerLauncher": "Torchrun"},
        "ftfleet:trainerLauncher is 'Torchrun'; use inprocess",
    ),
    "on-demand base above desired": (
        {"ftfleet:onDemandBaseCapacity": 3},
        "ftfleet:onDemandBaseCapacity (3) exceeds workerDesiredSize (2)",
    ),
    "coldline before nearline plus 30": (
        {"ftfleet:gcsNearlineDays": 30, "ftfleet:gcsColdlineDays": 45},
        "ftfleet:gcsColdlineDays is 45; it must be at least gcsNearlineDays + 30 (60)",
    ),
    "soft delete shorter than a week": (
        {"ftfleet:gcsSoftDeleteDays": 3},
        "ftfleet:gcsSoftDeleteDays is 3; Cloud Storage keeps soft-deleted objects 7 to 90 days, or 0",
    ),
    "cmek for a dual-region without a known key location": (
        {
            "gcp:region": "asia-south1",
            "ftfleet:replicaRegion": "asia-south2",
            "ftfleet:gcsCmek": True,
            "ftfleet:availabilityZones": ["asia-south1-a"],
        },
        "ftfleet:gcsCmek is true, but ftfleet does not know the Cloud KMS location for a bucket in IN",
    ),
    "label not a GCP label": (
        {"ftfleet:tags": ["Team=ML"]},
        "ftfleet:tags contains 'Team=ML'; GCP labels are key=value in lowercase",
    ),
    "vpc cidr too small": (
        {"ftfleet:vpcCidr": "10.40.0.0/20"},
        "ftfleet:vpcCidr 10.40.0.0/20 is too small for a /20 subnet and a /20 services range",
    ),
    "aws key on a gcp stack": (
        {"ftfleet:fsxStorageCapacityGiB": 2400},
        "ftfleet:fsxStorageCapacityGiB applies to aws stacks only; remove it from this gcp stack; "
        "the GCP setting is ftfleet:lustreCapacityGiB or parallelstoreCapacityGiB",
    ),
    "aws-only key without a counterpart": (
        {"ftfleet:efaEnabled": True},
        "ftfleet:efaEnabled applies to aws stacks only; remove it from this gcp stack",
    ),
    "missing region": ({"gcp:region": None}, "gcp:region is required"),
}


def bad_stack(tmp_path, changes, base=DEV) -> str:
    config = dict(base)
    for k, v in changes.items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return str(path)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_gcp_config_exits_2_with_one_line_naming_the_key(case, tmp_path, capsys):
    changes, expected = BAD[case]
    assert main(["plan", bad_stack(tmp_path, changes)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert expected in captured.err
    assert captured.out == ""  # nothing planned


def test_a_gcp_key_on_an_aws_stack_is_refused(tmp_path, capsys):
    aws = yaml.safe_load(open(stackfile.STACKS_DIR / "Pulumi.aws-dev.yaml"))["config"]
    assert main(["plan", bad_stack(tmp_path, {"ftfleet:lustreCapacityGiB": 9000}, base=aws)]) == 2
    assert capsys.readouterr().err == (
        "error: ftfleet:lustreCapacityGiB applies to gcp stacks only; remove it from this aws stack\n"
    )


def test_every_gcp_key_in_pulumi_yaml_is_recognised_as_gcp_only_and_every_other_key_is_shared_or_aws():
    schema = settings.load_schema()
    gcp_keys = {k for k in schema if keys.is_gcp_only(k)}
    assert {"gcpStorageKind", "lustreCapacityGiB", "parallelstoreCapacityGiB", "gcsTurboReplication"} <= gcp_keys
    assert keys.SHARED <= set(schema)
    for key in gcp_keys:
        assert schema[key]["description"].startswith("GCP only."), key


def test_the_program_reports_bad_gcp_config_as_a_run_error(tmp_path):
    stack = stackfile.load(bad_stack(tmp_path, {"ftfleet:lustreCapacityGiB": 1000}))
    with pytest.raises(pulumi.RunError, match="ftfleet:lustreCapacityGiB is 1000"):
        offline.run(stack, validate_first=False)


@pytest.mark.parametrize("name", ["gcp-dev", "gcp-prod"])
def test_pulumi_strings_parse_like_yaml_values(name):
    stack = stackfile.load(name)
    as_strings = {k.split(":", 1)[1]: v for k, v in stack.as_pulumi_strings().items() if k.startswith("ftfleet:")}
    assert settings.parse(as_strings, stack=name, region="us-central1") == stack.settings()


def test_a_minimal_gcp_stack_takes_its_defaults_from_pulumi_yaml():
    minimal = {
        "cloud": "gcp",
        "replicaRegion": "us-east1",
        "availabilityZones": ["us-central1-a"],
        "workerInstanceTypes": ["g2-standard-4"],
        "gcpImage": "ubuntu-accelerator-2204-amd64-with-nvidia-580-v20260825",  # no default: pinned by the user
    }
    s = settings.parse(minimal, stack="mini", region="us-central1")
    schema = settings.load_schema()
    assert s.storage.kind == schema["gcpStorageKind"]["default"] == "managed-lustre"
    assert s.storage.lustre_capacity_gib == schema["lustreCapacityGiB"]["default"] == 9000
    assert s.fleet.worker_provisioning_model == "SPOT" and s.fleet.automatic_restart is False
    # us-central1 + us-east1 is the predefined NAM4: no custom placement.
    assert (s.buckets.location, s.buckets.data_locations) == ("NAM4", ())


@pytest.mark.parametrize(
    "primary, replica, expected",
    [
        ("us-central1", "us-east4", ("US", ("US-CENTRAL1", "US-EAST4"))),
        ("us-east1", "us-central1", ("NAM4", ())),
        ("europe-north1", "europe-west4", ("EUR4", ())),
        ("europe-west3", "europe-west10", ("DE", ("EUROPE-WEST3", "EUROPE-WEST10"))),
        ("europe-west1", "europe-west9", ("EU", ("EUROPE-WEST1", "EUROPE-WEST9"))),
        ("us-central1", "europe-west1", None),
        ("asia-east1", "asia-northeast1", None),
    ],
)
def test_dual_regions_follow_googles_predefined_and_configurable_tables(primary, replica, expected):
    assert locations.dual_region(primary, replica) == expected


def test_the_beta_preemption_notice_is_off_by_default_and_the_reference_says_what_on_needs():
    row = next(line for line in reference.render().splitlines() if "`ftfleet:gcpPreemptionNoticeSeconds`" in line)
    assert "| `0` |" in row and "Beta" in row and "allow-listed" in row and "VERIFY-ON-GCP" in row
    for stack in ("gcp-dev", "gcp-prod"):
        assert stackfile.load(stack).settings().fleet.preemption_notice_seconds == 0


def test_an_image_whose_kernel_has_no_published_lustre_client_is_refused_in_one_line(monkeypatch):
    image = "ubuntu-accelerator-2204-amd64-with-nvidia-580-v20260825"
    monkeypatch.setattr(catalog, "gcp_image_kernel", lambda name: {image: "6.8.0-1040-gcp"}.get(name))
    monkeypatch.setattr(catalog, "lustre_client_kernels", lambda: ("6.8.0-1030-gcp", "6.8.0-1036-gcp"))
    with pytest.raises(ConfigError) as err:
        stackfile.load("gcp-dev").settings()
    message = str(err.value)
    assert "\n" not in message and message.startswith("ftfleet:gcpImage is " + image)
    assert "kernel 6.8.0-1040-gcp" in message and "lustre-client-modules-6.8.0-1040-gcp" in message
    # Parallelstore needs no Lustre client; a kernel with one, or one the catalog does not know, passes.
    stack = stackfile.load("gcp-dev")
    config = {**stack.config, "ftfleet:gcpStorageKind": "parallelstore", "ftfleet:parallelstoreCapacityGiB": 12000}
    dataclasses.replace(stack, config=config).settings()
    monkeypatch.setattr(catalog, "lustre_client_kernels", lambda: ("6.8.0-1040-gcp",))
    stackfile.load("gcp-dev").settings()
    monkeypatch.setattr(catalog, "gcp_image_kernel", lambda name: None)
    monkeypatch.setattr(catalog, "lustre_client_kernels", lambda: ("6.8.0-1030-gcp",))
    stackfile.load("gcp-dev").settings()


def test_the_shipped_catalog_records_kernels_only_in_the_documented_shape():
    data = catalog._data()["gcp_node_images"]
    assert set(data) == {"_about", "images", "lustre_client_kernels"}
    assert all(set(v) == {"kernel"} for v in data["images"].values())
    assert all(isinstance(k, str) and k for k in data["lustre_client_kernels"])
