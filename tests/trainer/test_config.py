"""The config is validated once, with errors that name the key and the fix."""

from __future__ import annotations

import pytest

from ftfleet.errors import ConfigError
from ftfleet.trainer.config import load_config
from tests.trainer.conftest import REPO

TINY = str(REPO / "trainer" / "configs" / "tiny.yaml")


def test_tiny_config_loads_with_defaults_filled_in():
    cfg = load_config(TINY, environ={})
    assert cfg.run_id == "tiny"
    assert cfg.run_dir == "runs/tiny"
    assert cfg.checkpoint.dir == "runs/tiny/checkpoints"
    assert cfg.parallel.mode == "fsdp"


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        TINY,
        [
            "train.steps=7",
            "optim.lr=1e-3",
            "checkpoint.pinned_steps=[2,4]",
            "model.dropout=0",
            "checkpoint.async_save=false",
        ],
        environ={},
    )
    assert cfg.train.steps == 7 and cfg.optim.factories["factory"].args.lr == pytest.approx(1e-3)
    assert cfg.checkpoint.pinned_steps == [2, 4]
    assert cfg.checkpoint.async_save is False


def test_fleet_environment_overrides_the_file_and_the_command_line_overrides_both():
    env = {
        "FTFLEET_RUN_ID": "prod",
        "FTFLEET_CKPT_DIR": "/fsx/ck",
        "FTFLEET_CKPT_URI": "s3://b/p",
        "FTFLEET_CKPT_REPLICA_URI": "s3://r/p",
        "FTFLEET_CKPT_UPLOAD": "fsx-export",
    }
    cfg = load_config(TINY, ["checkpoint.upload=none"], environ=env)
    assert (cfg.run_id, cfg.checkpoint.dir, cfg.checkpoint.uri, cfg.checkpoint.replica_uri) == (
        "prod",
        "/fsx/ck",
        "s3://b/p",
        "s3://r/p",
    )
    assert cfg.checkpoint.upload == "none"


def test_the_fleets_run_directory_holds_the_runs_events_and_summary():
    cfg = load_config(TINY, environ={"FTFLEET_RUN_DIR": "/fsx/runs/prod/i-0abc"})
    assert cfg.run_dir == "/fsx/runs/prod/i-0abc"
    assert cfg.checkpoint.dir == "/fsx/runs/prod/i-0abc/checkpoints"  # unless FTFLEET_CKPT_DIR says otherwise


@pytest.mark.parametrize(
    "override, words",
    [
        ("checkpoint.keep=1", ["checkpoint.keep=1", "at least 2"]),
        ("model.n_heads=3", ["model.d_model", "n_heads"]),
        ("checkpoint.upload=rsync", ["checkpoint.upload", "trainer, fsx-export, none"]),
        ("checkpoint.uri=/tmp/x", ["checkpoint.uri", "s3://"]),
        ("train.steps=abc", ["train.steps", "integer"]),
        ("train.stpes=3", ["train.stpes", "did you mean train.steps"]),
        ("parallel.mode=tp", ["parallel.mode", "fsdp or ddp"]),
        ("checkpoint.multipart_chunk_mb=1", ["multipart_chunk_mb", "5"]),
        ("model.dropout=1.5", ["model.dropout", "[0, 1)"]),
        ("nonsense", ["key.sub=value"]),
        ("train.state_hash=maybe", ["train.state_hash", "true or false"]),
        ("train.state_hsh=true", ["did you mean train.state_hash"]),
        ("resilience.watchdog.drain_timeout_s=0", ["drain_timeout_s=0", "seconds > 0"]),
        ("resilience.watchdog.drain_timeout_s=soon", ["drain_timeout_s", "number"]),
        ("train.steps=[1,", ["train.steps=[1,", "line 1"]),
        ("faults.nan_at_steps=[3]", ["unknown config key faults"]),
        ("checkpoint.async_save=sometimes", ["checkpoint.async_save='sometimes'", "true, false or auto"]),
    ],
)
def test_bad_values_raise_one_line_naming_key_and_fix(override, words):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [override], environ={})
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_bad_upload_mode_from_the_environment_is_refused():
    with pytest.raises(ConfigError, match="checkpoint.upload"):
        load_config(TINY, environ={"FTFLEET_CKPT_UPLOAD": "sometimes"})


