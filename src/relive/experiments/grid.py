"""Experiment grids: a TOML file naming variants (a preset plus CLI arguments), tasks and seeds.

    name = "reaper"
    seeds = [0, 1, 2]                      # or an integer n for seeds 0..n-1
    tasks = ["CartPole-v1", "Acrobot-v1"]  # default tasks for every variant
    args = ["--eval-episodes", "5"]        # optional: `relive train` arguments of every run (first on the line)
    [[variant]]
    label = "uniform"                      # a name for plots and tables
    preset = "ddqn"                        # `relive train PRESET`
    args = ["--replay", "uniform"]         # extra `relive train` arguments ({task}, {seed} are substituted)
    tasks = ["CartPole-v1"]                # optional: this variant's own tasks / seeds (e.g. an ablation
    seeds = 3                              # on one task with fewer seeds)
    [task_args]                            # optional: extra arguments per task (a task may be a label, e.g.
    "hopper-random" = ["--env", "Hopper-v5", "--dataset", "relive/hopper-v5/random-v0"]   # env + dataset)
    [report]                               # optional: what the report computes
    thresholds = { "CartPole-v1" = 475 }   # env steps to reach a score (ReaPER's metric)
    paper = { "CartPole-v1" = "20,650 -> 15,850" }
    baseline = "per"                       # the thresholds table's reference variant (default: the first)
    auc = true                             # a table of the mean over the online evaluations
    score = "eval/success_rate"            # the score column (default: normalized score, else return)
    compare = "arb"                        # that variant against each other one, with Mann-Whitney p-values
    [[report.figure]]                      # optional: extra plots of a subset of variants / tasks / a column
    name = "fig1"
    labels = ["uniform"]
    column = "replay/online_fraction"

Grids ship in ``relive/experiments/grids/``; ``relive bench run NAME`` finds them by name or path.

A grid decides what its runs train and read, never where a run goes, what it trusts or which code it imports:
its ``args`` hold only the flags of ``GRID_FLAGS``, each followed by its value; ``--run-dir``, ``--resume``,
``--trust-code``, ``--plugin``, ``--seed`` and a ``--set`` of ``run.run_dir`` / ``agent.trust_code`` /
``collectors.ray_address`` are refused at the schema check (``relive bench run --trust-code``, ``relive --plugin
FILE bench run`` say them on the command line).
"""

from __future__ import annotations

import json
import re
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # (Python 3.10: the same parser as a package, a dependency there)
    import tomli as tomllib

GRID_DIR = Path(__file__).parent / "grids"
MAX_SEEDS = 1000  # seeds of a grid (``seeds = N`` or a list's length) above this are refused
MAX_SEED = 2**32 - 1
MAX_RUNS = 10_000  # runs of a grid (variants x tasks x seeds), counted before anything is expanded
MAX_ARGS, MAX_ARG_CHARS = 200, 4096  # per args list, per argument: every run gets its own copy
# a grid name, variant label, task or figure name: one directory / file name component under --root or --out
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,99}")

# What a grid's `args` may say: the `relive train` flags of what a run trains (schedule, replay, agent settings,
# devices) and of the data it reads, each with the number of values it takes. An allow-list: a flag not here (a
# new `relive train` flag included, until it is added) is refused by name at the schema check. Where a run goes,
# what it trusts and which code it imports are decided by the command line of the person running the grid, never
# by a grid file (docs/guarantees.md, "Grid files").
GRID_FLAGS = {
    "--env": 1, "--dataset": 1, "--replay": 1, "--base-policy": 1, "--init-from": 1, "--allow-other-base": 0,
    "--num-envs": 1, "--vector-mode": 1, "--collectors": 1, "--replay-shards": 1, "--threads": 1, "--device": 1,
    "--replay-device": 1,
    "--set": 1, "--no-progress": 0, "--offline-steps": 1, "--online-steps": 1, "--utd": 1, "--chunk": 1,
    "--grad-steps-per-chunk": 1, "--stop-at-return": 1, "--warmup": 1, "--warmup-policy": 1, "--batch-size": 1,
    "--capacity": 1, "--offline-fraction": 1, "--eval-every": 1, "--eval-episodes": 1, "--log-every": 1,
    "--checkpoint-every": 1, "--offline-checkpoint-every": 1, "--env-kwargs": 1, "--logger": 1,
}
# flags a grid file may not pass, with who decides instead (the refusal says so)
NOT_GRID_FLAGS = {
    "--run-dir": "the runner puts every run at --root/GRID/LABEL/TASK/seed_N",
    "--resume": "the runner resumes a started run itself",
    "--seed": "the grid's seeds are its `seeds`", "--seeds": "the grid's seeds are its `seeds`",
    "--trust-code": "trust comes from the command line only: relive bench run --trust-code",
    "--plugin": "plug-ins are named on the command line: relive --plugin FILE bench run GRID",
    "--ray-address": "a cluster to join is named on the command line (relive bench run --ray-address)",
    "--debug": "the runner starts every run with --debug",
    "--console": "a person at a browser console is for one run of its own (relive train --console)",
    "--console-host": "where a console listens is decided on the command line of one run (relive train)",
    "--console-port": "where a console listens is decided on the command line of one run (relive train)",
}
# `--set` keys that are the same decisions under another name
NOT_GRID_SETTINGS = {"run.run_dir": "--run-dir", "agent.trust_code": "--trust-code",
                     "collectors.ray_address": "--ray-address", "intervention.console_host": "--console-host"}
