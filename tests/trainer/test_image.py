"""The trainer image cannot be built here, so its Dockerfile and entrypoint are linted,
and the entrypoint is run with a stand-in torchrun and a stand-in in-process launcher,
also as the image's own user."""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ftfleet import contract, hostenv
from ftfleet.contract import ENV_NAMES, EXIT_CONFIG, EXIT_PREEMPTED, TRAINER_ENV
from tests.infra.bootstub import shellcheck
from tests.trainer.resilience.helpers import REPO, subprocess_env

DOCKERFILE = REPO / "trainer" / "Dockerfile"
ENTRYPOINT = REPO / "trainer" / "docker-entrypoint"
CONSTRAINTS = REPO / "constraints.txt"
#: Variables of the tools in the image, set by the Dockerfile itself.
TOOL_ENV = {
    "DEBIAN_FRONTEND",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PIP_NO_CACHE_DIR",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "VIRTUAL_ENV",
    "PATH",
    "LD_LIBRARY_PATH",
}


def instructions():
    """(INSTRUCTION, arguments) pairs, with continuations joined and comments dropped."""
    out, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def values(name):
    return [rest for word, rest in instructions() if word == name]


def env_names_set():
    names = set()
    for rest in values("ENV") + values("ARG"):
        names |= set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", " " + rest))
    return names


def build_args():
    return {rest.split("=", 1)[0] for rest in values("ARG")}


def run_steps():
    return " && ".join(values("RUN"))


def torch_pin() -> str:
    (pin,) = re.findall(r"^torch==(\S+)$", CONSTRAINTS.read_text(), re.M)
    return pin


def test_the_base_is_an_official_ubuntu_image_pinned_by_tag():
    (base,) = values("FROM")
    image, _, tag = base.partition(":")
    assert image == "ubuntu"
    assert re.fullmatch(r"\d+\.\d+", tag), base


def test_the_image_installs_exactly_the_torch_that_ci_tests():
    pin = torch_pin()
    steps = run_steps()
    # constraints.txt as CI uses it: copied, not filtered, and the install goes through it.
    assert "constraints.txt" in " ".join(values("COPY"))
    assert "pip install --constraint constraints.txt '.[trainer]'" in steps
    assert not re.search(r"grep -v[^&]*torch", steps), "the Dockerfile filters torch out of constraints.txt"
    # No other torch: no pytorch base image, no second pin, no other index.
    text = DOCKERFILE.read_text()
    other_pins = set(re.findall(r"torch\s*[=<>~!]=?\s*v?(\d[\w.]*)", text)) - {pin}
    assert not other_pins, f"the Dockerfile pins torch {other_pins}, CI tests {pin}"
    assert not re.search(r"pytorch/pytorch|nvcr\.io/nvidia/pytorch|--(extra-)?index-url", text)
    # The build itself refuses an image whose torch differs from the pin.
    assert 'import torch; print(torch.__version__.split("+")[0])' in steps
    assert "$(sed -n 's/^torch==//p' constraints.txt)" in steps


def test_the_image_user_is_the_contracts_uid():
    uid = str(contract.TRAINER_UID)
    steps = run_steps()
    assert re.search(rf"groupadd --gid {uid} ftfleet", steps)
    assert re.search(rf"useradd --uid {uid} --gid {uid} ", steps)
    assert values("USER")[-1] == f"{uid}:{uid}"


def test_the_metrics_port_is_the_contracts():
    env = dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", " ".join(values("ENV"))))
    assert env["FTFLEET_METRICS_PORT"] == str(contract.METRICS_PORT)
    (exposed,) = values("EXPOSE")
    assert exposed == f"{contract.METRICS_PORT}-{contract.METRICS_PORT + contract.MAX_LOCAL_RANKS - 1}"


def test_the_entrypoint_reads_the_agent_exit_file_where_the_contract_puts_it():
    script = ENTRYPOINT.read_text()
    expected = '"${TMPDIR:-/tmp}/' + contract.AGENT_EXIT_FILE.format(pid="$agent") + '"'
    assert f"exit_file={expected}" in script


