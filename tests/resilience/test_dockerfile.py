"""The trainer image cannot be built here, so its Dockerfile and entrypoint are linted,
and the entrypoint is run with a stand-in torchrun."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import pytest

from ftfleet.contract import ENV_NAMES, EXIT_CONFIG, EXIT_PREEMPTED, TRAINER_ENV

from .helpers import REPO, subprocess_env

DOCKERFILE = REPO / "trainer" / "Dockerfile"
ENTRYPOINT = REPO / "trainer" / "docker-entrypoint"
#: Variables of the tools in the image, set by the Dockerfile itself.
TOOL_ENV = {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK"}


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


def test_the_base_is_an_official_pytorch_runtime_image_pinned_by_tag():
    (base,) = values("FROM")
    image, _, tag = base.partition(":")
    assert image == "pytorch/pytorch"
    assert tag and tag != "latest" and "$" not in base
    assert re.fullmatch(r"\d+\.\d+\.\d+-cuda[\d.]+-cudnn\d+-runtime", tag)


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
    # Lower-case names are the entrypoint's own shell variables; TMPDIR is the system's.
    referenced = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", DOCKERFILE.read_text() + ENTRYPOINT.read_text())) - {
        "TMPDIR"
    }
    assert referenced <= ENV_NAMES, referenced - ENV_NAMES
    set_here = env_names_set()
    assert set_here <= ENV_NAMES | TOOL_ENV, set_here - ENV_NAMES - TOOL_ENV
    contract_like = {n for n in re.findall(r"FTFLEET_[A-Z0-9_]+", DOCKERFILE.read_text() + ENTRYPOINT.read_text())}
    assert contract_like <= ENV_NAMES, contract_like - ENV_NAMES


def test_every_copied_path_exists():
    for rest in values("COPY"):
        *sources, _dest = rest.split()
        for source in sources:
            assert (REPO / source).exists(), source


def test_the_entrypoint_shell_script_parses():
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)


@pytest.fixture
def fake_bin(tmp_path):
    """A PATH with this interpreter as `python` and a torchrun that prints its argv."""
    (tmp_path / "python").symlink_to(sys.executable)
    torchrun = tmp_path / "torchrun"
    torchrun.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    torchrun.chmod(0o755)
    return tmp_path


def contract_env(fake_bin, **overrides):
    env = subprocess_env(PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    env.update({v.name: v.example for v in TRAINER_ENV})
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


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


def test_a_preempted_node_exits_with_the_code_its_trainer_left(fake_bin, tmp_path):
    # What the trainer does on the node that is going away: leave 75 for its agent's
    # pid, then stop the agent, which exits 1 (SignalException).
    fake_torchrun(fake_bin, f'echo {EXIT_PREEMPTED} > "$TMPDIR/ftfleet-agent-$$.exit"\nexit 1\n')
    result = run_entrypoint(fake_bin, tmp_path)
    assert result.returncode == EXIT_PREEMPTED, result.stderr
    assert not list(tmp_path.glob("ftfleet-agent-*.exit"))  # consumed


def test_otherwise_the_entrypoint_exits_with_torchruns_status(fake_bin, tmp_path):
    fake_torchrun(fake_bin, "exit 3\n")
    assert run_entrypoint(fake_bin, tmp_path).returncode == 3


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
