from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import pytest

from ftfleet.infra import offline, policies, stackfile


@functools.cache
def recording(name: str) -> offline.Recording:
    """Each stack in stacks/ runs once per session; the recordings are read-only."""
    return offline.run(stackfile.load(name))


def res_view(rec: offline.Recording) -> list[policies.Res]:
    return [
        policies.Res(
            r.type,
            r.name,
            r.urn,
            r.inputs,
            rec.region_of(r),
            r.property_dependencies,
            dependencies=r.dependencies,
            protect=r.protect,
            id=r.id,
            ignore_changes=r.ignore_changes,
        )
        for r in rec.resources
    ]


@pytest.fixture
def variant(tmp_path: Path):
    """Run aws-dev with some keys changed (value None removes the key)."""
    return _variant_of("aws-dev", tmp_path)


@pytest.fixture
def gcp_variant(tmp_path: Path):
    """Run gcp-dev with some keys changed (value None removes the key)."""
    return _variant_of("gcp-dev", tmp_path)


def _variant_of(stack_name: str, tmp_path: Path, name: str = "variant", other_stacks=None):
    """``run(**changes)``: the stack's file with keys changed (None removes one), run as
    stack ``name``; ``other_stacks()`` gives the outputs its StackReferences read."""

    def run(**changes) -> offline.Recording:
        base = stackfile.load(stack_name)
        config = dict(base.config)
        for key, value in changes.items():
            full = key if ":" in key else f"ftfleet:{key}"
            if value is None:
                config.pop(full, None)
            else:
                config[full] = value
        stack = stackfile.StackFile(name=name, path=tmp_path / f"Pulumi.{name}.yaml", config=config)
        return offline.run(stack, other_stacks=other_stacks() if other_stacks else None)

    return run


def write_stack(tmp_path: Path, body: str, name: str = "bad") -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(textwrap.dedent(body))
    return path