def test_efa_user_space_is_installed_the_way_aws_documents_for_containers():
    steps = run_steps()
    assert "./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify" in steps
    version = next(rest for rest in values("ARG") if rest.startswith("EFA_INSTALLER_VERSION="))
    assert re.fullmatch(r"EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", version)  # pinned, not latest
    assert "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in steps
    assert 'gpg --verify "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz.sig"' in steps
    # NCCL finds libfabric and the aws-ofi-nccl plugin on LD_LIBRARY_PATH; the build checks both are there.
    env = dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", " ".join(values("ENV"))))
    library_path = env["LD_LIBRARY_PATH"].split(":")
    assert {"/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib"} <= set(library_path)
    assert "test -e /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so" in steps
    assert "test -e /opt/amazon/efa/lib/libfabric.so" in steps


def test_efa_settings_are_not_baked_into_the_image():
    # Only the entrypoint sets them, and only when the node passed EFA devices in.
    set_here = env_names_set()
    assert not set_here & set(contract.EFA_ENV), set_here & set(contract.EFA_ENV)
    assert "efa_env()" in ENTRYPOINT.read_text()


def test_the_image_allocates_host_memory_with_jemalloc_and_checks_it_is_there():
    steps = run_steps()
    assert re.search(r"apt-get install [^&]*\blibjemalloc2\b", steps)
    assert 'test -e "/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2"' in steps
    env = dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", " ".join(values("ENV"))))
    # Asked for by name: a missing library stops the entrypoint instead of training without it.
    assert env["FTFLEET_HOST_ALLOCATOR"] == "jemalloc"
    assert "LD_PRELOAD" not in env  # only torchrun and its workers get it, from the entrypoint
    assert "host_memory_env()" in ENTRYPOINT.read_text()


def test_the_image_runs_as_a_non_root_user():
    users = values("USER")
    assert users, "no USER instruction"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    names = [w for w, _ in instructions()]
    assert names.index("USER") < names.index("ENTRYPOINT")


def test_the_entrypoint_checks_the_contract_then_runs_torchrun():
    (entry,) = values("ENTRYPOINT")
    assert json.loads(entry) == ["/opt/ftfleet/trainer/docker-entrypoint"]
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR
    script = ENTRYPOINT.read_text()
    assert "check_env()" in script
    launch = script.split("\ntorchrun ")[-1].split("\nagent=")[0]
    assert launch.rstrip().endswith('"$@" &')
    assert json.loads(values("CMD")[0]) == ["--module", "ftfleet.trainer"]
    assert (REPO / "trainer" / "__main__.py").exists()


def test_every_variable_the_image_relies_on_is_a_contract_name():
    # Lower-case names are the entrypoint's own shell variables; TMPDIR is the system's;
    # build arguments live only while the image is built.
    referenced = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", DOCKERFILE.read_text() + ENTRYPOINT.read_text()))
    referenced -= {"TMPDIR"} | build_args()
    assert referenced <= ENV_NAMES, referenced - ENV_NAMES
    set_here = env_names_set()
    assert set_here <= ENV_NAMES | TOOL_ENV | build_args(), set_here - ENV_NAMES - TOOL_ENV - build_args()
    contract_like = {n for n in re.findall(r"FTFLEET_[A-Z0-9_]+", DOCKERFILE.read_text() + ENTRYPOINT.read_text())}
    assert contract_like <= ENV_NAMES, contract_like - ENV_NAMES


def test_every_copied_path_exists():
    for rest in values("COPY"):
        *sources, _dest = rest.split()
        for source in sources:
            assert (REPO / source).exists(), source


@pytest.mark.integration
def test_the_entrypoint_shell_script_parses_and_passes_shellcheck(tmp_path):
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)
    assert shellcheck(ENTRYPOINT.read_text(), tmp_path, shell="sh") == ""


