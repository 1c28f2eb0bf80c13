"""`relive` command line. Each command group lives next to the code it drives and registers itself here:
a module in ``COMMAND_MODULES`` defines ``add_parsers(subparsers)``, which adds its sub-commands and sets
``func`` (called with the parsed args, returns an exit code) on each."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "relive.train.cli",  # train, presets, demo
    "relive.data.cli",  # data make / list / info
    "relive.experiments.cli",  # bench run / report
    "relive.agents.cli",  # bc, pld distill
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relive", description="Experience replay for off-policy and "
                                     "offline-to-online reinforcement learning.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name):
                continue  # that command group is not part of this version
            raise
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
