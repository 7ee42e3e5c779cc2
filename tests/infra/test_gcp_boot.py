"""The GCP boot scripts, rendered for real stacks, shellchecked and run against stubs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from ftfleet import contract
from ftfleet.infra import stackfile
from ftfleet.infra.gcp import boot
from tests.infra.bootstub import Stubs, shellcheck

NODE = "ftfleet-gcp-dev-workers-x7k2"
TOKEN = "ya29.not-a-real-token"
CTX = boot.NodeContext(
    image_uri="us-central1-docker.pkg.dev/proj/ftfleet-gcp-dev/trainer:0.1.0",
    registry_host="us-central1-docker.pkg.dev",
    mount_source="10.40.240.5@tcp:/ftfleet",
    bucket="ftfleet-gcp-dev-ckpt-bucket-1a2b3c4",
    coordinator_ip="10.40.0.10",
)
#: What dpkg-query lists for the hold patterns on an accelerator image (status, package).
INSTALLED = (
    "ii  linux-image-6.8.0-1036-gcp\n"
    "ii  linux-modules-6.8.0-1036-gcp\n"
    "rc  linux-image-6.8.0-1030-gcp\n"
    "ii  linux-gcp-6.8-headers-6.8.0-1036\n"
    "ii  nvidia-driver-580-server\n"
    "ii  libnvidia-compute-580-server\n"
)
HELD = [
    "linux-image-6.8.0-1036-gcp",
    "linux-modules-6.8.0-1036-gcp",
    "linux-gcp-6.8-headers-6.8.0-1036",
    "nvidia-driver-580-server",
    "libnvidia-compute-580-server",
]
PARALLELSTORE_CTX = dataclasses.replace(CTX, mount_source="10.40.240.7,10.40.240.8,10.40.240.9")
VARIANTS = [
    (kind, role, model)
    for kind in ("managed-lustre", "parallelstore")
    for role in ("coordinator", "worker")
    for model in ("SPOT", "STANDARD")
]


def settings_for(kind: str = "managed-lustre"):
    stack = stackfile.load("gcp-dev")
    config = dict(stack.config, **{"ftfleet:gcpStorageKind": kind, "ftfleet:parallelstoreCapacityGiB": 12000})
    return dataclasses.replace(stack, config=config).settings()


def render(stubs: Stubs, kind="managed-lustre", role="worker", model="SPOT", launcher=None, spare_nodes=None) -> str:
    ctx = PARALLELSTORE_CTX if kind == "parallelstore" else CTX
    s = settings_for(kind)
    if launcher is not None:
        s = dataclasses.replace(s, trainer=dataclasses.replace(s.trainer, launcher=launcher))
    if spare_nodes is not None:
        s = dataclasses.replace(s, fleet=dataclasses.replace(s.fleet, spare_nodes=spare_nodes))
    return boot.startup_script(s, ctx, role, model, root=str(stubs.root), retry_seconds=0)


@pytest.fixture
def stubs(tmp_path) -> Stubs:
    s = Stubs(tmp_path)
    for name in ("gpg", "ip", "dfuse"):
        s.add(name)
    s.stub("curl", match="instance/name", stdout=NODE)
    s.stub("curl", match="service-accounts/default/token", stdout=json.dumps({"access_token": TOKEN}))
    s.stub("ip", match="route", stdout="default via 10.40.0.1 dev ens4 proto dhcp src 10.40.0.22 metric 100\n")
    s.stub("modinfo", rc=1, stderr="modinfo: ERROR: Module lustre not found.")  # no client for this kernel yet
    s.stub("dpkg-query", stdout=INSTALLED)
    s.add("apt-mark")
    (s.root / "etc").mkdir()
    (s.root / "etc" / "os-release").write_text('NAME="Ubuntu"\nVERSION_CODENAME=jammy\nUBUNTU_CODENAME=jammy\n')
    return s


def first(order: list[str], step: str) -> int:
    return order.index(step)


def env_file(stubs: Stubs) -> dict[str, str]:
    text = (stubs.root / "etc" / "ftfleet" / "trainer.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


@pytest.mark.parametrize("kind, role, model", VARIANTS)
def test_every_rendered_startup_script_passes_shellcheck(kind, role, model, tmp_path):
    script = boot.startup_script(settings_for(kind), CTX, role, model)
    assert shellcheck(script, tmp_path) == ""


@pytest.mark.parametrize("role", ["coordinator", "worker"])
def test_the_startup_script_under_torchrun_passes_shellcheck(role, tmp_path):
    s = settings_for()
    s = dataclasses.replace(s, trainer=dataclasses.replace(s.trainer, launcher="torchrun"))
    assert shellcheck(boot.startup_script(s, CTX, role, "SPOT"), tmp_path) == ""


def units_of(stubs: Stubs) -> dict[str, str]:
    return {p.name: p.read_text() for p in (stubs.root / "etc/systemd/system").glob("*.service")}


@pytest.mark.integration
def test_the_coordinator_starts_the_jobs_stores_before_its_trainer_on_gcp(stubs):
    stubs.add("nvidia-ctk")
    result = stubs.run(render(stubs, role="coordinator"))
    assert result.returncode == 0, result.stderr
    units = units_of(stubs)
    stores, trainer = units[f"{boot.STORES_SERVICE}.service"], units[f"{boot.SERVICE}.service"]
    assert (
        f"ExecStart=/usr/bin/docker run --rm --init --name {boot.STORES_SERVICE} --network host \\\n"
        f"  --env-file /etc/ftfleet/trainer.env {CTX.image_uri} stores\n"
    ) in stores  # no GPU, no mount: it trains nothing and writes nothing
    assert "Restart=always" in stores and "StartLimitIntervalSec=0" in stores
    assert f"Wants=network-online.target {boot.STORES_SERVICE}.service\n" in trainer
    assert f"After=docker.service network-online.target {boot.STORES_SERVICE}.service\n" in trainer
    assert stubs.calls("systemctl")[-1].args == ["start", f"{boot.STORES_SERVICE}.service", f"{boot.SERVICE}.service"]
    assert "--gpus all" in trainer  # the coordinator trains too


@pytest.mark.integration
def test_a_worker_runs_a_node_of_the_in_process_launcher_and_no_stores_on_gcp(stubs):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs, spare_nodes=1)).returncode == 0
    assert set(units_of(stubs)) == {f"{boot.HEALTH_SERVICE}.service", f"{boot.SERVICE}.service"}
    assert boot.STORES_SERVICE not in units_of(stubs)[f"{boot.SERVICE}.service"]
    env = env_file(stubs)
    assert (env["FTFLEET_LAUNCHER"], env["FTFLEET_NNODES"], env["FTFLEET_SPARE_NODES"]) == ("inprocess", "3", "1")
    contract.check_env(env)


@pytest.mark.integration
def test_under_torchrun_the_coordinator_runs_no_stores_on_gcp(stubs):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs, role="coordinator", launcher="torchrun")).returncode == 0
    assert f"{boot.STORES_SERVICE}.service" not in units_of(stubs)
    env = env_file(stubs)
    assert env["FTFLEET_LAUNCHER"] == "torchrun" and env["FTFLEET_NNODES"] == "1:5"
    assert "FTFLEET_SPARE_NODES" not in env
    assert stubs.calls("systemctl")[-1].args == ["start", f"{boot.SERVICE}.service"]


@pytest.mark.parametrize("model", ["SPOT", "STANDARD"])
def test_every_rendered_shutdown_script_passes_shellcheck(model, tmp_path):
    assert shellcheck(boot.shutdown_script(model), tmp_path) == ""


@pytest.mark.integration
def test_a_worker_installs_mounts_pulls_and_starts_in_that_order(stubs):
    stubs.add("nvidia-ctk")
    result = stubs.run(render(stubs))
    assert result.returncode == 0, result.stderr
    order = stubs.order()
    assert order[0] == "curl -sSf"  # the metadata server: the node's name
    steps = ["apt-get -o", "modprobe lustre", "mount -t", "chown 10001:10001", "docker login", "docker pull"]
    positions = [first(order, step) for step in steps]
    assert positions == sorted(positions), order
    assert order[-2:] == ["systemctl daemon-reload", "systemctl start"]
    installs = [c.args for c in stubs.calls("apt-get") if "install" in c.args]
    assert len(installs) == 1
    packages = installs[0][installs[0].index("--no-install-recommends") + 1 :]
    assert packages == [f"lustre-client-modules-{os.uname().release}", "lustre-client-utils"]
    repo = (stubs.root / "etc/apt/sources.list.d/lustre-client.list").read_text()
    assert repo == (
        "deb [signed-by=/etc/apt/keyrings/lustre-client.gpg] "
        "https://us-apt.pkg.dev/projects/lustre-client-binaries lustre-client-ubuntu-jammy main\n"
    )
    mount = stubs.calls("mount")[0].args
    assert mount == ["-t", "lustre", "-o", "noatime,flock", CTX.mount_source, f"{stubs.root}/ckpt"]
    assert stubs.calls("chown")[0].args == [
        "10001:10001",
        f"{stubs.root}/ckpt/checkpoints/gcp-dev",
        f"{stubs.root}/ckpt/runs/gcp-dev",
        f"{stubs.root}/ckpt/runs/gcp-dev/{NODE}",
    ]
    assert (stubs.root / f"ckpt/runs/gcp-dev/{NODE}").is_dir()
    login = stubs.calls("docker")[0]
    assert login.args[:3] == ["login", "--username", "oauth2accesstoken"] and login.stdin == TOKEN
    assert stubs.calls("docker")[1].args == ["pull", CTX.image_uri]
    assert stubs.calls("systemctl")[-1].args == ["start", "ftfleet-trainer.service"]


@pytest.mark.integration
def test_the_trainer_gets_the_whole_contract_with_the_nodes_own_name(stubs):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs)).returncode == 0
    env = env_file(stubs)
    contract.check_env(env)  # raises if anything required is missing or invalid
    assert set(env) <= contract.ENV_NAMES
    assert env["FTFLEET_NODE_ID"] == NODE
    assert env["FTFLEET_CLOUD"] == "gcp" and env["FTFLEET_CKPT_UPLOAD"] == "trainer"
    assert env["FTFLEET_CKPT_URI"] == f"gs://{CTX.bucket}/checkpoints/gcp-dev"
    assert env["FTFLEET_LEASE_URI"] == f"gs://{CTX.bucket}/ftfleet-leases/gcp-dev.json"
    assert env["FTFLEET_LEASE_HOLDER"].startswith("gcp-dev/")
    assert env["FTFLEET_CKPT_DIR"] == "/ckpt/checkpoints/gcp-dev"
    assert env["FTFLEET_RDZV_ENDPOINT"] == "10.40.0.10:29400"
    assert env["FTFLEET_NNODES"] == "3" and env["FTFLEET_NPROC_PER_NODE"] == "1"
    assert env["FTFLEET_LAUNCHER"] == "inprocess" and env["FTFLEET_SPARE_NODES"] == "0"
    assert env["FTFLEET_METADATA_ENDPOINT"] == "http://metadata.google.internal"
    assert env["FTFLEET_RUN_DIR"] == f"/ckpt/runs/gcp-dev/{NODE}"  # per node, on the fast tier


@pytest.mark.integration
def test_the_snapshots_get_a_ram_file_system_on_huge_pages_owned_by_the_trainer(stubs):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs)).returncode == 0
    tmpfs = [c.args for c in stubs.calls("mount") if c.args[:2] == ["-t", "tmpfs"]]
    opts = f"size={contract.SHM_SIZE},mode=0700,uid={contract.TRAINER_UID},gid={contract.TRAINER_UID}"
    assert tmpfs == [
        ["-t", "tmpfs", "-o", f"huge=within_size,{opts}", "ftfleet-shm", f"{stubs.root}{contract.SHM_MOUNT}"]
    ]
    assert env_file(stubs)["FTFLEET_SHM_DIR"] == contract.SHM_MOUNT
    unit = (stubs.root / "etc/systemd/system/ftfleet-trainer.service").read_text()
    assert f"-v {contract.SHM_MOUNT}:{contract.SHM_MOUNT} " in unit


@pytest.mark.integration
def test_a_kernel_without_huge_pages_for_tmpfs_gets_plain_pages_on_gcp(stubs):
    stubs.add("nvidia-ctk")
    stubs.stub("mount", match="huge=within_size", rc=32)
    result = stubs.run(render(stubs))
    assert result.returncode == 0, result.stderr
    tmpfs = [c.args for c in stubs.calls("mount") if c.args[:2] == ["-t", "tmpfs"]]
    assert len(tmpfs) == 2 and "huge" not in tmpfs[1][3]
    assert "4 KiB pages" in result.stderr


@pytest.mark.parametrize("extended, deadline", [(0, "30"), (60, "90")])
def test_the_trainers_preemption_deadline_is_the_extended_notice_plus_the_shutdown_period(extended, deadline):
    base = settings_for()
    settings = dataclasses.replace(base, fleet=dataclasses.replace(base.fleet, preemption_notice_seconds=extended))
    env = boot.trainer_env(settings, CTX)
    assert env["FTFLEET_PREEMPTION_NOTICE_S"] == deadline
    contract.check_env({**env, "FTFLEET_NODE_ID": NODE})


@pytest.mark.integration
@pytest.mark.parametrize("model, stop", [("SPOT", 25), ("STANDARD", 100)])
def test_the_service_stops_within_the_shutdown_budget_and_never_restarts_a_terminal_exit(stubs, model, stop):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs, role="coordinator", model=model)).returncode == 0
    unit = (stubs.root / "etc/systemd/system/ftfleet-trainer.service").read_text()
    assert f"ExecStop=/usr/bin/docker stop --time {stop} ftfleet-trainer" in unit
    assert f"TimeoutStopSec={stop + 5}" in unit
    codes = " ".join(map(str, (contract.EXIT_PREEMPTED, contract.EXIT_UNRECOVERABLE, contract.EXIT_CONFIG)))
    assert f"RestartPreventExitStatus={codes}" in unit
    assert "--gpus all" in unit and "-v /ckpt:/ckpt" in unit and CTX.image_uri in unit
    assert "Description=ftfleet trainer (coordinator)" in unit


@pytest.mark.integration
def test_a_node_image_without_the_nvidia_toolkit_gets_it_from_nvidias_repository(stubs):
    stubs.stub("modinfo", first=True)  # the Lustre module of the running kernel is there
    result = stubs.run(render(stubs))
    installs = [c.args for c in stubs.calls("apt-get") if "install" in c.args]
    assert installs and installs[0][-1] == "nvidia-container-toolkit"
    repo = (stubs.root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    assert repo == (
        "deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.gpg] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    )
    # The stand-in apt-get installs nothing: the configure step finds no nvidia-ctk,
    # and the boot stops there, as it would on a node where the install went wrong.
    assert result.returncode == 127 and "failed at line" in result.stderr
    assert stubs.calls("docker") == []


@pytest.mark.integration
def test_a_node_image_with_every_client_installs_nothing(stubs):
    stubs.stub("modinfo", first=True)
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs)).returncode == 0
    assert stubs.calls("apt-get") == [] and stubs.calls("gpg") == []
    assert stubs.calls("modinfo")[0].args == ["-k", os.uname().release, "lustre"]


@pytest.mark.integration
def test_after_a_kernel_change_the_lustre_module_is_reinstalled_whatever_mount_lustre_says(stubs):
    # The tools of the previous kernel's client are still installed; its module is not
    # built for the kernel now running.
    stubs.add("mount.lustre")
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs)).returncode == 0
    (install,) = [c.args for c in stubs.calls("apt-get") if "install" in c.args]
    assert f"lustre-client-modules-{os.uname().release}" in install
    assert first(stubs.order(), "apt-get -o") < first(stubs.order(), "modprobe lustre")


@pytest.mark.integration
def test_unattended_upgrades_are_off_and_kernel_and_nvidia_packages_held_before_any_install(stubs):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs)).returncode == 0
    disabled = [c.args for c in stubs.calls("systemctl") if c.args[:1] == ["disable"]]
    assert disabled == [
        ["disable", "--now", unit]
        for unit in ("unattended-upgrades.service", "apt-daily.timer", "apt-daily-upgrade.timer")
    ]
    (hold,) = [c.args for c in stubs.calls("apt-mark")]
    assert hold == ["hold", *HELD]  # installed ones only: a removed kernel (rc) is not held
    order = stubs.order()
    assert first(order, "systemctl disable") < first(order, "apt-mark hold") < first(order, "apt-get -o")


@pytest.mark.integration
def test_a_reboot_starts_the_trainer_only_after_this_script_has_mounted_the_file_system(stubs):
    stubs.add("nvidia-ctk")
    assert stubs.run(render(stubs)).returncode == 0
    unit = (stubs.root / "etc/systemd/system/ftfleet-trainer.service").read_text().splitlines()
    # Not enabled: systemd starts nothing at boot; this script starts it after mounting.
    assert "[Install]" not in unit and not any(line.startswith("WantedBy=") for line in unit)
    assert [c.args for c in stubs.calls("systemctl") if "ftfleet-trainer.service" in c.args] == [
        ["start", "ftfleet-trainer.service"]
    ]
    assert "ConditionPathIsMountPoint=/ckpt" in unit and f"ConditionPathIsMountPoint={contract.SHM_MOUNT}" in unit
    order = stubs.order()
    assert first(order, "mount -t") < first(order, "systemctl start")


@pytest.mark.integration
def test_a_mount_that_keeps_failing_stops_the_boot_before_the_image(stubs):
    stubs.add("nvidia-ctk")
    stubs.stub("mount", rc=32, stderr="mount.lustre: mount 10.40.240.5@tcp:/ftfleet failed: Connection refused")
    result = stubs.run(render(stubs))
    assert result.returncode != 0
    assert len(stubs.calls("mount")) == boot.ATTEMPTS
    assert f"giving up after {boot.ATTEMPTS} attempts: mount" in result.stderr
    assert stubs.calls("docker") == [] and not (stubs.root / "etc/systemd/system/ftfleet-trainer.service").exists()


@pytest.mark.integration
def test_a_failed_package_install_stops_the_boot_before_the_mount(stubs):
    stubs.stub("apt-get", match="install", rc=100, stderr="E: Unable to locate package lustre-client-modules")
    result = stubs.run(render(stubs))
    assert result.returncode != 0
    assert stubs.calls("mount") == [] and stubs.calls("docker") == []


@pytest.mark.integration
def test_the_image_pull_is_retried_until_it_succeeds(stubs):
    stubs.add("nvidia-ctk")
    stubs.stub("docker", match="^pull ", rc=1, stderr="toomanyrequests", times=2)
    result = stubs.run(render(stubs))
    assert result.returncode == 0, result.stderr
    assert len([c for c in stubs.calls("docker") if c.args[0] == "pull"]) == 3
    assert stubs.calls("systemctl")[-1].args == ["start", "ftfleet-trainer.service"]


@pytest.mark.integration
def test_an_image_that_never_pulls_tells_the_health_agent_and_starts_no_trainer(stubs):
    stubs.add("nvidia-ctk")
    stubs.stub("docker", match="^pull ", rc=1, stderr="manifest unknown")
    result = stubs.run(render(stubs))
    assert result.returncode != 0
    assert len([c for c in stubs.calls("docker") if c.args[0] == "pull"]) == boot.ATTEMPTS
    assert [c.args for c in stubs.calls("systemctl") if c.args[:1] == ["enable"]] == [
        ["enable", "--now", f"{boot.HEALTH_SERVICE}.service"]
    ]
    assert not (stubs.root / "etc/systemd/system/ftfleet-trainer.service").exists()
    failed = (stubs.root / "run/ftfleet/boot-failed").read_text()
    assert "docker pull" in failed and failed.startswith("startup script failed at line")


@pytest.mark.integration
def test_the_health_agent_is_running_before_anything_can_fail_and_a_new_boot_starts_clean(stubs):
    stubs.add("nvidia-ctk")
    (stubs.root / "run/ftfleet").mkdir(parents=True)
    (stubs.root / "run/ftfleet/boot-failed").write_text("startup script failed at line 1: an earlier boot\n")
    assert stubs.run(render(stubs)).returncode == 0
    order = stubs.order()
    assert first(order, "systemctl enable") < first(order, "apt-get -o")
    assert stubs.calls("systemctl")[1].args == ["enable", "--now", f"{boot.HEALTH_SERVICE}.service"]
    installed = (stubs.root / "usr/local/lib/ftfleet/node_health.py").read_bytes()
    assert installed == boot.HEALTH_AGENT.read_bytes()
    unit = (stubs.root / f"etc/systemd/system/{boot.HEALTH_SERVICE}.service").read_text()
    for line in (
        f"Environment=FTFLEET_HEALTH_PORT={boot.HEALTH_PORT}",
        "Environment=FTFLEET_HEALTH_GPUS=1",
        "Environment=FTFLEET_HEALTH_MOUNT=/ckpt",
        "Environment=FTFLEET_HEALTH_BOOT_FAILED=/run/ftfleet/boot-failed",
        "Restart=always",
        "WantedBy=multi-user.target",
    ):
        assert line in unit.splitlines()
    assert not (stubs.root / "run/ftfleet/boot-failed").exists()


@pytest.mark.integration
def test_parallelstore_runs_the_daos_agent_on_the_access_points_and_mounts_with_dfuse(stubs):
    stubs.add("nvidia-ctk")
    result = stubs.run(render(stubs, kind="parallelstore"))
    assert result.returncode == 0, result.stderr
    agent = (stubs.root / "etc/daos/daos_agent.yml").read_text()
    assert agent.splitlines()[0] == "access_points: ['10.40.240.7', '10.40.240.8', '10.40.240.9']"
    assert "allow_insecure: true" in agent and "iface: ens4" in agent
    order = stubs.order()
    assert first(order, "systemctl enable") < first(order, "dfuse -m") < first(order, "docker pull")
    dfuse = stubs.calls("dfuse")[0].args
    assert dfuse[:2] == ["-m", f"{stubs.root}/ckpt"]
    assert {"--pool", "default-pool", "--container", "default-container", "--multi-user"} <= set(dfuse)
    # dfuse is on the image; the one mount is the snapshots' RAM file system
    assert [c.args[:2] for c in stubs.calls("mount")] == [["-t", "tmpfs"]] and stubs.calls("apt-get") == []


def shutdown(stubs: Stubs, model="SPOT"):
    return stubs.run(boot.shutdown_script(model, root=str(stubs.root)))


@pytest.mark.integration
def test_a_preempted_node_hands_the_notice_to_the_trainer_within_the_spot_budget(stubs):
    stubs.stub("curl", match="instance/preempted", stdout="TRUE")
    stubs.stub("docker", match="^inspect", stdout="true\n")
    result = shutdown(stubs)
    assert result.returncode == 0
    assert [c.args for c in stubs.calls("docker")][-1] == ["stop", "--time", "25", "ftfleet-trainer"]
    assert "preempted=TRUE" in (stubs.root / "var/log/ftfleet/shutdown.log").read_text()


@pytest.mark.integration
def test_a_standard_vm_shutdown_gives_the_trainer_its_longer_budget(stubs):
    stubs.stub("curl", match="instance/preempted", stdout="FALSE")
    stubs.stub("docker", match="^inspect", stdout="true\n")
    assert shutdown(stubs, "STANDARD").returncode == 0
    assert [c.args for c in stubs.calls("docker")][-1] == ["stop", "--time", "100", "ftfleet-trainer"]


@pytest.mark.integration
def test_shutdown_with_no_trainer_running_stops_nothing(stubs):
    stubs.stub("docker", match="^inspect", rc=1, stderr="No such object: ftfleet-trainer")
    assert shutdown(stubs).returncode == 0
    assert [c.args[0] for c in stubs.calls("docker")] == ["inspect"]


@pytest.mark.integration
def test_shutdown_still_stops_the_trainer_when_the_metadata_server_does_not_answer(stubs):
    stubs.stub("curl", match="instance/preempted", rc=7, stderr="Failed to connect")
    stubs.stub("docker", match="^inspect", stdout="true\n")
    result = shutdown(stubs)
    assert result.returncode == 0 and "preempted=UNKNOWN" in result.stderr
    assert stubs.calls("docker")[-1].args[0] == "stop"


def test_boot_scripts_fit_in_a_metadata_value():
    script = boot.startup_script(settings_for(), CTX, "worker", "SPOT")
    assert len(script.encode()) < boot.METADATA_VALUE_LIMIT


# --- the node health agent (what auto-healing probes) ----------------------------------


def agent_module():
    spec = importlib.util.spec_from_file_location("node_health", boot.HEALTH_AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node as the agent sees it: two GPUs, /ckpt mounted, docker up, a clean boot."""
    s = Stubs(tmp_path, names=())
    s.stub("nvidia-smi", stdout="GPU-aaaa\nGPU-bbbb\n")
    s.stub("docker", match="^info", stdout="27.3.1\n")
    mounts = tmp_path / "mounts"
    mounts.write_text("sysfs /sys sysfs rw 0 0\n10.40.240.5@tcp:/ftfleet /ckpt lustre rw 0 0\n")
    monkeypatch.setenv("PATH", f"{s.bin}:/usr/bin:/bin")
    return SimpleNamespace(stubs=s, mounts=mounts, boot_failed=tmp_path / "boot-failed")