_NUMBER = re.compile(r"-\d+|-\d*\.\d+")  # argparse's negative number: a value, not a flag


@dataclass(frozen=True)
class RunSpec:
    grid: str
    label: str
    preset: str
    task: str
    seed: int
    args: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Relative run directory: ``label/task/seed_N`` (each part one plain name: it never leaves the root)."""
        for what, part in (("grid name", self.grid), ("variant label", self.label), ("task", self.task)):
            check_name(part, what)
        return f"{self.label}/{self.task}/seed_{int(self.seed)}"


@dataclass(frozen=True)
class Variant:
    label: str
    preset: str
    args: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()  # a variant's own seeds (e.g. fewer for an ablation); default: the grid's


@dataclass(frozen=True)
class Grid:
    name: str
    variants: tuple[Variant, ...]
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    report: dict = field(default_factory=dict)
    description: str = ""
    task_args: dict = field(default_factory=dict)
    args: tuple[str, ...] = ()  # arguments of every run, before the variant's and the task's
    only_tasks: tuple[str, ...] = ()  # when set, runs() keeps these tasks only (`relive bench run --tasks`)
    # `relive bench run --trust-code` (never the file: its schema refuses the flag): runs() gives --trust-code to
    # every run whose arguments name a base policy, and the runner says it again when it resumes one
    trust_code: bool = False

    def runs(self) -> list[RunSpec]:
        """Every run of the grid, seeds innermost-last so that a partial sweep covers all variants early."""
        out = []
        for seed in self.seeds:
            for v in self.variants:
                if v.seeds and seed not in v.seeds:
                    continue
                for task in v.tasks or self.tasks:
                    if self.only_tasks and task not in self.only_tasks:
                        continue
                    args = tuple(a.format(task=task, seed=seed)
                                 for a in (*self.args, *v.args, *self.task_args.get(task, ())))
                    if self.trust_code and names_base_policy(args) and "--trust-code" not in args:
                        args = (*args, "--trust-code")
                    out.append(RunSpec(self.name, v.label, v.preset, task, seed, args))
        return out


def find_grid(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    candidate = GRID_DIR / f"{name_or_path}.toml"
    if candidate.is_file():
        return candidate
    known = sorted(q.stem for q in GRID_DIR.glob("*.toml"))
    raise ValueError(f"no grid {str(name_or_path)!r}: not a file, and not one of the built-in grids {known}")


def load_grid(name_or_path: str | Path) -> Grid:
    path = find_grid(name_or_path)
    with open(path, "rb") as f:
        try:
            raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"grid file {path}: not valid TOML ({e})") from None
    try:
        return parse_grid(raw, default_name=path.stem)
    except ValueError as e:
        raise ValueError(f"grid file {path}: {e}") from None


def check_name(value, what: str, where: str = "") -> str:
    """A name that becomes one path component (a run directory's, a report file's): letters, digits and ``._+=@,-``,
    not starting with a dot, at most 100 characters -- never ``..``, a ``/`` or an absolute path."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ValueError(f"{where}{what} {value!r} must be a plain name (letters, digits and ._+=@,- not starting with "
                         "a dot, at most 100 characters): it names a directory or file under the output root"
                         + ("; an environment id with a '/' goes in [task_args] under a plain task label"
                            if what == "task" and isinstance(value, str) and "/" in value else ""))
    return value


# the grid file's schema: every key it may hold, with its type (checked before anything is expanded)
_TOP = {"name", "description", "seeds", "tasks", "args", "variant", "task_args", "report"}
_VARIANT = {"label", "preset", "args", "tasks", "seeds"}
_REPORT = {"thresholds", "paper", "baseline", "auc", "score", "compare", "figure"}
_FIGURE = {"name", "title", "labels", "tasks", "column", "log_y"}


def _table(value, where: str, known: set[str]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a table, got {type(value).__name__} {_short(value)}")
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _str(value, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {type(value).__name__} {_short(value)}")
    return value


def _bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where} must be true or false, got {_short(value)}")
    return value


def _list(value, where: str, item, example: str) -> tuple:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list ({example}), got {type(value).__name__} {_short(value)}")
    return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))


