"""The fleet goodput bench's configurations (bench/fleet_goodput.py), refused in one line
before anything starts."""

from __future__ import annotations

import pytest

from bench.fleet_goodput import main, replicas_of


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
