"""Each remediation function's deployment package, straight from the source tree.

A package holds the function's folder, ``lambdas/common/`` and the ``ftfleet`` modules
the handlers import (``contract``, ``errors``, ``retention``), laid out under ``ftfleet/`` so that the
handler imports the same names it does here. boto3 comes with Lambda's Python runtime.
Files are listed one by one (sorted, ``*.py`` only), never whole folders, so that
``__pycache__`` does not change the archive's hash and redeploy the function.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pulumi

import ftfleet

RUNTIME = "python3.13"
#: The ftfleet modules handlers import besides lambdas/ (no torch, no pulumi, no dependency
#: beyond the standard library and boto3).
CORE_MODULES = ("__init__.py", "contract.py", "errors.py", "retention.py")


def _lambdas_dir() -> Path:
    spec = importlib.util.find_spec("ftfleet.lambdas")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def handler_path(function: str) -> str:
    """The Lambda ``handler`` setting of a function folder."""
    return f"ftfleet.lambdas.{function}.handler.handler"


def files(function: str) -> dict[str, Path]:
    """Archive path -> source file, for one function."""
    core = Path(ftfleet.__file__).parent
    lambdas = _lambdas_dir()
    if not (lambdas / function / "handler.py").is_file():
        raise ValueError(f"no function folder lambdas/{function}/ with a handler.py")
    out = {f"ftfleet/{name}": core / name for name in CORE_MODULES}
    out["ftfleet/lambdas/__init__.py"] = lambdas / "__init__.py"
    for folder in ("common", function):
        for source in sorted((lambdas / folder).glob("*.py")):
            out[f"ftfleet/lambdas/{folder}/{source.name}"] = source
    return out


def archive(function: str, rendered: dict[str, str] | None = None) -> pulumi.AssetArchive:
    """The package; ``rendered`` adds files the program generated (name in the function's
    folder -> text)."""
    assets: dict[str, pulumi.Asset | pulumi.Archive] = {
        path: pulumi.FileAsset(str(source)) for path, source in files(function).items()
    }
    for name, text in (rendered or {}).items():
        assets[f"ftfleet/lambdas/{function}/{name}"] = pulumi.StringAsset(text)
    return pulumi.AssetArchive(assets)
