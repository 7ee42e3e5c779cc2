"""`ftfleet` command line. Subcommands live with the code they drive and are imported
lazily, so `ftfleet plan` never imports torch and `ftfleet ckpt` never imports pulumi.

Each subcommand module exposes ``register(subparsers)`` (adds its parser and sets
``func``) and the function it sets returns an exit code. Expected failures raise
:class:`ftfleet.errors.UserError`; the CLI prints its one line and exits with its code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ftfleet import __version__
from ftfleet.errors import UserError

# subcommand -> module providing register(subparsers)
SUBCOMMANDS = {
    "plan": "ftfleet.infra.plan",
    "failover": "ftfleet.infra.failover",
    "config-reference": "ftfleet.infra.reference",
    "ckpt": "ftfleet.trainer.checkpoint.cli",
    "data": "ftfleet.trainer.data",
    "torchrun": "ftfleet.trainer.torchrun",
}
#: Subcommands whose arguments are another program's: their module's main(argv) takes
#: everything after the name, unparsed.
PASSTHROUGH = {"torchrun"}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ftfleet", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"ftfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, module in SUBCOMMANDS.items():
        if wanted is not None and name != wanted:
            # Only import the module that runs; list the rest by name for --help.
            sub.add_parser(name, help=f"see `ftfleet {name} --help`")
            continue
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as exc:
            if wanted is not None:
                raise
            sub.add_parser(name, help=f"(unavailable: {exc.name} is not installed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in PASSTHROUGH:
        return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]))
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
