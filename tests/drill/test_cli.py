"""`python -m drill`'s options are checked before anything starts."""

from __future__ import annotations

import pytest

from drill.cli import main


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--faults", "meteor"], "unknown fault meteor"),
        (["--interval", "0"], "--interval 0: use adaptive or a positive number of steps"),
        (["--faults", "sigkill", "--nproc", "1"], "needs --nproc 2 or more"),
        (["--spacing", "1"], "at least 2 steps"),
        (["--faults", "capacity_loss,notice"], "capacity_loss runs alone"),
        (["--faults", "capacity_loss", "--launcher", "inprocess"], "capacity_loss runs its nodes under torchrun"),
        (["--faults", "capacity_loss", "--interval", "adaptive"], "capacity_loss takes a fixed number of steps"),
        (["--faults", "capacity_loss", "--capacity-loss-s", "0"], "--capacity-loss-s 0: use seconds > 0"),
    ],
)
def test_bad_options_exit_2_with_one_line_naming_the_fix(argv, message, capsys, tmp_path):
    assert main([*argv, "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "w").exists()