@pytest.fixture
def fake_bin(tmp_path):
    """A PATH with this interpreter as `python` and a torchrun that prints its argv."""
    (tmp_path / "python").symlink_to(sys.executable)
    torchrun = tmp_path / "torchrun"
    torchrun.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    torchrun.chmod(0o755)
    return tmp_path


def contract_env(fake_bin, **overrides):
    """The contract's examples, which pick torchrun (FTFLEET_LAUNCHER's example): the
    in-process launcher's tests unset it or name it."""
    env = subprocess_env(PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    env.update({v.name: v.example for v in TRAINER_ENV})
    # Directories this process can write (the examples name /fsx, which is not here).
    env.update(FTFLEET_CKPT_DIR=str(fake_bin / "ckpt"), FTFLEET_RUN_DIR=str(fake_bin / "run"))
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.integration
def test_the_entrypoint_passes_the_contract_to_torchrun(fake_bin):
    result = subprocess.run(
        [str(ENTRYPOINT), "--module", "ftfleet.trainer"],
        cwd=REPO,
        env=contract_env(fake_bin),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    args = result.stdout.split()
    assert "--nnodes=2:16" in args and "--nproc-per-node=8" in args
    assert "--rdzv-endpoint=coordinator.ftfleet.internal:29400" in args
    assert "--rdzv-id=aws-prod-llm" in args
    assert "--max-restarts=100" in args
    assert args[-2:] == ["--module", "ftfleet.trainer"]


@pytest.mark.integration
def test_the_entrypoint_refuses_an_incomplete_environment(fake_bin):
    result = subprocess.run(
        [str(ENTRYPOINT)],
        cwd=REPO,
        env=contract_env(fake_bin, FTFLEET_RDZV_ENDPOINT=None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_CONFIG
    assert "FTFLEET_RDZV_ENDPOINT" in result.stderr and result.stdout == ""


def fake_torchrun(fake_bin, body):
    torchrun = fake_bin / "torchrun"
    torchrun.write_text("#!/bin/sh\n" + body)
    torchrun.chmod(0o755)


def run_entrypoint(fake_bin, tmp_path, **kw):
    env = contract_env(fake_bin, TMPDIR=str(tmp_path))
    return subprocess.run(
        [str(ENTRYPOINT), "--module", "ftfleet.trainer"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


@pytest.mark.integration
def test_a_preempted_node_exits_with_the_code_its_trainer_left(fake_bin, tmp_path):
    # What the trainer does on the node that is going away: leave 75 for its agent's
    # pid, then stop the agent, which exits 1 (SignalException).
    fake_torchrun(fake_bin, f'echo {EXIT_PREEMPTED} > "$TMPDIR/ftfleet-agent-$$.exit"\nexit 1\n')
    result = run_entrypoint(fake_bin, tmp_path)
    assert result.returncode == EXIT_PREEMPTED, result.stderr
    assert not list(tmp_path.glob("ftfleet-agent-*.exit"))  # consumed


@pytest.mark.integration
def test_otherwise_the_entrypoint_exits_with_torchruns_status(fake_bin, tmp_path):
    fake_torchrun(fake_bin, "exit 3\n")
    assert run_entrypoint(fake_bin, tmp_path).returncode == 3


@pytest.mark.integration
def test_the_entrypoint_passes_sigterm_on_to_torchrun(fake_bin, tmp_path):
    got = tmp_path / "got-term"
    fake_torchrun(fake_bin, f"trap 'touch {got}; exit 143' TERM\ntouch {tmp_path}/up\nwhile :; do sleep 0.05; done\n")
    proc = subprocess.Popen(
        [str(ENTRYPOINT), "--module", "ftfleet.trainer"],
        cwd=REPO,
        env=contract_env(fake_bin, TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            if (tmp_path / "up").exists():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        assert got.exists()
    finally:
        proc.kill()


def _mapped_library(stem: str) -> str | None:
    """The path of a shared library this interpreter has loaded (a real ELF object that
    is harmless to preload), or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if os.path.basename(path).startswith(stem + ".so"):
            return path
    return None


@pytest.mark.integration
def test_the_entrypoint_preloads_the_host_allocator_for_torchrun(fake_bin):
    fake_torchrun(fake_bin, 'printf "preload=%s conf=%s\\n" "${LD_PRELOAD:-}" "${MALLOC_CONF:-}"\n')
    library = _mapped_library("libm")
    if library is None:
        pytest.skip("no libm mapped in this interpreter to preload")

    def entrypoint(allocator: str) -> subprocess.CompletedProcess[str]:
        env = contract_env(fake_bin, FTFLEET_HOST_ALLOCATOR=allocator, LD_PRELOAD=None, MALLOC_CONF=None)
        return subprocess.run([str(ENTRYPOINT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    result = entrypoint(library)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"preload={library} conf="
    result = entrypoint("system")
    assert result.returncode == 0 and result.stdout.strip() == "preload= conf="
    for bad, why in (("tcmalloc", "use jemalloc, system"), ("/nowhere/libjemalloc.so.2", "no such file")):
        result = entrypoint(bad)
        assert result.returncode == EXIT_CONFIG and result.stdout == ""
        assert "FTFLEET_HOST_ALLOCATOR" in result.stderr and why in result.stderr, result.stderr


@pytest.mark.integration
def test_the_entrypoint_gives_torchrun_glibcs_copy_threshold_and_keeps_the_callers(fake_bin):
    fake_torchrun(fake_bin, 'printf "tunables=%s\\n" "${GLIBC_TUNABLES:-}"\n')

    def entrypoint(**env: str | None) -> str:
        env = contract_env(fake_bin, FTFLEET_HOST_ALLOCATOR="system", **env)
        result = subprocess.run([str(ENTRYPOINT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    callers = "glibc.malloc.arena_max=2"
    expected = hostenv.copy_tunables_env({"GLIBC_TUNABLES": callers})  # {} where glibc's default is low already
    want = expected.get("GLIBC_TUNABLES", callers)
    assert entrypoint(GLIBC_TUNABLES=callers) == f"tunables={want}"
    theirs = f"{hostenv.NON_TEMPORAL_TUNABLE}=0x10000000"
    assert entrypoint(GLIBC_TUNABLES=theirs) == f"tunables={theirs}"


@pytest.mark.integration
def test_max_restarts_defaults_to_100_and_must_be_a_number(fake_bin):
    result = subprocess.run(
        [str(ENTRYPOINT)],
        cwd=REPO,
        env=contract_env(fake_bin, FTFLEET_MAX_RESTARTS=None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "--max-restarts=100" in result.stdout.split()
    result = subprocess.run(
        [str(ENTRYPOINT)],
        cwd=REPO,
        env=contract_env(fake_bin, FTFLEET_MAX_RESTARTS="lots"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_CONFIG and "FTFLEET_MAX_RESTARTS" in result.stderr


# ---------------------------------------------------------------------------
# The in-process launcher, the default
# ---------------------------------------------------------------------------


def fake_inprocess(fake_bin: Path, rc: int = 0) -> None:
    """Make `python -m ftfleet.trainer.inprocess` a stand-in that prints its pid, the
    stores' address it was given and its argv (one per line), then exits ``rc``; any
    other `python` is this interpreter (the entrypoint's contract check)."""
    (fake_bin / "python").unlink(missing_ok=True)
    (fake_bin / "python").write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "-m ftfleet.trainer.inprocess" ]; then\n'
        "    shift 2\n"
        '    printf "pid=%s preload=%s " "$$" "${LD_PRELOAD:-}"\n'
        '    printf "addr=%s port=%s\\n" "${MASTER_ADDR:-}" "${MASTER_PORT:-}"\n'
        '    printf "%s\\n" "$@"\n'
        f"    exit {rc}\n"
        "fi\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    (fake_bin / "python").chmod(0o755)


def inprocess(fake_bin, *args: str, rc: int = 0, **env: str | None) -> subprocess.CompletedProcess[str]:
    fake_inprocess(fake_bin, rc)
    env = contract_env(fake_bin, **{"FTFLEET_LAUNCHER": None, **env})
    return subprocess.run([str(ENTRYPOINT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def launched(result: subprocess.CompletedProcess[str]) -> tuple[dict[str, str], list[str]]:
    """(what the stand-in launcher printed of its environment, its argv)."""
    first, *argv = result.stdout.splitlines()
    return dict(item.split("=", 1) for item in first.split()), argv


@pytest.mark.integration
def test_by_default_the_entrypoint_runs_a_node_of_the_in_process_launcher(fake_bin):
    result = inprocess(fake_bin, "--module", "ftfleet.trainer", FTFLEET_SPARE_NODES="3", FTFLEET_SPARE_PROCESSES="2")
    assert result.returncode == 0, result.stderr
    env, argv = launched(result)
    assert (env["addr"], env["port"]) == ("coordinator.ftfleet.internal", "29400")  # FTFLEET_RDZV_ENDPOINT
    # FTFLEET_NNODES 2:16 with 8 processes a node: 16 nodes train, the world may shrink to 2 nodes' ranks.
    assert argv == [
        *("--nproc", "8", "--spares", "2", "--nnodes", "16", "--min-ranks", "16", "--spare-nodes", "3"),
        *("--node-rank", "auto", "--no-host-stores", "--master-addr", "coordinator.ftfleet.internal", "--"),
    ]  # the image's CMD names the reference trainer, which the workers run: dropped


@pytest.mark.integration
def test_a_fixed_node_count_never_lets_the_world_shrink_and_spares_default_to_one_process(fake_bin):
    result = inprocess(
        fake_bin,
        "--config",
        "/opt/ftfleet/trainer/configs/tiny.yaml",
        "train.steps=10",
        FTFLEET_NNODES="3",
        FTFLEET_SPARE_NODES=None,
        FTFLEET_SPARE_PROCESSES=None,
    )
    assert result.returncode == 0, result.stderr
    _, argv = launched(result)
    assert "--min-ranks" not in argv
    assert argv[argv.index("--nnodes") + 1] == "3"
    assert argv[argv.index("--spares") + 1] == "1" and argv[argv.index("--spare-nodes") + 1] == "0"
    assert argv[argv.index("--") :] == ["--", "--config", "/opt/ftfleet/trainer/configs/tiny.yaml", "train.steps=10"]


@pytest.mark.integration
def test_the_in_process_launcher_replaces_the_entrypoint_and_its_exit_code_is_the_nodes(fake_bin, tmp_path):
    fake_inprocess(fake_bin, rc=EXIT_PREEMPTED)
    env = contract_env(
        fake_bin, FTFLEET_LAUNCHER="inprocess", FTFLEET_HOST_ALLOCATOR=_mapped_library("libm") or "system"
    )
    proc = subprocess.Popen(
        [str(ENTRYPOINT)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, err
    first = dict(item.split("=", 1) for item in out.splitlines()[0].split())
    # The same process: `docker stop`'s SIGTERM reaches the launcher, which forwards it to its workers.
    assert first["pid"] == str(proc.pid)
    assert first["preload"] == (_mapped_library("libm") or "")  # the host allocator, as for torchrun


@pytest.mark.integration
def test_stores_runs_the_coordinators_store_service_and_needs_only_the_endpoint(fake_bin):
    fake_inprocess(fake_bin)
    env = subprocess_env(PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}", FTFLEET_RDZV_ENDPOINT="10.40.0.10:29400")
    result = subprocess.run([str(ENTRYPOINT), "stores"], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    first, argv = launched(result)
    assert first["port"] == "29400"  # and 29401: the launcher's second store
    assert argv == ["--nproc", "0", "--host-stores", "--master-addr", "0.0.0.0"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, env, named",
    [
        ((), {"FTFLEET_LAUNCHER": "elastic"}, "FTFLEET_LAUNCHER='elastic': use inprocess or torchrun"),
        (("stores",), {"FTFLEET_LAUNCHER": "mpirun"}, "FTFLEET_LAUNCHER='mpirun'"),
        (("stores",), {"FTFLEET_LAUNCHER": "torchrun"}, "run the image without 'stores'"),
        (("stores", "--nproc", "2"), {}, "stores takes no arguments"),
        (("train.py",), {}, "for the training program 'train.py' set FTFLEET_LAUNCHER=torchrun"),
        (("--module", "mytrainer"), {}, "for the training program '--module mytrainer' set FTFLEET_LAUNCHER=torchrun"),
        ((), {"FTFLEET_NNODES": "4:2"}, "FTFLEET_NNODES='4:2'"),
        ((), {"FTFLEET_NNODES": "auto"}, "FTFLEET_NNODES='auto': use N or MIN:MAX"),
        ((), {"FTFLEET_NPROC_PER_NODE": "gpu"}, "FTFLEET_NPROC_PER_NODE='gpu'"),
        ((), {"FTFLEET_RDZV_ENDPOINT": "coordinator"}, "FTFLEET_RDZV_ENDPOINT='coordinator': use host:port"),
        ((), {"FTFLEET_SPARE_NODES": "one"}, "FTFLEET_SPARE_NODES='one': use a whole number"),
        ((), {"FTFLEET_SPARE_PROCESSES": "-1"}, "FTFLEET_SPARE_PROCESSES='-1': use a whole number"),
    ],
)
def test_a_bad_launcher_setting_is_refused_in_one_line_before_anything_runs(fake_bin, args, env, named):
    result = inprocess(fake_bin, *args, **env)
    assert result.returncode == EXIT_CONFIG
    (line,) = result.stderr.splitlines()
    assert line.startswith("docker-entrypoint: ") and named in line, line
    assert result.stdout == ""  # no launcher ran


# ---------------------------------------------------------------------------
# The entrypoint as the image's own user (uid 10001, not root)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def image_user():
    """(uid, argv prefix, python) to run the entrypoint as the image's user: uid 10001
    through setpriv when the tests run as root, else this (already unprivileged) user;
    python: an interpreter that user can run (the entrypoint's check needs only the
    standard library and the repository's ftfleet/)."""
    if os.geteuid() != 0:
        return os.getuid(), [], sys.executable
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): cannot drop to the image's uid")
    uid = str(contract.TRAINER_UID)
    prefix = [setpriv, "--reuid", uid, "--regid", uid, "--clear-groups"]
    # An interpreter under a root-only directory (a pyenv in /root) cannot be run by uid
    # 10001 from a shell, as the entrypoint runs it.
    for python in (sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"):
        probe = subprocess.run(
            [*prefix, "/bin/sh", "-c", f'exec "{python}" -c "import sys; assert sys.version_info >= (3, 10)"'],
            capture_output=True,
            cwd="/",
        )
        if probe.returncode == 0:
            return contract.TRAINER_UID, prefix, python
    pytest.skip(f"no Python interpreter that uid {uid} can run from a shell")


@pytest.fixture
def shared_tmp():
    """A directory the image's user can reach (pytest's own tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ftfleet-image-user-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_image_user(image_user, shared_tmp, **overrides):
    _, prefix, python = image_user
    bin_dir = shared_tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(python)
        (bin_dir / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\nenv | grep -E "^(FI|NCCL)_" || true\n')
        (bin_dir / "torchrun").chmod(0o755)
    env = contract_env(bin_dir, TMPDIR=str(shared_tmp), **overrides)
    return subprocess.run(
        [*prefix, str(ENTRYPOINT), "--module", "ftfleet.trainer"],
        cwd=overrides.pop("cwd", shared_tmp),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def owned_by(path: Path, uid: int, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid) if os.geteuid() == 0 else None
    path.chmod(mode)
    return path


@pytest.mark.integration
def test_as_the_image_user_the_entrypoint_starts_torchrun_when_its_directories_are_its_own(image_user, shared_tmp):
    uid, _, _ = image_user
    ckpt = owned_by(shared_tmp / "fsx" / "ckpt", uid)
    run = owned_by(shared_tmp / "fsx" / "runs" / "node", uid)
    result = as_image_user(image_user, shared_tmp, FTFLEET_CKPT_DIR=str(ckpt), FTFLEET_RUN_DIR=str(run))
    assert result.returncode == 0, result.stderr
    assert "--module" in result.stdout.split()
    # No EFA devices here: nothing of EFA's is set for the trainer.
    assert not re.search(r"^(FI_PROVIDER|NCCL_NET_PLUGIN)=", result.stdout, re.M)


@pytest.mark.integration
@pytest.mark.parametrize(
    "unwritable, named",
    [
        ("ckpt", "FTFLEET_CKPT_DIR"),
        ("ckpt/markers", "the commit marker directory"),
        ("run", "FTFLEET_RUN_DIR"),
    ],
)
def test_as_the_image_user_a_directory_it_cannot_write_stops_the_entrypoint_before_torch(
    image_user, shared_tmp, unwritable, named
):
    uid, _, _ = image_user
    dirs = {name: owned_by(shared_tmp / "fsx" / name, uid) for name in ("ckpt", "ckpt/markers", "run")}
    dirs[unwritable].chmod(0o555)  # read-only, even for its owner
    result = as_image_user(image_user, shared_tmp, FTFLEET_CKPT_DIR=str(dirs["ckpt"]), FTFLEET_RUN_DIR=str(dirs["run"]))
    assert result.returncode == EXIT_CONFIG
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"docker-entrypoint: {named} {dirs[unwritable]} is not writable")
    assert f"for uid {uid}:" in line
    assert result.stdout == ""  # torchrun never ran


@pytest.mark.integration
def test_as_the_image_user_an_unset_run_dir_under_a_root_owned_workdir_is_refused(image_user, shared_tmp):
    uid, _, _ = image_user
    ckpt = owned_by(shared_tmp / "fsx" / "ckpt", uid)
    workdir = owned_by(shared_tmp / "opt" / "ftfleet", uid, mode=0o555)  # like the image's WORKDIR
    result = as_image_user(image_user, shared_tmp, FTFLEET_CKPT_DIR=str(ckpt), FTFLEET_RUN_DIR=None, cwd=workdir)
    assert result.returncode == EXIT_CONFIG
    (line,) = result.stderr.splitlines()
    assert f"the run directory runs/aws-prod-llm (relative to {workdir})" in line
    assert "set FTFLEET_RUN_DIR" in line


def test_efa_settings_follow_the_devices_the_container_sees(tmp_path):
    assert hostenv.efa_env(str(tmp_path / "none")) == {}
    devices = tmp_path / "infiniband"
    devices.mkdir()
    (devices / "rdma_cm").touch()
    assert hostenv.efa_env(str(devices)) == {}
    (devices / "uverbs0").touch()
    assert hostenv.efa_env(str(devices)) == {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi"}


def test_directories_still_to_be_created_pass_and_a_file_in_the_way_is_named(tmp_path):
    env = {"FTFLEET_RUN_ID": "r", "FTFLEET_RUN_DIR": str(tmp_path / "runs" / "node"), "FTFLEET_CKPT_DIR": ""}
    contract.check_writable_dirs(env)  # created by the trainer later: its parent is writable
    (tmp_path / "fsx").write_text("not a directory")
    env["FTFLEET_CKPT_DIR"] = str(tmp_path / "fsx" / "checkpoints")
    with pytest.raises(contract.ContractError) as err:
        contract.check_writable_dirs(env)
    assert str(err.value).startswith(f"FTFLEET_CKPT_DIR {tmp_path}/fsx/checkpoints cannot be created ({tmp_path}/fsx")
    assert "\n" not in str(err.value) and err.value.exit_code == EXIT_CONFIG