def _args(value, where: str) -> tuple[str, ...]:
    """`relive train` arguments: strings whose only fields are ``{task}`` and ``{seed}`` (``{{`` for a brace)."""
    out = _list(value, where, _str, 'e.g. ["--replay", "per"]')
    if len(out) > MAX_ARGS:
        raise ValueError(f"{where}: at most {MAX_ARGS} arguments, got {len(out)}")
    for i, a in enumerate(out):
        if len(a) > MAX_ARG_CHARS:
            raise ValueError(f"{where}[{i}]: an argument of at most {MAX_ARG_CHARS} characters, got {len(a)}")
        try:
            fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(a) if f is not None]
        except ValueError as e:
            raise ValueError(f"{where}[{i}] = {_short(a)}: {e} (write {{{{ and }}}} for a literal brace)") from None
        bad = [f for f, spec, conv in fields if f not in ("task", "seed") or spec or conv]
        if bad:
            raise ValueError(f"{where}[{i}] = {_short(a)}: only {{task}} and {{seed}} are substituted (no format spec "
                             f"or conversion), got {{{bad[0]}...}}; write {{{{ and }}}} for a literal brace")
    _check_flags(out, where)
    return out


def _check_flags(args: tuple[str, ...], where: str) -> None:
    """Each argument a flag of ``GRID_FLAGS`` followed by its value (in the same list), never a flag the command
    line decides (``NOT_GRID_FLAGS``) or a ``--set`` of such a setting (``NOT_GRID_SETTINGS``). A flag and a
    ``--set`` key are never substituted: ``{task}`` / ``{seed}`` go in values only."""
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or _NUMBER.fullmatch(a):
            raise ValueError(f"{where}[{i}] = {_short(a)}: a value without a flag before it (each flag and its value "
                             "go in the same args list)")
        flag, inline, value = a.partition("=") if a.startswith("--") else (a, "", "")
        if "{" in flag or "}" in flag:
            raise ValueError(f"{where}[{i}] = {_short(a)}: a flag is never substituted ({{task}} and {{seed}} go in "
                             "values)")
        if flag in NOT_GRID_FLAGS:
            raise ValueError(f"{where}[{i}]: {flag} is not for a grid file to decide ({NOT_GRID_FLAGS[flag]})")
        if flag not in GRID_FLAGS:
            raise ValueError(f"{where}[{i}] = {_short(a)}: not a flag a grid may pass; a grid's args hold "
                             f"`relive train` flags of what a run trains and reads: {', '.join(sorted(GRID_FLAGS))}")
        if GRID_FLAGS[flag] == 0:
            if inline:
                raise ValueError(f"{where}[{i}] = {_short(a)}: {flag} takes no value")
            i += 1
            continue
        if not inline:
            if i + 1 >= len(args) or (args[i + 1].startswith("-") and not _NUMBER.fullmatch(args[i + 1])):
                raise ValueError(f"{where}[{i}]: {flag} needs a value after it (in the same args list)")
            i += 1
            value = args[i]
        if flag == "--set":
            key = "".join(value.partition("=")[0].split())
            if "{" in key or "}" in key:
                raise ValueError(f"{where}[{i}] = {_short(value)}: a --set key is never substituted ({{task}} and "
                                 "{{seed}} go in its value)")
            if key in NOT_GRID_SETTINGS:
                flag = NOT_GRID_SETTINGS[key]
                raise ValueError(f"{where}[{i}]: --set {key} is not for a grid file to decide "
                                 f"({NOT_GRID_FLAGS[flag]})")
        i += 1


def names_base_policy(args: tuple[str, ...]) -> bool:
    """Whether a run's arguments give it a base policy (``--base-policy`` or ``--set agent.base_policy=``): the
    runs that ``relive bench run --trust-code`` passes ``--trust-code`` to."""
    for i, a in enumerate(args):
        value = args[i + 1] if i + 1 < len(args) else ""
        if a == "--base-policy" or a.startswith("--base-policy="):
            return True
        if a.startswith("--set="):
            value, a = a.partition("=")[2], "--set"
        if a == "--set" and "".join(value.partition("=")[0].split()) == "agent.base_policy":
            return True
    return False


