"""The fleet goodput bench's configurations (bench/fleet_goodput.py), refused in one line
before anything starts."""

from __future__ import annotations

import pytest

from bench.fleet_goodput import main, replicas_of, same_states


def test_a_replicated_configuration_names_its_replica_groups():
    assert [replicas_of(n) for n in ("inprocess-r2", "inprocess-r4", "inprocess", "quiet", "torchrun")] == [
        2,
        4,
        1,
        1,
        1,
    ]
    assert replicas_of("inprocess-rx") == 1 and replicas_of("torchrun-r2") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--configs", "inprocess-rx"], "'inprocess-rx' is not one of quiet, inprocess, inprocess-rN, torchrun"),
        (["--nodes", "3", "--configs", "quiet,inprocess-r2"], "2 replica groups do not divide --nodes 3"),
    ],
)
def test_bad_configurations_exit_2_before_any_run(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--workdir", str(tmp_path), "--no-json"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_end_states_are_compared_within_a_world_shape_and_a_lone_shape_is_not_called_equal():
    def run(name, sha, finished=True):
        return {"configuration": name, "replicas": replicas_of(name), "finished": finished, "state_sha256": sha}

    runs = [run("quiet", "a"), run("inprocess", "a"), run("inprocess-r2", "b"), run("torchrun", None, False)]
    assert same_states(runs) == {"same_state": True, "compared": {"1": 2, "2": 1}}
    assert same_states([*runs, run("torchrun", "c")])["same_state"] is False
    assert same_states([run("inprocess-r2", "b")]) == {"same_state": None, "compared": {"2": 1}}
    assert same_states([]) == {"same_state": None, "compared": {}}
