"""Installs the repository's top-level folders under the one import name `ftfleet`.

The repository keeps one folder per part (`trainer/`, `infra/`, `lambdas/`), but an
installed ftfleet must not put such generic names into a user's site-packages, where
they would shadow the user's own `trainer.py`. So `trainer/` installs as
`ftfleet.trainer`, `infra/` as `ftfleet.infra` and `lambdas/` as `ftfleet.lambdas`;
everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = ("trainer", "infra", "lambdas")

packages = ["ftfleet"] + [f"ftfleet.{name}" for name in find_packages(include=[f"{top}*" for top in MAPPED])]

setup(
    packages=packages,
    package_dir={"ftfleet": "ftfleet", **{f"ftfleet.{top}": top for top in MAPPED}},
)
