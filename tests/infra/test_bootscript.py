"""The boot-script renderer and the harness that runs rendered scripts offline."""

from __future__ import annotations

import pytest

from ftfleet.infra import bootscript
from tests.infra.bootstub import Stubs, shellcheck

SCRIPT = """#!/bin/bash
# A test script.
# ftfleet-params: GREETING ROOT TIMES
set -euo pipefail
for _ in $(seq "$TIMES"); do
  echo "$GREETING" >> "$ROOT/out.txt"
done
curl -sf http://169.254.169.254/latest/meta-data/instance-id
"""


@pytest.fixture
def template(tmp_path):
    path = tmp_path / "node.sh"
    path.write_text(SCRIPT)
    return path


def test_the_header_assigns_every_declared_parameter_after_the_leading_comments(template):
    text = bootscript.render(template, {"GREETING": "it's $HOME", "ROOT": "", "TIMES": 2})
    lines = text.splitlines()
    assert lines[:3] == SCRIPT.splitlines()[:3]
    assert lines[3] == bootscript.HEADER
    assert lines[4:7] == ["GREETING='it'\"'\"'s $HOME'", "ROOT=''", "TIMES=2"]
    assert lines[7] == "set -euo pipefail"


def test_the_values_read_back_from_a_rendered_script_are_the_values_given(template):
    given = {"GREETING": "it's\n$HOME 'quoted' \"twice\"", "ROOT": "", "TIMES": 2}
    assert bootscript.rendered_values(bootscript.render(template, given)) == {k: str(v) for k, v in given.items()}
    with pytest.raises(bootscript.BootScriptError, match="no header"):
        bootscript.rendered_values(SCRIPT)


@pytest.mark.parametrize(
    "values, named",
    [({"GREETING": "x", "ROOT": ""}, "TIMES"), ({"GREETING": "x", "ROOT": "", "TIMES": 1, "EXTRA": 1}, "EXTRA")],
)
def test_a_missing_or_undeclared_value_is_refused(template, values, named):
    with pytest.raises(bootscript.BootScriptError, match=named):
        bootscript.render(template, values)


def test_a_script_over_the_size_limit_is_refused(template):
    with pytest.raises(bootscript.BootScriptError, match="over the limit of 100"):
        bootscript.render(template, {"GREETING": "x" * 200, "ROOT": "", "TIMES": 1}, max_bytes=100)


@pytest.mark.integration
def test_the_rendered_script_runs_against_stubs_and_writes_under_root(template, tmp_path):
    stubs = Stubs(tmp_path)
    stubs.stub("curl", match="instance-id", stdout="i-0abc")
    text = bootscript.render(template, {"GREETING": "hi there", "ROOT": str(stubs.root), "TIMES": 3})
    result = stubs.run(text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "i-0abc"
    assert (stubs.root / "out.txt").read_text() == "hi there\n" * 3
    assert stubs.order() == ["curl -sf"]


@pytest.mark.integration
def test_stub_rules_apply_in_order_and_are_used_up(tmp_path):
    stubs = Stubs(tmp_path)
    stubs.stub("docker", match="^pull ", rc=1, stderr="toomanyrequests", times=2)
    stubs.stub("docker", match="^pull ", stdout="pulled")
    script = "#!/bin/bash\nfor i in 1 2 3; do docker pull img:1 || echo failed; done\necho x | docker login\n"
    result = stubs.run(script)
    assert result.stdout.split() == ["failed", "failed", "pulled"]
    assert [c.args for c in stubs.calls("docker")][-1] == ["login"]
    assert stubs.calls("docker")[-1].stdin == "x\n"


def test_shellcheck_reports_a_defect_and_passes_a_clean_script(tmp_path):
    assert shellcheck(SCRIPT, tmp_path) == ""
    assert "SC2086" in shellcheck("#!/bin/bash\nrm -rf $1/tmp\n", tmp_path)
