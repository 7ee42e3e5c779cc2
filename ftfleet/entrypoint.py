"""What the trainer image's entrypoint (trainer/docker-entrypoint) runs, read off the
contract's environment (:mod:`ftfleet.contract`).

FTFLEET_LAUNCHER picks the launcher of a node:

* ``inprocess`` (the default): ftfleet's in-process launcher
  (``python -m ftfleet.trainer.inprocess``, :func:`inprocess_node`). Its node slot comes
  from the job's stores (``--node-rank auto``), which the coordinator's store service
  hosts (:func:`inprocess_stores`, the image's argument ``stores``): they must outlive
  every training node, so no node hosts them (``--no-host-stores``).
* ``torchrun``: torchrun's elastic agent; the entrypoint builds its command line itself.

Standard library only, beside the contract: the entrypoint calls it before torch is
imported. Every refusal is a :class:`~ftfleet.contract.ContractError` (one line, exit 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ftfleet.contract import LAUNCHER_ENV, ContractError, launcher

#: The image's argument that runs the coordinator's store service instead of a node.
STORES = "stores"
#: The program the image's CMD names for torchrun (``--module ftfleet.trainer``): the
#: reference trainer, which is what the in-process launcher's workers run.
REFERENCE_TRAINER = "ftfleet.trainer"
INPROCESS = ("-m", "ftfleet.trainer.inprocess")


def endpoint(environ: Mapping[str, str]) -> tuple[str, int]:
    """FTFLEET_RDZV_ENDPOINT as (host, port): where the job's stores listen (port and
    port + 1, and port + 2 in every other round)."""
    value = environ.get("FTFLEET_RDZV_ENDPOINT", "")
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65535):
        raise ContractError(
            f"FTFLEET_RDZV_ENDPOINT={value!r}: use host:port with a port below 65535 "
            "(the in-process launcher's stores take the port and the next two)"
        )
    return host.strip("[]"), int(port)


def nodes(environ: Mapping[str, str], nproc: int) -> list[str]:
    """``--nnodes`` (and ``--min-ranks``) from FTFLEET_NNODES: ``N``, or ``MIN:MAX``, which
    trains on MAX nodes and lets the world shrink to MIN nodes' ranks."""
    value = environ.get("FTFLEET_NNODES", "")
    low, sep, high = value.partition(":")
    if not (low.isdigit() and (not sep or high.isdigit())):
        raise ContractError(f"FTFLEET_NNODES={value!r}: use N or MIN:MAX (whole numbers of nodes)")
    most = int(high if sep else low)
    least = int(low)
    if not 1 <= least <= most:
        raise ContractError(f"FTFLEET_NNODES={value!r}: use at least 1 node, and MIN no larger than MAX")
    if not sep:
        return ["--nnodes", str(most)]
    return ["--nnodes", str(most), "--min-ranks", str(least * nproc)]


def _count(environ: Mapping[str, str], name: str, default: int, least: int) -> int:
    value = environ.get(name, "") or str(default)
    if not value.isdigit() or int(value) < least:
        raise ContractError(f"{name}={value!r}: use a whole number >= {least}")
    return int(value)


def trainer_args(args: Sequence[str]) -> list[str]:
    """The image's arguments as the in-process workers take them (``--config FILE`` and
    overrides): the image's CMD, torchrun's ``--module ftfleet.trainer``, names the
    reference trainer, which they run anyway. Another program needs torchrun."""
    args = list(args)
    if args[:2] in (["--module", REFERENCE_TRAINER], ["-m", REFERENCE_TRAINER]):
        args = args[2:]
    program = args[0] if args else ""
    if program in ("--module", "-m", "--no-python", "--no_python") or program.endswith(".py"):
        named = " ".join(args[:2]) if program in ("--module", "-m") else program
        raise ContractError(
            f"{LAUNCHER_ENV}=inprocess runs the reference trainer ({REFERENCE_TRAINER}) only: "
            f"for the training program {named!r} set {LAUNCHER_ENV}=torchrun"
        )
    return args


def inprocess_node(environ: Mapping[str, str], args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment to add) of one node under the in-process launcher."""
    host, port = endpoint(environ)
    nproc = _count(environ, "FTFLEET_NPROC_PER_NODE", 0, 1)
    argv = ["python", *INPROCESS, "--nproc", str(nproc)]
    argv += ["--spares", str(_count(environ, "FTFLEET_SPARE_PROCESSES", 1, 0))]
    argv += nodes(environ, nproc)
    argv += ["--spare-nodes", str(_count(environ, "FTFLEET_SPARE_NODES", 0, 0))]
    argv += ["--node-rank", "auto", "--no-host-stores", "--master-addr", host]
    argv += ["--", *trainer_args(args)]
    return argv, {"MASTER_ADDR": host, "MASTER_PORT": str(port)}


def inprocess_stores(environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment to add) of the coordinator's store service: the job's two
    stores on FTFLEET_RDZV_ENDPOINT's port and the next two, until SIGTERM."""
    _, port = endpoint(environ)
    argv = ["python", *INPROCESS, "--nproc", "0", "--host-stores", "--master-addr", "0.0.0.0"]
    return argv, {"MASTER_PORT": str(port)}


def plan(args: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[str, list[str], dict[str, str]]:
    """(launcher, argv, environment to add) for the image's arguments ``args``: the
    store service for ``stores``; else a node under FTFLEET_LAUNCHER (for torchrun,
    argv is empty: the entrypoint runs torchrun with ``args`` itself)."""
    environ = os.environ if environ is None else environ
    chosen = launcher(environ)
    if list(args[:1]) == [STORES]:
        if chosen != "inprocess":
            raise ContractError(
                f"{STORES}: the in-process launcher's store service; with {LAUNCHER_ENV}={chosen} the coordinator's "
                f"torchrun agent hosts the rendezvous: run the image without {STORES!r}, or unset {LAUNCHER_ENV}"
            )
        if len(args) > 1:
            raise ContractError(f"{STORES} takes no arguments, got {' '.join(args[1:])!r}")
        return "stores", *inprocess_stores(environ)
    if chosen == "torchrun":
        return "torchrun", [], {}
    return "inprocess", *inprocess_node(environ, args)
