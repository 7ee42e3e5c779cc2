"""Read `stacks/Pulumi.<stack>.yaml` the way the Pulumi CLI hands it to a program."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ftfleet.errors import ConfigError
from ftfleet.infra import settings

STACKS_DIR = Path(__file__).resolve().parent.parent / "stacks"


@dataclass(frozen=True)
class StackFile:
    name: str
    path: Path
    config: dict[str, Any]
    """Namespaced keys (`ftfleet:cloud`, `aws:region`) to their YAML values."""

    def project_config(self) -> dict[str, Any]:
        prefix = f"{settings.PROJECT}:"
        return {k[len(prefix) :]: v for k, v in self.config.items() if k.startswith(prefix)}

    def region(self) -> str | None:
        cloud = self.project_config().get("cloud", "aws")
        value = self.config.get(f"{cloud}:region")
        return value if isinstance(value, str) else None

    def settings(self) -> settings.Settings:
        return settings.parse(self.project_config(), stack=self.name, region=self.region())

    def as_pulumi_strings(self) -> dict[str, str]:
        """What the language host passes a program: every value a string, structured
        values as JSON."""
        out = {}
        for key, value in self.config.items():
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, (list, dict)):
                out[key] = json.dumps(value)
            else:
                out[key] = str(value)
        return out


def stack_names(directory: Path = STACKS_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load(target: str) -> StackFile:
    """`target` is a stack name in stacks/ or a path to a stack file."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml") or "/" in target:
        name = path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]
    else:
        name, path = target, STACKS_DIR / f"Pulumi.{target}.yaml"
    if not path.is_file():
        known = ", ".join(stack_names()) or "none"
        raise ConfigError(f"no stack file {path}; give a stack name ({known}) or a path to a Pulumi.<stack>.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    config = data.get("config", {}) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a top-level `config:` mapping")
    for key in config:
        if ":" not in str(key):
            raise ConfigError(f"{path}: config key {key!r} needs a namespace, e.g. {settings.PROJECT}:{key}")
        if isinstance(config[key], dict) and "secure" in config[key]:
            raise ConfigError(f"{path}: {key} is a secret; `ftfleet plan` runs offline and cannot decrypt it")
    return StackFile(name=name, path=path, config=config)
