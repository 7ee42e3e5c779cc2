"""The AWS nodes' boot script (infra/aws/boot/), read by shellcheck and run under bash
against stand-in commands (tests/infra/bootstub.py): the order of its steps, what each
failure does, its retries, and the bounded self-replacement."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import time
import tomllib
from pathlib import Path

import pytest

from ftfleet import contract
from ftfleet.infra import bootscript, stackfile
from ftfleet.infra.aws import userdata
from tests.infra.bootstub import Stubs, shellcheck
from tests.infra.conftest import recording

REPO = Path(__file__).resolve().parents[2]
INSTANCE = "i-0123456789abcdef0"
KERNEL = "6.8.0-1063-aws"
CHANGE = "/change/C0123456789ABCDEFGHIJ"


def context(role: str, **changes) -> userdata.NodeContext:
    ctx = userdata.NodeContext(
        role=role,
        image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/ftfleet-aws-dev/trainer:0.1.0",
        registry_host="123456789012.dkr.ecr.us-east-1.amazonaws.com",
        fsx_dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        fsx_mount_name="abcdefgh",
        primary_bucket="ftfleet-aws-dev-ckpt-primary",
        replica_bucket="ftfleet-aws-dev-ckpt-replica",
        zone_id="Z0123456789ABCDEFGHIJ",
        zone_name="aws-dev.ftfleet.internal",
    )
    return dataclasses.replace(ctx, **changes)


def settings(stack: str = "aws-dev", launcher: str | None = None, **fleet):
    s = stackfile.load(stack).settings()
    if launcher is not None:
        s = dataclasses.replace(s, trainer=dataclasses.replace(s.trainer, launcher=launcher))
    return dataclasses.replace(s, fleet=dataclasses.replace(s.fleet, **fleet)) if fleet else s


LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def user_data_of(rec) -> dict[str, str]:
    return {
        lt.name: base64.b64decode(lt.inputs["userData"]).decode()
        for lt in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    }


# ---------------------------------------------------------------------------
# What shellcheck and EC2 see
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_the_user_data_of_every_stack_and_role_passes_shellcheck(stack, tmp_path):
    rec = recording(stack)
    scripts = user_data_of(rec)
    # One template for the coordinator and one per worker instance type.
    roles = [lt.inputs["tagSpecifications"][0]["tags"]["ftfleet:role"] for lt in rec.of_type(LAUNCH_TEMPLATE)]
    assert sorted(set(roles)) == ["coordinator", "worker"]
    assert len(scripts) == 1 + len(stackfile.load(stack).settings().fleet.worker_instance_types)
    for name, script in scripts.items():
        assert shellcheck(script, tmp_path) == "", name


def test_the_user_data_of_an_adopted_vpc_with_efa_passes_shellcheck(variant, tmp_path):
    rec = variant(
        existingVpcId="vpc-0abc",
        existingSubnetIds=["subnet-a", "subnet-b"],
        efaEnabled=True,
        coordinatorInstanceType="g5.48xlarge",
        workerInstanceTypes=["g5.48xlarge"],
    )
    for name, script in user_data_of(rec).items():
        assert "EFA_ENABLED=true" in script
        assert shellcheck(script, tmp_path) == "", name


@pytest.mark.parametrize("role", ["coordinator", "worker"])
@pytest.mark.parametrize("efa", [True, False])
@pytest.mark.parametrize("launcher", ["inprocess", "torchrun"])
def test_every_rendered_variant_and_its_helper_pass_shellcheck(role, efa, launcher, tmp_path):
    s, ctx = settings(launcher=launcher, efa_enabled=efa), context(role)
    assert shellcheck(userdata.render(s, ctx), tmp_path) == ""
    helper = bootscript.render(userdata.NODE_HELPER, userdata.helper_values(s, ctx))
    assert shellcheck(helper, tmp_path) == ""


def test_the_node_runs_the_helper_file_it_was_given():
    s, ctx = settings(), context("worker")
    script = userdata.render(s, ctx)
    packed = next(line for line in script.splitlines() if line.startswith("NODE_HELPER_GZ="))
    helper = userdata.unpack(packed.split("=", 1)[1].strip("'"))
    assert helper == bootscript.render(userdata.NODE_HELPER, userdata.helper_values(s, ctx))
    assert userdata.render(s, ctx) == script  # deterministic: no launch-template diff per run


def test_user_data_over_ec2s_16_kib_is_refused_when_rendered():
    s = settings()
    s = dataclasses.replace(s, trainer=dataclasses.replace(s.trainer, config="/opt/" + "x" * 20_000))
    with pytest.raises(bootscript.BootScriptError, match=f"over the limit of {bootscript.EC2_USER_DATA_LIMIT}"):
        userdata.render(s, context("worker"))


@pytest.mark.parametrize("path", [userdata.NODE_SCRIPT, userdata.NODE_HELPER], ids=lambda p: p.name)
def test_every_path_the_boot_files_write_is_under_root(path):
    # Tests run these scripts as root: a write outside $ROOT would change the machine.
    text = path.read_text()
    commands = "\n".join(line for line in text.splitlines() if "((" not in line)  # not arithmetic
    targets = [t.rstrip(";") for t in re.findall(r"(?<![<>&0-9])>>?\s*(\S+)", commands)]  # redirections
    targets += re.findall(r"(?:curl|gpg)\s[^\n]*?\s-o\s+(\S+)", text)
    targets += re.findall(r"tee -a (\S+)", text)
    targets += [
        arg for line in re.findall(r"^\s*(?:mkdir -p|chmod \d+|chown \S+) (.+)$", text, re.M) for arg in line.split()
    ]
    rooted = ('"$ROOT', '"$HELPER"', '"$BOOT_LOG"')
    stray = [t for t in targets if not t.startswith(rooted) and t not in ("/dev/null", "&2", "&1")]
    assert not stray, stray
    assert 'HELPER="$ROOT/' in text or 'BOOT_LOG="$ROOT/' in text


def test_the_boot_files_install_with_the_package():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["ftfleet.infra"]
    infra = REPO / "infra"
    shipped = {p for pattern in patterns for p in infra.glob(pattern)}
    assert {userdata.NODE_SCRIPT, userdata.NODE_HELPER} <= shipped


# ---------------------------------------------------------------------------
# The boot, run against stand-ins
# ---------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path):
    """Stand-ins for a healthy first boot; tests add rules that break it."""
    stubs = Stubs(tmp_path)
    for name in ("sleep", "uname", "modinfo", "apt-cache", "gpg", "getent", "resolvectl"):
        stubs.add(name)
    stubs.stub("curl", match="api/token", stdout="TOKEN")
    stubs.stub("curl", match="meta-data/instance-id", stdout=INSTANCE)
    stubs.stub("curl", match="meta-data/local-ipv4", stdout="10.40.0.12")
    stubs.stub("uname", match="-r", stdout=KERNEL + "\n")
    stubs.stub("modinfo", match="lustre", rc=1)  # the AMI has no Lustre client
    stubs.stub("aws", match="change-resource-record-sets", stdout=CHANGE + "\n")
    stubs.stub("aws", match="list-objects-v2", stdout="None\n")
    (stubs.root / "etc").mkdir()
    (stubs.root / "etc" / "os-release").write_text('NAME="Ubuntu"\nVERSION_CODENAME=jammy\n')
    return stubs


def boot(stubs: Stubs, role: str = "coordinator", launcher: str | None = None, **fleet):
    script = userdata.render(settings(launcher=launcher, **fleet), context(role), root=str(stubs.root))
    return stubs.run(script)


def log_of(stubs: Stubs) -> str:
    path = stubs.root / "var" / "log" / "ftfleet-boot.log"
    return path.read_text() if path.exists() else ""


def sleeps(stubs: Stubs) -> list[int]:
    return [int(c.args[0]) for c in stubs.calls("sleep")]


def aws_calls(stubs: Stubs, *words: str) -> list[list[str]]:
    return [c.args for c in stubs.calls("aws") if c.args[: len(words)] == list(words)]


def asked_for_replacement(stubs: Stubs) -> bool:
    return bool(aws_calls(stubs, "autoscaling", "set-instance-health"))


def started_trainer(stubs: Stubs) -> bool:
    return any(c.args[:1] == ["start"] for c in stubs.calls("systemctl"))


@pytest.mark.integration
def test_a_coordinator_boots_in_order(node):
    result = boot(node, "coordinator")
    assert result.returncode == 0, result.stderr + log_of(node)
    steps = [s for s in node.order() if not s.startswith(("curl -sf", "sleep", "uname", "date"))]
    assert steps == [
        "modinfo lustre",
        "curl -fsSL",  # FSx's repository key
        "gpg --batch",
        "apt-get -o",  # update
        "apt-cache show",
        "apt-get -o",  # install
        "mount -t",
        "chown 10001:10001",
        "mount -t",  # the snapshots' RAM file system
        "aws route53",  # UPSERT
        "aws route53",  # wait until INSYNC
        "systemctl daemon-reload",
        "systemctl enable",
        "systemctl start",
    ]
    update, install = [c.args for c in node.calls("apt-get")]
    assert update[-2:] == ["update", "-y"]
    assert install[-1] == f"lustre-client-modules-{KERNEL}"
    sources = (node.root / "etc/apt/sources.list.d/fsxlustreclientrepo.list").read_text()
    assert "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu jammy main" in sources
    assert "signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.gpg" in sources
    assert not asked_for_replacement(node)
    assert "boot done" in log_of(node)


@pytest.mark.integration
def test_the_trainer_gets_the_whole_contract_and_its_own_directories(node):
    assert boot(node, "worker").returncode == 0, log_of(node)
    lines = (node.root / "etc/ftfleet/trainer.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines)
    assert len(env) == len(lines)
    contract.check_env(env)
    assert set(env) <= contract.ENV_NAMES
    assert env["FTFLEET_NODE_ID"] == INSTANCE
    assert env["FTFLEET_RUN_DIR"] == f"/fsx/runs/aws-dev/{INSTANCE}"
    assert env["FTFLEET_CKPT_DIR"] == "/fsx/checkpoints/aws-dev"
    assert env["FTFLEET_METRICS_PORT"] == str(contract.METRICS_PORT)
    assert env["FTFLEET_RDZV_ENDPOINT"] == f"coordinator.aws-dev.ftfleet.internal:{contract.RDZV_PORT}"
    (chown,) = node.calls("chown")
    owner, *paths = chown.args
    assert owner == f"{contract.TRAINER_UID}:{contract.TRAINER_UID}"
    root = str(node.root)
    assert paths == [
        f"{root}/fsx/checkpoints/aws-dev",
        f"{root}/fsx/checkpoints/aws-dev/{contract.MARKER_DIR}",
        f"{root}/fsx/runs/aws-dev",
        f"{root}/fsx/runs/aws-dev/{INSTANCE}",
    ]
    assert all(Path(p).is_dir() for p in paths)


@pytest.mark.integration
def test_the_trainer_unit_never_restarts_a_final_exit_and_the_image_unit_pulls_first(node):
    assert boot(node, "worker").returncode == 0, log_of(node)
    units = node.root / "etc/systemd/system"
    trainer = (units / "ftfleet-trainer.service").read_text()
    image = (units / "ftfleet-image.service").read_text()
    codes = " ".join(map(str, contract.NODE_FINAL_EXITS))
    assert f"RestartPreventExitStatus={codes}\n" in trainer
    assert "Requires=ftfleet-image.service" in trainer and "After=ftfleet-image.service" in trainer
    assert "StartLimitIntervalSec=0" in trainer  # systemd never gives up restarting it
    assert "RequiresMountsFor=/fsx" in trainer
    assert "--network host" in trainer and "--env-file /etc/ftfleet/trainer.env" in trainer
    assert "ExecStart=/usr/local/sbin/ftfleet-node pull" in image and "Type=oneshot" in image
    helper = node.root / "usr/local/sbin/ftfleet-node"
    assert helper.stat().st_mode & 0o111
    start = [c.args for c in node.calls("systemctl") if c.args[:1] == ["start"]]
    assert start == [["start", "--no-block", "ftfleet-trainer.service"]]


@pytest.mark.integration
def test_the_snapshots_get_a_ram_file_system_on_huge_pages_owned_by_the_trainer(node):
    assert boot(node, "worker").returncode == 0, log_of(node)
    tmpfs = [c.args for c in node.calls("mount") if c.args[:2] == ["-t", "tmpfs"]]
    opts = f"size={contract.SHM_SIZE},mode=0700,uid={contract.TRAINER_UID},gid={contract.TRAINER_UID}"
    assert tmpfs == [
        ["-t", "tmpfs", "-o", f"huge=within_size,{opts}", "ftfleet-shm", f"{node.root}{contract.SHM_MOUNT}"]
    ]
    env = dict(line.split("=", 1) for line in (node.root / "etc/ftfleet/trainer.env").read_text().splitlines())
    assert env["FTFLEET_SHM_DIR"] == contract.SHM_MOUNT
    trainer = (node.root / "etc/systemd/system/ftfleet-trainer.service").read_text()
    assert f"-v {contract.SHM_MOUNT}:{contract.SHM_MOUNT} " in trainer


def units_of(stubs: Stubs) -> dict[str, str]:
    return {p.name: p.read_text() for p in (stubs.root / "etc/systemd/system").glob("*.service")}


def env_of(stubs: Stubs) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (stubs.root / "etc/ftfleet/trainer.env").read_text().splitlines())


@pytest.mark.integration
def test_the_coordinator_starts_the_jobs_stores_before_its_trainer(node):
    assert boot(node, "coordinator").returncode == 0, log_of(node)
    units = units_of(node)
    stores, trainer = units["ftfleet-stores.service"], units["ftfleet-trainer.service"]
    (run,) = [line for line in stores.splitlines() if line.startswith("ExecStart=")]
    image = context("coordinator").image_uri
    assert run == (
        "ExecStart=/usr/bin/docker run --rm --init --name ftfleet-stores --network host "
        f"--env-file /etc/ftfleet/trainer.env {image} stores"
    )  # no GPU, no mount: it trains nothing and writes nothing
    assert "Restart=always" in stores and "StartLimitIntervalSec=0" in stores
    assert "Requires=ftfleet-image.service" in stores and "WantedBy=multi-user.target" in stores
    assert "Wants=ftfleet-stores.service\nAfter=ftfleet-stores.service\n" in trainer
    both = ["ftfleet-stores.service", "ftfleet-trainer.service"]
    assert [c.args for c in node.calls("systemctl") if c.args[:1] in (["enable"], ["start"])] == [
        ["enable", *both],
        ["start", "--no-block", *both],
    ]
    # The coordinator trains too: its trainer runs the image as every node does.
    assert f"{image}\n" in trainer and "--gpus all" in trainer


@pytest.mark.integration
def test_a_worker_runs_a_node_of_the_in_process_launcher_and_no_stores(node):
    assert boot(node, "worker", spare_nodes=1).returncode == 0, log_of(node)
    assert set(units_of(node)) == {"ftfleet-image.service", "ftfleet-trainer.service"}
    assert "ftfleet-stores" not in units_of(node)["ftfleet-trainer.service"]
    env = env_of(node)
    # aws-dev: 2 workers and the coordinator train, the spare node waits beside them.
    assert env["FTFLEET_LAUNCHER"] == "inprocess"
    assert (env["FTFLEET_NNODES"], env["FTFLEET_SPARE_NODES"]) == ("3", "1")
    contract.check_env(env)


@pytest.mark.integration
def test_under_torchrun_the_coordinator_runs_no_stores_and_the_nodes_are_elastic(node):
    assert boot(node, "coordinator", launcher="torchrun").returncode == 0, log_of(node)
    assert "ftfleet-stores.service" not in units_of(node)  # torchrun's agent hosts the rendezvous on 29400
    env = env_of(node)
    assert env["FTFLEET_LAUNCHER"] == "torchrun" and env["FTFLEET_NNODES"] == "1:5"
    assert "FTFLEET_SPARE_NODES" not in env
    starts = [c.args for c in node.calls("systemctl") if c.args[:1] == ["start"]]
    assert starts == [["start", "--no-block", "ftfleet-trainer.service"]]


@pytest.mark.integration
def test_a_kernel_without_huge_pages_for_tmpfs_gets_plain_pages(node):
    node.stub("mount", match="huge=within_size", rc=32)
    assert boot(node, "worker").returncode == 0, log_of(node)
    tmpfs = [c.args for c in node.calls("mount") if c.args[:2] == ["-t", "tmpfs"]]
    assert len(tmpfs) == 2 and "huge" not in tmpfs[1][3] and tmpfs[1][3].startswith("size=")
    assert "4 KiB pages" in log_of(node) and started_trainer(node)


@pytest.mark.integration
def test_fstab_orders_the_mount_after_a_unit_ubuntu_has(node):
    assert boot(node).returncode == 0, log_of(node)
    (line,) = (node.root / "etc/fstab").read_text().splitlines()
    assert line.startswith("fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh /fsx lustre ")
    assert "x-systemd.requires=network-online.target" in line and "network.service" not in line
    (mount,) = [c for c in node.calls("mount") if c.args[:2] == ["-t", "lustre"]]
    assert mount.args[-2:] == ["fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh", f"{node.root}/fsx"]


@pytest.mark.integration
def test_an_ami_with_a_lustre_client_skips_the_install(node):
    node.stub("modinfo", match="lustre", rc=0, first=True)
    assert boot(node).returncode == 0, log_of(node)
    assert not node.calls("apt-get") and not node.calls("gpg")
    assert "already has a Lustre client" in log_of(node)


@pytest.mark.integration
def test_a_kernel_the_fsx_repository_lacks_fails_the_boot_with_one_clear_line(node):
    node.stub("apt-cache", match=f"show lustre-client-modules-{KERNEL}", rc=100)
    result = boot(node)
    assert result.returncode == 1
    (line,) = [line for line in log_of(node).splitlines() if "has no lustre-client-modules" in line]
    assert f"lustre-client-modules-{KERNEL}" in line and "ftfleet:imageId" in line
    assert "BOOT FAILED at step 'Lustre client'" in log_of(node)
    assert asked_for_replacement(node) and not started_trainer(node)
    assert len(node.calls("apt-get")) == 1  # no install attempted


@pytest.mark.integration
def test_an_os_without_a_release_codename_fails_the_boot_with_one_clear_line(node):
    (node.root / "etc" / "os-release").write_text('NAME="Something"\n')
    assert boot(node).returncode == 1
    assert "names no VERSION_CODENAME" in log_of(node)
    assert not node.calls("apt-get") and asked_for_replacement(node)


@pytest.mark.integration
def test_apt_is_retried_with_backoff_while_another_process_holds_its_lock(node):
    node.stub("apt-get", match="update", rc=100, stderr="Could not get lock", times=3)
    assert boot(node).returncode == 0, log_of(node)
    assert len([c for c in node.calls("apt-get") if "update" in c.args]) == 4
    assert sleeps(node) == [5, 10, 20]


@pytest.mark.integration
@pytest.mark.parametrize(
    "command, match, step",
    [
        ("curl", "meta-data/local-ipv4", "instance identity"),
        ("apt-get", "update", "Lustre client"),
        ("apt-get", "install", "Lustre client"),
        ("mount", "lustre", "mount FSx for Lustre at /fsx"),
        ("chown", None, "directories for uid 10001"),
        ("aws", "change-resource-record-sets", "publish coordinator.aws-dev.ftfleet.internal"),
        ("aws", "resource-record-sets-changed", "publish coordinator.aws-dev.ftfleet.internal"),
        ("systemctl", "daemon-reload", "trainer service"),
    ],
)
def test_a_step_that_keeps_failing_fails_the_boot_and_asks_for_a_replacement(node, command, match, step):
    node.stub(command, match=match, rc=1, stderr="broken", first=True)
    result = boot(node, "coordinator")
    assert result.returncode == 1
    assert f"BOOT FAILED at step '{step}'" in log_of(node)
    (ask,) = aws_calls(node, "autoscaling", "set-instance-health")
    assert ask == [
        "autoscaling",
        "set-instance-health",
        "--instance-id",
        INSTANCE,
        "--health-status",
        "Unhealthy",
        "--no-should-respect-grace-period",
    ]
    assert not started_trainer(node)


@pytest.mark.integration
def test_a_node_that_cannot_read_its_identity_cannot_ask_for_a_replacement(node):
    node.stub("curl", match="meta-data/instance-id", rc=22, first=True)
    assert boot(node).returncode == 1
    assert "BOOT FAILED at step 'instance identity'" in log_of(node)
    assert "cannot read this node's instance id" in log_of(node)
    assert not aws_calls(node, "autoscaling")


@pytest.mark.integration
def test_the_coordinator_waits_until_its_record_is_insync(node):
    assert boot(node, "coordinator").returncode == 0, log_of(node)
    upsert, wait = aws_calls(node, "route53")
    batch = json.loads(upsert[upsert.index("--change-batch") + 1])
    (change,) = batch["Changes"]
    assert change["Action"] == "UPSERT"
    assert change["ResourceRecordSet"] == {
        "Name": "coordinator.aws-dev.ftfleet.internal",
        "Type": "A",
        "TTL": userdata.RECORD_TTL,
        "ResourceRecords": [{"Value": "10.40.0.12"}],
    }
    assert upsert[upsert.index("--hosted-zone-id") + 1] == "Z0123456789ABCDEFGHIJ"
    assert wait == ["route53", "wait", "resource-record-sets-changed", "--id", CHANGE]


@pytest.mark.integration
def test_a_throttled_dns_change_is_retried(node):
    node.stub("aws", match="change-resource-record-sets", rc=255, stderr="Throttling", times=2, first=True)
    assert boot(node, "coordinator").returncode == 0, log_of(node)
    assert len(aws_calls(node, "route53", "change-resource-record-sets")) == 3
    assert sleeps(node) == [5, 10]


@pytest.mark.integration
def test_a_worker_retries_the_coordinators_name_and_never_publishes(node):
    node.stub("getent", rc=2, times=2)
    assert boot(node, "worker").returncode == 0, log_of(node)
    assert len(node.calls("getent")) == 3
    assert len(node.calls("resolvectl")) == 3  # the negative cache is flushed before each try
    assert sleeps(node) == [5, 10]
    assert not aws_calls(node, "route53")


@pytest.mark.integration
def test_a_worker_starts_even_before_the_coordinator_resolves(node):
    node.stub("getent", rc=2)
    assert boot(node, "worker").returncode == 0, log_of(node)
    assert "does not resolve yet" in log_of(node)
    assert started_trainer(node) and not asked_for_replacement(node)


@pytest.mark.integration
def test_with_efa_every_device_is_passed_into_the_container(node):
    devices = node.root / "dev" / "infiniband"
    devices.mkdir(parents=True)
    for name in ("uverbs0", "uverbs1", "rdma_cm"):
        (devices / name).touch()
    assert boot(node, "worker", efa_enabled=True).returncode == 0, log_of(node)
    trainer = (node.root / "etc/systemd/system/ftfleet-trainer.service").read_text()
    assert "--device=/dev/infiniband/uverbs0 --device=/dev/infiniband/uverbs1 --env-file" in trainer
    assert "rdma_cm" not in trainer


@pytest.mark.integration
def test_efa_without_devices_fails_the_boot_with_one_clear_line(node):
    assert boot(node, "worker", efa_enabled=True).returncode == 1
    assert "efaEnabled is true but /dev/infiniband has no uverbs devices" in log_of(node)
    assert asked_for_replacement(node) and not started_trainer(node)


@pytest.mark.integration
def test_without_efa_no_device_is_passed(node):
    assert boot(node, "worker", efa_enabled=False).returncode == 0, log_of(node)
    assert "--device" not in (node.root / "etc/systemd/system/ftfleet-trainer.service").read_text()


# ---------------------------------------------------------------------------
# The helper: the image pull and the bound on self-replacements
# ---------------------------------------------------------------------------


def helper(stubs: Stubs, *args: str, role: str = "worker"):
    script = bootscript.render(userdata.NODE_HELPER, userdata.helper_values(settings(), context(role), str(stubs.root)))
    path = stubs.dir / "ftfleet-node"
    path.write_text(script)
    return stubs.run(f"exec bash {path} {' '.join(args)}\n")


def recent_keys(n: int, *, age_s: int = 60, role: str = "worker") -> str:
    now = int(time.time())
    keys = [contract.replacement_key("aws-dev", role, now - age_s - i, f"i-{i:017x}") for i in range(n)]
    return "\t".join(keys) + "\n"


@pytest.mark.integration
def test_the_pull_retries_with_backoff_until_the_image_is_pushed_and_asks_once_for_a_replacement(node):
    node.stub("docker", match="^pull ", rc=1, stderr="manifest unknown", times=10)
    result = helper(node, "pull")
    assert result.returncode == 0, result.stderr
    assert len([c for c in node.calls("docker") if c.args[:1] == ["pull"]]) == 11
    assert sleeps(node) == [15, 30, 60, 120, 240, 300, 300, 300, 300, 300]
    assert len(aws_calls(node, "autoscaling", "set-instance-health")) == 1
    order = [c.args[0] for c in node.calls("docker")]
    assert order[:2] == ["login", "pull"]  # every attempt logs in to ECR first
    login = node.calls("docker")[0]
    assert login.args[-1] == "123456789012.dkr.ecr.us-east-1.amazonaws.com"


@pytest.mark.integration
def test_a_replacement_is_recorded_then_asked_for_within_the_bound(node):
    node.stub("aws", match="list-objects-v2", stdout=recent_keys(contract.REPLACEMENT_BUDGET), first=True)
    result = helper(node, "replace", "'test reason'")
    assert result.returncode == 0, result.stderr
    (put,) = aws_calls(node, "s3api", "put-object")
    key = put[put.index("--key") + 1]
    assert key.startswith(f"{contract.REPLACEMENTS_PREFIX}aws-dev/worker/") and key.endswith(f"-{INSTANCE}")
    assert put[put.index("--bucket") + 1] == "ftfleet-aws-dev-ckpt-primary"
    (listing,) = aws_calls(node, "s3api", "list-objects-v2")
    assert listing[listing.index("--prefix") + 1] == f"{contract.REPLACEMENTS_PREFIX}aws-dev/worker/"
    assert asked_for_replacement(node)
    assert not aws_calls(node, "autoscaling", "terminate-instance-in-auto-scaling-group")


@pytest.mark.integration
def test_past_the_bound_a_node_leaves_its_group_without_a_replacement(node):
    node.stub("aws", match="list-objects-v2", stdout=recent_keys(contract.REPLACEMENT_BUDGET + 1), first=True)
    assert helper(node, "replace", "bad-image").returncode == 0
    assert not asked_for_replacement(node)
    (term,) = aws_calls(node, "autoscaling", "terminate-instance-in-auto-scaling-group")
    assert term[-3:] == ["--instance-id", INSTANCE, "--should-decrement-desired-capacity"]
    assert "over the bound" in log_of(node)


@pytest.mark.integration
def test_past_the_bound_at_the_minimum_size_a_node_stays_up_and_says_why(node):
    node.stub("aws", match="list-objects-v2", stdout=recent_keys(contract.REPLACEMENT_BUDGET + 1), first=True)
    node.stub("aws", match="terminate-instance", rc=254, stderr="ValidationError: below min size")
    assert helper(node, "replace", "bad-image").returncode == 0
    assert not asked_for_replacement(node)
    assert "stays up, idle and not replaced" in log_of(node)


@pytest.mark.integration
def test_replacements_older_than_the_window_do_not_count(node):
    old = recent_keys(10, age_s=contract.REPLACEMENT_WINDOW_S + 5)
    node.stub("aws", match="list-objects-v2", stdout=old, first=True)
    assert helper(node, "replace", "one-bad-host").returncode == 0
    assert asked_for_replacement(node)


@pytest.mark.integration
def test_a_node_that_cannot_count_replacements_does_not_ask_for_one(node):
    node.stub("aws", match="list-objects-v2", rc=255, stderr="AccessDenied", first=True)
    assert helper(node, "replace", "x").returncode == 1
    assert not asked_for_replacement(node)
    assert "cannot list" in log_of(node)


@pytest.mark.integration
def test_a_failed_boot_past_the_bound_does_not_ask_for_a_replacement(node):
    node.stub("aws", match="list-objects-v2", stdout=recent_keys(10, role="coordinator"), first=True)
    node.stub("mount", rc=32)
    assert boot(node, "coordinator").returncode == 1
    assert not asked_for_replacement(node)
    assert aws_calls(node, "autoscaling", "terminate-instance-in-auto-scaling-group")