def _seeds(value, where: str) -> tuple[int, ...]:
    """``seeds = N`` (seeds 0..N-1) or a list of distinct seeds, at most MAX_SEEDS of them."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEEDS:
            raise ValueError(f"{where} = {value}: a number of seeds from 1 to {MAX_SEEDS}")
        return tuple(range(value))
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a number of seeds or a list of seeds, got {type(value).__name__} "
                         f"{_short(value)}")
    if not 1 <= len(value) <= MAX_SEEDS:
        raise ValueError(f"{where}: from 1 to {MAX_SEEDS} seeds, got {len(value)}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SEED:
            raise ValueError(f"{where}[{i}] = {_short(v)}: a seed is an integer from 0 to {MAX_SEED}")
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: seeds must be distinct, got {_short(value)}")
    return tuple(value)


def _tasks(value, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ValueError(f"{where} must be a list of tasks, got the string {_short(value)} (write tasks = "
                         f"[{json.dumps(value)}])")
    return _list(value, where, lambda v, w: check_name(v, "task", f"{w}: "), 'e.g. ["Pendulum-v1"]')


def _check_report(report, name: str) -> dict:
    where = f"grid {name!r}: [report]"
    _table(report, where, _REPORT)
    for key in ("thresholds", "paper"):
        if key in report:
            _table(report[key], f"{where} {key}", set(report[key]) if isinstance(report[key], dict) else set())
            for task, v in report[key].items():
                if key == "thresholds" and (isinstance(v, bool) or not isinstance(v, int | float)):
                    raise ValueError(f"{where} thresholds.{task} must be a number, got {_short(v)}")
                if key == "paper":
                    _str(v, f"{where} paper.{task}")
    for key in ("baseline", "score", "compare"):
        if key in report:
            _str(report[key], f"{where} {key}")
    if "auc" in report:
        _bool(report["auc"], f"{where} auc")
    for i, fig in enumerate(_list(report.get("figure", []), f"{where} figure", lambda v, w: v, "[[report.figure]]")):
        w = f"{where} figure #{i}"
        _table(fig, w, _FIGURE)
        if "name" not in fig:
            raise ValueError(f"{w} lacks a name (its plot is <grid>_<name>.png)")
        check_name(fig["name"], "figure name", f"{w}: ")
        for key in ("title", "column"):
            if key in fig:
                _str(fig[key], f"{w} {key}")
        for key in ("labels", "tasks"):
            if key in fig:
                _list(fig[key], f"{w} {key}", _str, "a list of strings")
        if "log_y" in fig:
            _bool(fig["log_y"], f"{w} log_y")
    return dict(report)


def parse_grid(raw: dict, default_name: str = "grid") -> Grid:
    """A grid from its TOML table, checked against the schema first (types, ranges, known keys; every name that
    becomes a path a plain name), so that nothing is expanded from a file that is not a grid."""
    _table(raw, "grid file", _TOP)
    name = check_name(raw.get("name", default_name), "grid name", "")
    where = f"grid {name!r}:"
    description = _str(raw.get("description", ""), f"{where} description")
    seeds = _seeds(raw.get("seeds", 1), f"{where} seeds")
    tasks = _tasks(raw.get("tasks", []), f"{where} tasks")
    args = _args(raw.get("args", []), f"{where} args")
    variants = []
    raw_variants = raw.get("variant", [])
    if not isinstance(raw_variants, list):
        raise ValueError(f"{where} variant must be [[variant]] tables, got {type(raw_variants).__name__}")
    for i, v in enumerate(raw_variants):
        w = f"{where} variant #{i}"
        _table(v, w, _VARIANT)
        missing = [k for k in ("label", "preset") if k not in v]
        if missing:
            raise ValueError(f"{w} lacks {missing}")
        label = check_name(v["label"], "variant label", f"{w}: ")
        w = f"{where} variant {label!r}"
        v_seeds = _seeds(v["seeds"], f"{w} seeds") if "seeds" in v else ()
        if set(v_seeds) - set(seeds):
            raise ValueError(f"{w} has seeds outside the grid's {list(seeds)}")
        preset = check_name(_str(v["preset"], f"{w} preset"), "preset", f"{w}: ")  # (a name, never a flag)
        variants.append(Variant(label, preset, _args(v.get("args", []), f"{w} args"),
                                _tasks(v.get("tasks", []), f"{w} tasks"), v_seeds))
    if not variants:
        raise ValueError(f"{where} no [[variant]] entries")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where} variant labels must be unique, got {labels}")
    for v in variants:
        if not (v.tasks or tasks):
            raise ValueError(f"{where} variant {v.label!r} has no tasks (set tasks = [...])")
    raw_task_args = raw.get("task_args", {})
    _table(raw_task_args, f"{where} [task_args]", set(raw_task_args) if isinstance(raw_task_args, dict) else set())
    task_args = {check_name(k, "task", f"{where} [task_args]: "): _args(v, f"{where} task_args.{k}")
                 for k, v in raw_task_args.items()}
    report = _check_report(raw.get("report", {}), name)
    num_runs = sum(len(v.tasks or tasks) * len(v.seeds or seeds) for v in variants)
    if num_runs > MAX_RUNS:
        raise ValueError(f"{where} {num_runs} runs (variants x tasks x seeds), more than {MAX_RUNS}; split the grid")
    return Grid(name, tuple(variants), tasks, seeds, report, description, task_args, args)
