"""The trainer reads its FTFLEET_* variables in one place, each checked when it is used."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ftfleet.contract import ENV_NAMES
from ftfleet.errors import ConfigError
from ftfleet.trainer import environment
from ftfleet.trainer.environment import TrainerEnvironment

TRAINER = Path(environment.__file__).resolve().parent
NAME = re.compile(r"FTFLEET_[A-Z0-9_]+")


def _names_outside_docstrings(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and NAME.fullmatch(node.value)
    }


def test_no_module_of_the_trainer_but_the_environment_names_an_ftfleet_variable():
    offenders = {
        str(path.relative_to(TRAINER)): names
        for path in sorted(TRAINER.rglob("*.py"))
        if path.name != "environment.py" and (names := _names_outside_docstrings(path))
    }
    assert offenders == {}, "read them through ftfleet.trainer.environment.TrainerEnvironment"


def test_every_variable_it_reads_is_the_contracts_or_the_in_process_launchers():
    read = _names_outside_docstrings(Path(environment.__file__))
    launcher = {
        environment.ACTIVE_WORLD_SIZE,
        environment.MIN_ACTIVE_WORLD_SIZE,
        environment.GROUP_SIZE,
        environment.LAUNCHER_PID,
        environment.INPROCESS_LAYOUT,
        environment.INPROCESS_RANK_FILE,
        environment.WARM_READY_FILE,
    }
    assert read - launcher <= ENV_NAMES, read - launcher - ENV_NAMES
    assert set(environment.CONFIG_OVERRIDES) <= ENV_NAMES


def test_unset_variables_read_as_their_defaults():
    env = TrainerEnvironment({})
    assert (env.node_id, env.cloud, env.aws_region, env.metadata_endpoint, env.metrics_port) == (
        "",
        "none",
        None,
        None,
        0,
    )
    assert (env.log_format, env.config_file, env.active_world_size, env.config_overrides()) == ("text", None, None, [])


def test_the_in_process_layout_is_read_or_refused_in_one_line():
    from ftfleet.trainer.inprocess.ranks import Layout

    assert TrainerEnvironment({environment.INPROCESS_LAYOUT: "2:1:4:0"}).inprocess_layout == Layout(2, 1, 4, 0)
    with pytest.raises(ConfigError) as exc:
        _ = TrainerEnvironment({environment.INPROCESS_LAYOUT: "2:1"}).inprocess_layout
    assert str(exc.value).startswith("FTFLEET_INPROCESS_LAYOUT=") and "\n" not in str(exc.value)


def test_the_region_counts_only_on_aws_and_the_endpoint_loses_its_trailing_slash():
    env = TrainerEnvironment(
        {"FTFLEET_CLOUD": "gcp", "FTFLEET_REGION": "us-east-1", "FTFLEET_METADATA_ENDPOINT": "http://x/"}
    )
    assert env.aws_region is None and env.metadata_endpoint == "http://x"
    assert TrainerEnvironment({"FTFLEET_CLOUD": "aws", "FTFLEET_REGION": "us-east-1"}).aws_region == "us-east-1"


@pytest.mark.parametrize(
    ("name", "value", "attribute"),
    [
        ("FTFLEET_CLOUD", "azure", "cloud"),
        ("FTFLEET_METRICS_PORT", "70000", "metrics_port"),
        ("FTFLEET_METRICS_PORT", "-1", "metrics_port"),
        ("FTFLEET_LOG_FORMAT", "xml", "log_format"),
        ("FTFLEET_ACTIVE_WORLD_SIZE", "0", "active_world_size"),
        ("FTFLEET_MIN_ACTIVE_WORLD_SIZE", "two", "min_active_world_size"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable_only_where_it_is_used(name, value, attribute):
    env = TrainerEnvironment({name: value})
    assert env.node_id == ""  # the others still read
    with pytest.raises(ConfigError) as exc:
        getattr(env, attribute)
    assert str(exc.value).startswith(f"{name}={value!r}: ") and "\n" not in str(exc.value)


def test_overrides_name_their_variable_and_key():
    env = TrainerEnvironment({"FTFLEET_CKPT_DIR": "/fsx/c", "FTFLEET_RUN_ID": "r", "FTFLEET_SHM_DIR": ""})
    assert env.config_overrides() == [
        ("FTFLEET_RUN_ID", "run_id", "r"),
        ("FTFLEET_CKPT_DIR", "checkpoint.dir", "/fsx/c"),
    ]
