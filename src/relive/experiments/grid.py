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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import tomllib

GRID_DIR = Path(__file__).parent / "grids"


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
        """Relative run directory: ``label/task/seed_N``."""
        return f"{self.label}/{self.task}/seed_{self.seed}"


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
    return parse_grid(raw, default_name=path.stem)


def parse_grid(raw: dict, default_name: str = "grid") -> Grid:
    name = raw.get("name", default_name)
    seeds = raw.get("seeds", 1)
    seeds = tuple(range(seeds)) if isinstance(seeds, int) else tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError(f"grid {name!r}: no seeds")
    tasks = tuple(raw.get("tasks", ()))
    variants = []
    for i, v in enumerate(raw.get("variant", [])):
        missing = [k for k in ("label", "preset") if k not in v]
        if missing:
            raise ValueError(f"grid {name!r}: variant #{i} lacks {missing}")
        v_seeds = v.get("seeds", ())
        v_seeds = tuple(range(v_seeds)) if isinstance(v_seeds, int) else tuple(int(s) for s in v_seeds)
        if set(v_seeds) - set(seeds):
            raise ValueError(f"grid {name!r}: variant {v['label']!r} has seeds outside the grid's {list(seeds)}")
        variants.append(Variant(v["label"], v["preset"], tuple(str(a) for a in v.get("args", ())),
                                tuple(v.get("tasks", ())), v_seeds))
    if not variants:
        raise ValueError(f"grid {name!r}: no [[variant]] entries")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"grid {name!r}: variant labels must be unique, got {labels}")
    for v in variants:
        if not (v.tasks or tasks):
            raise ValueError(f"grid {name!r}: variant {v.label!r} has no tasks (set tasks = [...])")
    task_args = {str(k): tuple(str(a) for a in v) for k, v in raw.get("task_args", {}).items()}
    return Grid(name, tuple(variants), tasks, seeds, dict(raw.get("report", {})), raw.get("description", ""),
                task_args, tuple(str(a) for a in raw.get("args", ())))
