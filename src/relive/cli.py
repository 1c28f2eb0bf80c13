"""`relive` command line. Each command group lives next to the code it drives and registers itself here:
a module in ``COMMAND_MODULES`` defines ``add_parsers(subparsers)``, which adds its sub-commands and sets
``func`` (called with the parsed args, returns an exit code) on each.

Errors: a bad argument or a refused input (``ValueError``, which includes ``CheckpointError``, and
``OSError`` such as a missing file, or a command stopping with a message) prints one line
``relive: error: ...`` on stderr and exits with code 2, as argparse does for its own errors;
``relive --debug ...`` raises instead (the full traceback; in-process callers get the exception)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from relive import __version__

COMMAND_MODULES = (
    "relive.train.cli",  # train, presets, demo
    "relive.train.data_cli",  # data make / list / info
    "relive.experiments.cli",  # bench run / report
    "relive.agents.cli",  # bc, pld distill
)

EXIT_USAGE = 2  # argparse's exit code for a bad command line; relive uses it for every refused input


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type`` for a count that must be >= 1 (``--steps 0`` is an error, not "the default")."""
    return _int_at_least(text, 1, "positive")


def non_negative_int(text: str) -> int:
    """argparse ``type`` for a count that may be 0 (``--eval-episodes 0``: no evaluation)."""
    return _int_at_least(text, 0, "non-negative")


def positive_float(text: str) -> float:
    """argparse ``type`` for a finite number > 0 (seconds, rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relive", description="Experience replay for off-policy and "
                                     "offline-to-online reinforcement learning.")
    parser.add_argument("--debug", action="store_true", help="on an error, print the full traceback")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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


def refuse_overwrite(path, overwrite: bool) -> None:
    """Tools do not rewrite existing files (tracked docs above all) unless asked: a ValueError naming
    ``--overwrite`` when ``path`` exists and ``overwrite`` is false."""
    if Path(path).exists() and not overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it (notes below its marker line are kept)")


def write_generated(path, text: str, marker: str, overwrite: bool = False) -> None:
    """Write a generated Markdown file ending in ``marker``; refused over an existing file unless ``overwrite``
    (``refuse_overwrite``). Hand-written notes below ``marker`` in the old file are kept below it."""
    path = Path(path)
    refuse_overwrite(path, overwrite)
    old = path.read_text() if path.is_file() else ""
    text = text.rstrip("\n") + "\n\n" + marker + "\n"
    if marker in old:
        notes = old.split(marker, 1)[1].strip("\n")
        text += notes + "\n" if notes else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if isinstance(err, ValueError) else f"{type(err).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SystemExit as stop:  # a command that stops with a message (``raise SystemExit("...")``)
        if not isinstance(stop.code, str) or getattr(args, "debug", False):
            raise
        print(f"relive: error: {' '.join(stop.code.split())}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as err:
        if getattr(args, "debug", False):
            raise
        print(f"relive: error: {_one_line(err)} (run with --debug for the traceback)", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