def probe(node, path="/healthz", gpus=2) -> tuple[int, dict]:
    """One health checker's GET against a freshly started agent."""
    agent = agent_module()
    server = agent.serve(0, agent.Checker(gpus, "/ckpt", str(node.mounts), str(node.boot_failed)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            body = err.read()
            return err.code, json.loads(body) if body.startswith(b"{") else {}
    finally:
        server.shutdown()


def test_a_node_that_can_run_the_job_is_healthy_with_no_trainer_running(node):
    # Nothing listens on the trainer's metrics port: rendezvous, a restart, a finished run.
    assert probe(node) == (200, {"healthy": True, "problems": {}})


@pytest.mark.parametrize(
    "breakage, check, reason",
    [
        (lambda n: n.mounts.write_text("sysfs /sys sysfs rw 0 0\n"), "mount", "/ckpt is not mounted"),
        (lambda n: n.stubs.stub("nvidia-smi", stdout="GPU-aaaa\n", first=True), "gpus", "1 GPUs visible, expected 2"),
        (lambda n: n.stubs.stub("nvidia-smi", rc=9, stderr="NVIDIA-SMI has failed", first=True), "gpus", "failed"),
        (lambda n: n.stubs.stub("docker", rc=1, stderr="Cannot connect", first=True), "docker", "does not answer"),
        (lambda n: n.boot_failed.write_text("startup script failed at line 9: docker pull x\n"), "boot", "docker pull"),
    ],
)
def test_a_node_that_cannot_run_the_job_answers_503_naming_what_is_wrong(node, breakage, check, reason):
    breakage(node)
    status, body = probe(node)
    assert status == 503 and body["healthy"] is False
    assert list(body["problems"]) == [check] and reason in body["problems"][check]


def test_the_agent_answers_only_its_health_path(node):
    assert probe(node, path="/metrics")[0] == 404


@pytest.mark.integration
def test_the_agent_runs_as_its_unit_runs_it(node, tmp_path):
    """python3 on the file with the unit's environment, as systemd starts it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "PATH": os.environ["PATH"],
        "FTFLEET_HEALTH_PORT": str(port),
        "FTFLEET_HEALTH_GPUS": "2",
        "FTFLEET_HEALTH_MOUNT": "/ckpt",
        "FTFLEET_HEALTH_MOUNTS_FILE": str(node.mounts),
        "FTFLEET_HEALTH_BOOT_FAILED": str(node.boot_failed),
    }
    process = subprocess.Popen([sys.executable, str(boot.HEALTH_AGENT)], env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                    assert response.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=10)
