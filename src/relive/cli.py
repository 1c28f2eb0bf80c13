"""`relive` command line. Each command group lives next to the code it drives and registers itself here:
a module in ``COMMAND_MODULES`` defines ``add_parsers(subparsers)``, which adds its sub-commands and sets
``func`` (called with the parsed args, returns an exit code) on each.

Errors: a bad argument or a refused input (``ValueError``, which includes ``CheckpointError``, and
``OSError`` such as a missing file, or a command stopping with a message) prints one line
``relive: error: ...`` on stderr and exits with code 2, as argparse does for its own errors;
``relive --debug ...`` raises instead (the full traceback; in-process callers get the exception)."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from relive import __version__

COMMAND_MODULES = (
    "relive.train.cli",  # train, presets, demo
    "relive.train.data_cli",  # data make / list / info
    "relive.experiments.cli",  # bench run / report
    "relive.train.pld_cli",  # bc, pld collect / distill
    "relive.train.run_cli",  # eval, plot (after training)
)

EXIT_USAGE = 2  # argparse's exit code for a bad command line; relive uses it for every refused input

PLUGIN_GROUP = "relive.plugins"  # entry points of installed packages: modules that register samplers / agents
PLUGIN_ENV = "RELIVE_PLUGINS"  # plug-ins named by --plugin, passed on to the runs `relive bench run` starts


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


def _plugin_args(argv: Sequence[str]) -> list[str]:
    """The values of ``--plugin X`` / ``--plugin=X`` given before the command (``relive --plugin X train ...``)."""
    out, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--plugin" and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--plugin="):
            out.append(argv[i].split("=", 1)[1])
        i += 1
    return out


def load_plugins(names: Sequence[str] = ()) -> list[str]:
    """Import the plug-ins that register samplers and agents (``register_replay`` / ``register_agent``): the
    entry points of group ``relive.plugins`` of installed packages, the modules in ``$RELIVE_PLUGINS`` (``:``-
    separated) and ``names`` -- a module name (``mypkg.samplers``) or a ``.py`` file. Importing runs the module's
    code, so nothing is imported that the user did not name or install: a run's config.json names its replay and
    agent, never a module to import (a resumed plug-in run is given ``--plugin`` again). Returns what was named,
    files as absolute paths; they are put in ``$RELIVE_PLUGINS`` for the processes this one starts."""
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        ep.load()
    named = [n for n in os.environ.get(PLUGIN_ENV, "").split(os.pathsep) if n] + list(names)
    loaded: list[str] = []
    for name in named:
        path = Path(name)
        if name.endswith(".py"):
            if not path.is_file():
                raise ValueError(f"--plugin {name}: no such file")
            path = path.resolve()
            # one module per file: two plug-ins named samplers.py in two directories are two modules (the name
            # carries the path's digest; the same file named twice is imported once)
            digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
            module_name = f"relive_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
            if module_name not in sys.modules:
                spec = importlib.util.spec_from_file_location(module_name, path)
                if spec is None or spec.loader is None:
                    raise ValueError(f"--plugin {name}: not a Python module")
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)  # trusted-code: the user named this file with --plugin
            name = str(path)
        else:
            try:
                importlib.import_module(name)  # trusted-code: the user named this module with --plugin
            except ModuleNotFoundError as e:
                if e.name is not None and name.startswith(e.name):
                    raise ValueError(f"--plugin {name}: no module named {e.name!r} (give an importable module name "
                                     "or the path of a .py file)") from None
                raise
        if name not in loaded:
            loaded.append(name)
    if loaded:
        os.environ[PLUGIN_ENV] = os.pathsep.join(loaded)
    return loaded


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relive", description="Experience replay for off-policy and "
                                     "offline-to-online reinforcement learning.")
    parser.add_argument("--debug", action="store_true", help="on an error, print the full traceback")
    parser.add_argument("--plugin", action="append", metavar="MODULE", help="import MODULE (a module name or a .py "
                        "file) first: the samplers and agents it registers become --replay / agent choices "
                        "(repeatable; also $RELIVE_PLUGINS and installed packages' 'relive.plugins' entry points)")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        load_plugins(_plugin_args(argv))  # before the parser: their names are choices of --replay
    except (ValueError, OSError) as err:
        if "--debug" in argv:
            raise
        print(f"relive: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (`relive presets | head`): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (Python's flush of stdout at exit would fail again)
        return 0
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