def test_missing_config_file_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_config_hash_ignores_run_length_and_parallelism_but_not_the_model():
    base = load_config(TINY, environ={}).config_hash()
    assert (
        load_config(
            TINY,
            ["train.steps=999", "parallel.mode=ddp", "resilience.interval.fixed_steps=7", "train.state_hash=true"],
            environ={},
        ).config_hash()
        == base
    )
    assert load_config(TINY, ["model.d_model=128"], environ={}).config_hash() != base
    assert load_config(TINY, ["train.global_batch_size=24"], environ={}).config_hash() != base


@pytest.mark.integration
def test_trainer_exits_2_with_one_line_on_bad_config_under_ftfleet_torchrun(tmp_path):
    """Two ranks find the same bad key: one line in all (local rank 0's), and the
    launcher exits with the trainer's 2 (torchrun's own traceback and warnings gone)."""
    import subprocess

    from tests.trainer.conftest import BIN, child_env

    launch = [str(BIN / "ftfleet"), "torchrun", "--standalone", "--nproc-per-node=2", "-m", "ftfleet.trainer"]
    proc = subprocess.run(
        [*launch, "--config", TINY, "checkpoint.keep=1", f"run_dir={tmp_path}"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: checkpoint.keep=1")


def run_python(*args: str):
    """``python ARGS`` in the tests' child environment, its output captured."""
    import subprocess
    import sys

    from tests.trainer.conftest import child_env

    return subprocess.run([sys.executable, *args], env=child_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_a_quick_exit_keeps_the_code_the_atexit_handlers_the_threads_and_the_buffered_output():
    """The entry points end with exit_quickly: the threads' shutdown (a job on a pool and
    a non-daemon thread finish), the atexit handlers and the flush of stdout run; what is
    skipped is the modules' teardown (a plain sys.exit, for comparison, runs the
    collector's last pass: the cycle's finalizer)."""
    code = (
        "import atexit, sys, threading, time; from concurrent.futures import ThreadPoolExecutor\n"
        "from ftfleet.trainer.__main__ import exit_quickly\n"
        "class Cycle:\n"
        "    def __del__(self): print('collected at exit', file=sys.stderr)\n"
        "c = Cycle(); c.me = c; del c\n"  # only the collector's last pass would finalize it
        "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
        "def late(what, s): time.sleep(s); sys.stderr.write(what + '\\n')\n"
        "ThreadPoolExecutor(1).submit(late, 'pool job done', 0.2)\n"
        "threading.Thread(target=late, args=('thread done', 0.4)).start()\n"
        "sys.stdout.write('buffered, no newline'); {exit}(75)"
    )
    for exit, last in (("exit_quickly", set()), ("sys.exit", {"collected at exit"})):
        proc = run_python("-c", code.format(exit=exit))
        assert (proc.returncode, proc.stdout) == (75, "buffered, no newline"), (exit, proc.stderr)
        lines = proc.stderr.splitlines()
        assert set(lines[:2]) == {"pool job done", "thread done"} and lines[2:3] == ["atexit ran"], (exit, lines)
        assert set(lines[3:]) == last, (exit, lines)


@pytest.mark.integration
def test_a_quick_exit_under_a_profiler_leaves_the_profile(tmp_path):
    """``python -m cProfile`` writes its file on the way out, past exit_quickly: under a
    profiler or a tracer it is sys.exit."""
    script = tmp_path / "main.py"
    script.write_text("from ftfleet.trainer.__main__ import exit_quickly\nexit_quickly(5)\n")
    out = tmp_path / "main.prof"
    proc = run_python("-m", "cProfile", "-o", str(out), str(script))
    # (cProfile's runner swallows SystemExit: its exit status is 0 whatever the code.)
    assert proc.returncode == 0 and out.is_file() and out.stat().st_size > 0, proc.stderr


@pytest.mark.integration
def test_a_quick_exit_is_not_killed_by_gloos_threads_finishing_a_collective():
    """A gloo worker thread that releases a finished collective's tensors needs the GIL;
    asking for it while the interpreter finalizes ends the thread with an unwind that
    calls std::terminate (trainer/__main__.py: exit_quickly). Here the GIL stays with
    the main thread from the collective to the exit (a switch interval of 30 s), so a
    worker thread holding the last reference to the work is still waiting for it then:
    a plain sys.exit dies of the signal, and exit_quickly exits with its code."""
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "from ftfleet.trainer.__main__ import exit_quickly\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "group = dist.new_group(backend='gloo')\n"
        "data = torch.ones(1 << 24)\n"  # 64 MiB: the copy outlasts the next two lines
        "sys.setswitchinterval(30)\n"
        "out = [torch.zeros(1 << 24)]\n"
        "work = dist.all_gather(out, data, group=group, async_op=True)\n"
        "print('raced' if work.is_completed() else 'in flight', file=sys.stderr, flush=True)\n"
        "del work, out\n"  # the worker thread now holds the last reference
        "sum(range(10**7))\n"  # holds the GIL while the worker thread finishes the collective
        "{exit}(3)"
    )
    control = run_python("-c", code.format(exit="sys.exit"))
    if control.returncode == 3:
        # The collective finished before its last reference moved to the worker thread
        # ("raced"), or this torch and Python no longer crash here (then exit_quickly's
        # os._exit is no longer needed for this, and its docstring should say so).
        said = [line for line in control.stderr.splitlines() if line in ("raced", "in flight")]
        pytest.skip(f"a plain sys.exit did not crash (the collective: {said})")
    assert control.returncode in (-6, -11), control.stderr[-600:]  # SIGABRT, at times SIGSEGV
    quick = run_python("-c", code.format(exit="exit_quickly"))
    assert quick.returncode == 3, quick.stderr[-600:]


def run_cli(*args: str, cwd=REPO, env: dict | None = None, module: str = "ftfleet.trainer"):
    import subprocess
    import sys

    from tests.trainer.conftest import child_env

    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.integration
def test_malformed_yaml_is_one_line_naming_the_file_and_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1, 2\n  log_every: 5\n")
    line = one_error_line(run_cli("--config", str(bad), f"run_dir={tmp_path / 'run'}"))
    assert str(bad) in line and "line 3" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_running_without_a_config_is_refused_and_writes_nothing(tmp_path):
    line = one_error_line(run_cli(cwd=tmp_path))
    assert "--config" in line and "FTFLEET_CONFIG" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_a_global_batch_the_world_size_does_not_divide_is_refused_before_the_process_group(tmp_path):
    # WORLD_SIZE=5 without torchrun: init_process_group would fail differently (exit 1).
    proc = run_cli("--config", TINY, f"run_dir={tmp_path / 'run'}", env={"WORLD_SIZE": "5", "RANK": "0"})
    line = one_error_line(proc)
    assert "train.global_batch_size=12" in line and "world size 5" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ["run_dir", "checkpoint.dir"])
def test_an_unwritable_directory_is_refused_before_training(tmp_path, key):
    from ftfleet.trainer.preflight import preflight

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    overrides = [f"run_dir={tmp_path / 'run'}", f"{key}={blocker / 'sub'}"]
    with pytest.raises(ConfigError) as err:
        preflight(load_config(TINY, overrides, environ={}), environ={})
    assert str(err.value).startswith(f"{key}='{blocker / 'sub'}' is not writable")


@pytest.mark.integration
def test_injected_faults_get_the_config_treatment(tmp_path):
    proc = run_cli("--config", TINY, f"run_dir={tmp_path}", "faults.nan_at_step=[3]", module="drill.worker")
    assert "did you mean faults.nan_at_steps?" in one_error_line(proc)
    proc = run_cli("--config", TINY, f"run_dir={tmp_path}", "faults.hang_at_step=0", module="drill.worker")
    assert "faults.hang_at_step=0: use a step >= 1" in one_error_line(proc)


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", True), ("no", False), ("AUTO", None)])
def test_async_save_is_true_false_or_auto(value, expected):
    if expected is None:
        with pytest.raises(ConfigError, match="true, false or auto"):
            load_config(TINY, [f"checkpoint.async_save={value}"], environ={})
        return
    assert load_config(TINY, [f"checkpoint.async_save={value}"], environ={}).checkpoint.async_save == expected
