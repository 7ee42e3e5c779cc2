"""Boot scripts are real files, rendered by setting variables, never by editing text.

Each cloud keeps its node scripts under ``infra/<cloud>/boot/`` as plain bash files that
`shellcheck` and a test harness can read and run (tests/infra/bootstub.py). A script
takes every value that depends on the deployment (bucket names, the image, the mount
point, the stack's settings) from shell variables. It declares them on one line::

    # ftfleet-params: IMAGE_URI MOUNT_POINT REGION ROOT

and :func:`render` writes a header that assigns each of them, shell-quoted, right after
the script's leading comment block. Nothing else in the file is touched, so the text a
node runs is the file a reviewer reads plus that header.

``ROOT`` (when a script declares it) prefixes every path the script writes, such as
``"$ROOT/etc/fstab"``: the program renders it empty; tests render a temporary directory
and run the script against stub commands.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

PARAMS_LINE = re.compile(r"^# ftfleet-params:(?P<names>( [A-Z][A-Z0-9_]*)+)\s*$", re.M)
NAME = re.compile(r"[A-Z][A-Z0-9_]*")
HEADER = "# --- values rendered by the Pulumi program (infra/bootscript.py) ---"
#: EC2 rejects user data over 16 KiB (before base64); GCE metadata values may hold 256 KiB.
EC2_USER_DATA_LIMIT = 16 * 1024


class BootScriptError(ValueError):
    """The program and a boot script disagree on the script's parameters (a bug in
    ftfleet, not in the stack's config)."""


def params(template: Path) -> tuple[str, ...]:
    """The variables a boot script declares on its ``# ftfleet-params:`` line."""
    found = PARAMS_LINE.findall(template.read_text(encoding="utf-8"))
    if len(found) != 1:
        raise BootScriptError(f"{template} needs exactly one '# ftfleet-params: NAME ...' line")
    return tuple(found[0][0].split())


def render(template: Path, values: Mapping[str, str | int | bool], *, max_bytes: int | None = None) -> str:
    """The script with a header assigning every declared parameter.

    ``values`` must name exactly the declared parameters: a missing or an extra one is a
    BootScriptError, so a renamed variable cannot silently render empty. Booleans
    render as ``true``/``false``; everything is shell-quoted.
    """
    text = template.read_text(encoding="utf-8")
    declared = params(template)
    missing = sorted(set(declared) - set(values))
    extra = sorted(set(values) - set(declared))
    if missing or extra:
        raise BootScriptError(f"{template.name}: missing values for {missing}, values for undeclared {extra}")
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].startswith("#!"):
        raise BootScriptError(f"{template} must start with a #! line")
    # The header goes after the shebang and the comment block that follows it.
    at = 1
    while at < len(lines) and lines[at].startswith("#"):
        at += 1
    assignments = [f"{name}={shlex.quote(_text(values[name]))}\n" for name in declared]
    script = "".join(lines[:at] + [HEADER + "\n"] + assignments + lines[at:])
    size = len(script.encode())
    if max_bytes is not None and size > max_bytes:
        raise BootScriptError(f"{template.name} renders to {size} bytes, over the limit of {max_bytes}")
    return script


def rendered_values(script: str) -> dict[str, str]:
    """The values a rendered script was given, read back from its header (tests and
    `ftfleet plan` read user data with it)."""
    lines = script.splitlines(keepends=True)
    try:
        at = lines.index(HEADER + "\n") + 1
    except ValueError:
        raise BootScriptError("not a rendered boot script: no header") from None
    values: dict[str, str] = {}
    chunk = ""
    for line in lines[at:]:
        chunk += line
        try:
            tokens = shlex.split(chunk)
        except ValueError:  # a quoted value spanning lines: read on
            continue
        name, sep, value = tokens[0].partition("=") if len(tokens) == 1 else ("", "", "")
        if not sep or not NAME.fullmatch(name):
            break
        values[name] = value
        chunk = ""
    return values


def _text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
