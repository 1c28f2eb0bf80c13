"""Reports over a grid's run directories: Markdown tables, IQM with bootstrap CIs, learning curves.

Reads only what runs wrote (``eval.csv``, ``summary.json``, ``crash.json``); never re-runs anything.
- Per task and variant: "offline -> online +- std" (CORL style): the score at the end of the offline phase
  (first evaluation, at online env step 0) and at the end of training, mean +- std over seeds.
- Aggregate over tasks: interquartile mean with stratified-bootstrap 95% confidence intervals (rliable).
- Learning curves: mean over seeds with a shaded 95% bootstrap interval, one panel per task.
- Optional, from the grid's [report] table: env steps to reach a score threshold (ReaPER's metric):
  mean +- SD over the runs that reach it, the fraction that reach it, and the reduction vs a baseline.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from relive.cli import refuse_overwrite, write_generated
from relive.experiments.grid import Grid
from relive.experiments.runner import CRASHED, FINISHED, run_dir_of

STEP_KEYS = ("env_step", "num_online_env_steps", "step")
SCORE_KEYS = ("eval/normalized_score", "eval/return_mean", "eval/return")
FRACTION_KEY = "replay/online_fraction"


@dataclass
class RunData:
    label: str
    task: str
    seed: int
    steps: np.ndarray
    scores: np.ndarray
    score_key: str
    summary: dict
    curves: dict  # other columns of eval.csv by name
    logged: dict = field(default_factory=dict)  # metrics.jsonl keys a figure asks for: name -> (env steps, values)

    def series(self, column: str | None) -> tuple[np.ndarray, np.ndarray] | None:
        """(steps, values) of the score (None), an eval.csv column, or a logged metrics.jsonl key."""
        if column is None:
            return self.steps, self.scores
        if column in self.curves:
            return self.steps, self.curves[column]
        return self.logged.get(column)


def _read_eval(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return np.zeros(0), {}
    cols = {k: np.array([_num(r.get(k)) for r in rows]) for k in rows[0]}
    step_key = next((k for k in STEP_KEYS if k in cols), None)
    if step_key is None:
        raise ValueError(f"{path}: no step column (one of {STEP_KEYS}) in {list(cols)}")
    return cols.pop(step_key), cols


def _read_logged(path: Path, keys: set[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Online-phase lines of ``metrics.jsonl``: for each key, (env steps, values) where the key was logged."""
    out: dict[str, tuple[list, list]] = {k: ([], []) for k in keys}
    if not keys or not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a partial last line of a killed run
        if not isinstance(row, dict) or row.get("phase") != "online":
            continue  # (not a metrics line: nothing to plot from it)
        for k in keys:
            if k in row:
                out[k][0].append(_num(row.get("env_step")))
                out[k][1].append(_num(row[k]))
    return {k: (np.asarray(a), np.asarray(b)) for k, (a, b) in out.items() if a}


def _read_summary(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: not a run summary (a JSON object)")
    return summary


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def collect(grid: Grid, root: str | Path) -> tuple[list[RunData], list[str], list[str]]:
    """Finished runs' data, plus the keys of crashed and of missing runs."""
    data, crashed, missing = [], [], []
    for spec in grid.runs():
        d = run_dir_of(Path(root), spec)
        if (d / CRASHED).is_file() and not (d / FINISHED).is_file():
            crashed.append(spec.key)
            continue
        if not (d / FINISHED).is_file() or not (d / "eval.csv").is_file():
            missing.append(spec.key)
            continue
        steps, cols = _read_eval(d / "eval.csv")
        keys = (grid.report["score"],) if "score" in grid.report else SCORE_KEYS  # [report] score = "..." picks one
        key = next((k for k in keys if k in cols and np.isfinite(cols[k]).any()), None)
        if key is None:
            missing.append(spec.key)
            continue
        logged_keys = {f["column"] for f in grid.report.get("figure", []) if f.get("column")} - set(cols)
        data.append(RunData(spec.label, spec.task, spec.seed, steps, cols[key], key, _read_summary(d / FINISHED),
                            cols, _read_logged(d / "metrics.jsonl", logged_keys)))
    return data, crashed, missing


def iqm_with_ci(scores_by_label: dict[str, np.ndarray], reps: int = 2000, seed: int = 0) -> dict[str, tuple]:
    """IQM and stratified-bootstrap 95% CI per label; scores are [num_runs, num_tasks] arrays."""
    try:
        from rliable import library as rly  # (optional: relive[experiments])
        from rliable import metrics
    except ImportError as e:
        raise ValueError("reports need rliable (bootstrap confidence intervals): pip install 'relive[experiments]'"
                         ) from e

    np.random.seed(seed)  # noqa: NPY002 - rliable's bootstrap draws from numpy's global generator
    point, ci = rly.get_interval_estimates(
        scores_by_label, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps)
    return {k: (float(point[k][0]), float(ci[k][0, 0]), float(ci[k][1, 0])) for k in scores_by_label}


def steps_to_threshold(steps: np.ndarray, scores: np.ndarray, threshold: float) -> float:
    """First evaluated env step whose score reaches ``threshold`` (nan if never)."""
    hit = np.flatnonzero(scores >= threshold)
    return float(steps[hit[0]]) if hit.size else math.nan


def _mann_whitney(a: np.ndarray, b: np.ndarray) -> str:
    from scipy.stats import mannwhitneyu  # (slow to import: only for the test statistic)

    if len(a) < 2 or len(b) < 2:
        return "n/a"
    return f"{mannwhitneyu(a, b, alternative='two-sided').pvalue:.2f}"


def paired_change(base: dict, other: dict, reps: int = 2000, seed: int = 0) -> dict:
    """Steps to a threshold paired by seed (seed -> steps, nan = never reached): over the seeds where both reached,
    mean(other) / mean(base) - 1 with a percentile bootstrap CI (seeds resampled with replacement) and a two-sided
    Wilcoxon signed-rank p (ties, e.g. both runs stopping at the same evaluation, dropped: scipy's default); and the
    seeds only one of the two reached."""
    from scipy.stats import wilcoxon  # (slow to import: only for the test statistic)

    seeds = sorted(set(base) & set(other))
    a = np.array([base[s] for s in seeds], float)
    b = np.array([other[s] for s in seeds], float)
    both = np.isfinite(a) & np.isfinite(b)
    out = {"pairs": int(both.sum()), "only_base": int((np.isfinite(a) & ~np.isfinite(b)).sum()),
           "only_other": int((~np.isfinite(a) & np.isfinite(b)).sum()),
           "change": math.nan, "lo": math.nan, "hi": math.nan, "p": "—"}
    a, b = a[both], b[both]
    if a.size < 2 or a.mean() <= 0:
        return out
    idx = np.random.default_rng(seed).integers(0, a.size, (reps, a.size))
    ratios = b[idx].mean(1) / a[idx].mean(1) - 1
    out |= {"change": b.mean() / a.mean() - 1, "lo": float(np.quantile(ratios, 0.025)),
            "hi": float(np.quantile(ratios, 0.975))}
    if np.any(a != b):
        out["p"] = f"{wilcoxon(b, a).pvalue:.2f}"
    return out


def stratified_rank_test(a: dict, b: dict, reps: int = 20_000, seed: int = 0) -> tuple[float, float, int]:
    """Variant ``a`` against ``b`` over several tasks whose raw returns are on different scales (task -> scores per
    run, the tasks both hold with 2+ runs each): a permutation test of van Elteren's stratified rank statistic --
    per task the mean rank of a's runs minus b's among the task's pooled runs, over n_t + 1, summed over the tasks --
    with the labels shuffled within each task, two-sided. Returns (the probability that a run of a scores above a
    run of b of the same task, ties half, averaged over the tasks; the p-value; the number of tasks), or
    (nan, nan, 0) without such a task."""
    from scipy.stats import rankdata  # (slow to import: only for the test statistic)

    tasks = [task for task in a if task in b and len(a[task]) >= 2 and len(b[task]) >= 2]
    if not tasks:
        return math.nan, math.nan, 0
    rng = np.random.default_rng(seed)
    observed, null, superiority = 0.0, np.zeros(reps), []
    for task in tasks:
        x, y = np.asarray(a[task], float), np.asarray(b[task], float)
        n_a, n = x.size, x.size + y.size
        ranks = rankdata(np.concatenate([x, y]))  # (ties: average ranks)
        superiority.append((ranks[:n_a].sum() - n_a * (n_a + 1) / 2) / (n_a * y.size))  # Mann-Whitney U / (n_a n_b)
        weight = 1.0 / (n + 1)
        observed += weight * (ranks[:n_a].mean() - ranks[n_a:].mean())
        perm = rng.permuted(np.broadcast_to(ranks, (reps, n)), axis=1)  # the labels shuffled within the task
        null += weight * (perm[:, :n_a].mean(1) - perm[:, n_a:].mean(1))
    # (a permutation that equals the observed labels reaches its statistic up to float rounding: a tolerance)
    p = (1 + np.count_nonzero(np.abs(null) >= abs(observed) - 1e-12)) / (reps + 1)
    return float(np.mean(superiority)), float(p), len(tasks)


def online_means(runs) -> np.ndarray:
    """Per run, the mean of every evaluation after the first (area under the online learning curve), on the
    runs' common steps (a run stopped at a threshold holds its last score)."""
    ys = align_curves([(r.steps, r.scores) for r in runs])[1] if runs else np.zeros((0, 0))
    return np.nanmean(ys[:, 1:], axis=1) if ys.shape[1] > 1 else np.zeros(0)


def _fmt(mean: float, std: float, digits: int = 1) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if np.isfinite(mean) else "—"


NOTES_MARKER = "<!-- notes below are kept by `relive bench report` -->"


def report_path(grid: Grid, out_dir: str | Path) -> Path:
    return Path(out_dir) / f"{grid.name}.md"


def make_report(grid: Grid, root: str | Path, out_dir: str | Path, reps: int = 2000, overwrite: bool = False) -> Path:
    """Write ``<out_dir>/<grid>.md`` and PNG plots beside it; returns the Markdown path. An existing report is
    replaced only with ``overwrite``; notes below its ``NOTES_MARKER`` line are kept."""
    refuse_overwrite(report_path(grid, out_dir), overwrite)  # before any plot is written over
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data, crashed, missing = collect(grid, root)
    t = _group(grid, data, reps)
    lines = [f"# {grid.name}", ""]
    if grid.description:
        lines += [grid.description.strip(), ""]
    lines += [f"Runs: {len(data)} finished, {len(crashed)} crashed, {len(missing)} missing "
              f"(of {len(grid.runs())}). Score: `{t.score_key}`.", ""]
    lines += _first_final_table(t)
    if grid.report.get("auc", False):
        lines += _online_mean_table(t)
    lines += _iqm_table(t)
    if grid.report.get("compare") in t.labels:
        lines += _compare_table(t, grid.report["compare"])
        if len(t.tasks) > 1:
            lines += _stratified_table(t, grid.report["compare"])
    if t.mixed:
        lines += _online_share_table(t)
    if grid.report.get("thresholds", {}):
        lines += _threshold_tables(t, grid.report["thresholds"])
    lines += _figures(t, out_dir)
    if crashed:
        lines += ["## Crashed runs", ""] + [f"- `{k}` (see its crash.json)" for k in crashed] + [""]
    if missing:
        lines += ["## Missing runs", "", f"{len(missing)} runs have not finished: " +
                  ", ".join(f"`{k}`" for k in missing[:20]) + (" ..." if len(missing) > 20 else ""), ""]
    md = report_path(grid, out_dir)
    write_generated(md, "\n".join(lines), NOTES_MARKER, overwrite)
    return md


@dataclass
class _Grouped:
    """The finished runs as every section of a report reads them."""
    grid: Grid
    data: list[RunData]
    labels: list[str]  # variants in the grid's order
    tasks: list[str]  # tasks with a finished run, in the grid's order
    by: dict[tuple[str, str], list[RunData]]  # (label, task) -> runs
    score_key: str
    final: dict[str, dict[str, np.ndarray]]  # label -> task -> final score per run
    online: dict[tuple[str, str], np.ndarray]  # (label, task) -> mean online score per run
    mixed: bool  # some runs sample offline rows too (pure online runs sample online rows only)
    reps: int  # bootstrap resamples


def _group(grid: Grid, data: list[RunData], reps: int) -> _Grouped:
    by = defaultdict(list)
    for r in data:
        by[(r.label, r.task)].append(r)
    final: defaultdict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for (label, task), runs in by.items():
        final[label][task] = np.array([r.scores[-1] for r in runs])
    fractions = np.concatenate([r.curves[FRACTION_KEY] for r in data if FRACTION_KEY in r.curves] or [[]])
    fractions = fractions[np.isfinite(fractions)]
    return _Grouped(
        grid, data, labels=[v.label for v in grid.variants],
        tasks=sorted({r.task for r in data}, key=lambda t: (grid.tasks + (t,)).index(t)), by=by,
        score_key=data[0].score_key if data else SCORE_KEYS[0], final=final,
        online={key: online_means(runs) for key, runs in by.items()},
        mixed=bool(fractions.size) and not np.all(fractions == 1.0), reps=reps)


def _first_final_table(t: _Grouped) -> list[str]:
    """Per task and variant: first -> final evaluation (CORL's "offline -> online"), and CORL's average row."""
    lines = ["## First → final evaluation (mean ± std over seeds)", "",
             "For offline-to-online runs the first evaluation is the score after the offline phase (CORL's "
             "\"offline → online\").", "",
             "| task | " + " | ".join(t.labels) + " |", "|---|" + "---|" * len(t.labels)]
    first_means = defaultdict(list)  # label -> mean first score per task
    for task in t.tasks:
        cells = []
        for label in t.labels:
            runs = t.by.get((label, task), [])
            if not runs:
                cells.append("—")
                continue
            first = np.array([r.scores[0] for r in runs])
            last = t.final[label][task]
            cells.append(f"{_fmt(first.mean(), first.std())} → {_fmt(last.mean(), last.std())} (n={len(runs)})")
            first_means[label].append(first.mean())
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    if t.score_key == SCORE_KEYS[0] and len(t.tasks) > 1:  # CORL's average row: normalized scores only
        cells = [f"{np.mean(first_means[lab]):.1f} → {np.mean([t.final[lab][task].mean() for task in t.tasks]):.1f}"
                 if all(task in t.final[lab] for task in t.tasks) else "—" for lab in t.labels]
        lines.append("| **average** | " + " | ".join(cells) + " |")
    return lines + [""]


def _online_mean_table(t: _Grouped) -> list[str]:
    """Learning speed: the mean over every online evaluation (area under the curve)."""
    lines = ["## Mean score over the online evaluations (area under the learning curve)", "",
             "The average of every evaluation after the first, per run; mean ± std over seeds. Separates "
             "variants that end at the same score but get there at different speeds.", "",
             "| task | " + " | ".join(t.labels) + " |", "|---|" + "---|" * len(t.labels)]
    for task in t.tasks:
        cells = []
        for label in t.labels:
            auc = t.online.get((label, task), np.zeros(0))
            cells.append(f"{_fmt(auc.mean(), auc.std())} (n={auc.size})" if auc.size else "—")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines + [""]


def _iqm_table(t: _Grouped) -> list[str]:
    """IQM of the final score with bootstrap CIs: across tasks for normalized scores, else one per task."""
    final, tasks = t.final, t.tasks
    complete = [lab for lab in t.labels if all(task in final[lab] for task in tasks) and tasks]
    if complete and len(tasks) > 1 and t.score_key != SCORE_KEYS[0]:
        # raw returns of different tasks live on different scales: an IQM across them means nothing
        lines = ["## Final score: IQM over runs per task, 95% bootstrap CI", "",
                 "Raw returns (no normalization references), so one IQM per task rather than across tasks.", "",
                 "| variant | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        per_task = {task: iqm_with_ci({lab: final[lab][task][:, None] for lab in complete}, reps=t.reps)
                    if min(len(final[lab][task]) for lab in complete) >= 2 else {} for task in tasks}
        for lab in complete:
            lines.append(f"| {lab} | " + " | ".join(
                f"{per_task[task][lab][0]:.1f} [{per_task[task][lab][1]:.1f}, {per_task[task][lab][2]:.1f}]"
                if lab in per_task[task] else "—" for task in tasks) + " |")
        return lines + [""]
    if not complete:
        return []
    # each variant with all of its own seeds (an ablation run on fewer seeds does not shrink the others)
    n_of = {lab: min(len(final[lab][task]) for task in tasks) for lab in complete}
    complete = [lab for lab in complete if n_of[lab] >= 2]
    if not complete:
        return []
    iqm = iqm_with_ci({lab: np.stack([final[lab][task][:n_of[lab]] for task in tasks], axis=1)
                       for lab in complete}, reps=t.reps)
    return (["## Aggregate final score: IQM over runs x tasks, 95% stratified-bootstrap CI", "",
             "| variant | runs per task | IQM | 95% CI |", "|---|---|---|---|"]
            + [f"| {lab} | {n_of[lab]} | {iqm[lab][0]:.1f} | [{iqm[lab][1]:.1f}, {iqm[lab][2]:.1f}] |"
               for lab in complete] + [""])


def _compare_table(t: _Grouped, focal: str) -> list[str]:
    """One variant against each of the others (e.g. ARB vs the other replays)."""
    lines = [f"## {focal} vs each other variant", "",
             f"Difference of the means ({focal} minus the other) of the final score and of the mean over the "
             "online evaluations, with two-sided Mann-Whitney U p-values over the runs.", "",
             "| task | vs | final score | mean over the online evaluations |", "|---|---|---|---|"]
    for task in t.tasks:
        if (focal, task) not in t.by:
            continue
        for other in t.labels:
            if other == focal or (other, task) not in t.by:
                continue
            cells = []
            for a, b in ((t.final[focal][task], t.final[other][task]),
                         (t.online[focal, task], t.online[other, task])):
                cells.append(f"{a.mean() - b.mean():+.2f} (p={_mann_whitney(a, b)})" if a.size and b.size else "—")
            lines.append(f"| {task} | {other} | " + " | ".join(cells) + " |")
    return lines + [""]


def _stratified_table(t: _Grouped, focal: str) -> list[str]:
    """The focal variant against each other one over all the tasks at once (raw returns: ranks within each task)."""
    lines = [f"## {focal} vs each other variant over all {len(t.tasks)} tasks: stratified rank test", "",
             f"P({focal} > other): the probability that a run of {focal} scores above a run of the other variant on "
             "the same task (ties half), averaged over the tasks (0.5: no difference); p: a two-sided permutation "
             "test of van Elteren's stratified rank sum (labels shuffled within each task, "
             f"{t.reps * 10:,} permutations). One test per pair and score over every task, instead of one per task.",
             "", "| vs | tasks | final score: P(> other), p | mean over the online evaluations: P(> other), p |",
             "|---|---|---|---|"]
    for other in t.labels:
        if other == focal:
            continue
        cells, counts = [], []
        for get in (lambda lab, task: t.final[lab].get(task, np.zeros(0)),
                    lambda lab, task: t.online.get((lab, task), np.zeros(0))):
            a = {task: get(focal, task) for task in t.tasks}
            b = {task: get(other, task) for task in t.tasks}
            sup, p, n = stratified_rank_test(a, b, reps=t.reps * 10)
            cells.append(f"{sup:.2f}, p={p:.3f}" if n else "—")
            counts.append(n)
        lines.append(f"| {other} | {max(counts)} | " + " | ".join(cells) + " |")
    return lines + [""]


def _online_share_table(t: _Grouped) -> list[str]:
    """The online share of sampled batches at the last evaluation (ARB's Figure 1 in numbers)."""
    shares = defaultdict(list)
    for r in t.data:
        f = r.curves.get(FRACTION_KEY)
        if f is not None and f.size and np.isfinite(f[-1]):
            shares[(r.label, r.task)].append(float(f[-1]))
    lines = ["## Online share of sampled batches at the last evaluation", "",
             "Mean over seeds [smallest, largest].", "",
             "| task | " + " | ".join(t.labels) + " |", "|---|" + "---|" * len(t.labels)]
    for task in t.tasks:
        cells = [f"{np.mean(v):.3f} [{min(v):.3f}, {max(v):.3f}]" if (v := shares.get((lab, task))) else "—"
                 for lab in t.labels]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines + [""]


def _threshold_tables(t: _Grouped, thresholds: dict) -> list[str]:
    """Env steps to reach a score threshold (ReaPER's metric) per variant, then paired by seed vs the baseline."""
    labels = t.labels
    base = t.grid.report.get("baseline", labels[0])
    paper = t.grid.report.get("paper", {})
    paired: dict[str, dict] = {}
    lines = ["## Env steps to reach the threshold", "",
             "Mean ± SD over the runs that reach the threshold (the fraction that do in brackets); the change "
             f"in mean steps vs {base} with a two-sided Mann-Whitney U p-value over those runs.", "",
             "| task (threshold) | " + " | ".join(labels) + f" | steps vs {base} | paper |",
             "|---|" + "---|" * (len(labels) + 2)]
    for task in t.tasks:
        if task not in thresholds:
            continue
        cells, means, reached_by = [], {}, {}
        for label in labels:
            runs = t.by.get((label, task), [])
            hits = np.array([steps_to_threshold(r.steps, r.scores, thresholds[task]) for r in runs])
            reached = reached_by[label] = hits[np.isfinite(hits)]
            means[label] = reached.mean() if reached.size else math.nan
            sd = reached.std(ddof=1) if reached.size > 1 else math.nan
            cells.append(f"{_fmt(means[label], sd, 0)} ({reached.size}/{len(runs)} reach)" if runs else "—")
        reductions = ", ".join(
            f"{lab}: {100 * (means[lab] / means[base] - 1):+.0f}% "
            f"(p={_mann_whitney(reached_by[lab], reached_by[base])})"
            for lab in labels if lab != base and np.isfinite(means.get(lab, math.nan))
            and np.isfinite(means.get(base, math.nan)) and means[base] > 0)
        lines.append(f"| {task} ({thresholds[task]}) | " + " | ".join(cells)
                     + f" | {reductions or '—'} | {paper.get(task, '—')} |")
        hits_by_seed = {label: {r.seed: steps_to_threshold(r.steps, r.scores, thresholds[task])
                                for r in t.by.get((label, task), [])} for label in labels}
        paired[task] = {lab: paired_change(hits_by_seed[base], hits_by_seed[lab], reps=t.reps)
                        for lab in labels if lab != base}
    lines.append("")
    if any(p["pairs"] for per_task in paired.values() for p in per_task.values()):
        lines += _paired_threshold_table(paired, base)
    return lines


def _paired_threshold_table(paired: dict[str, dict], base: str) -> list[str]:
    """``paired``: task -> variant -> ``paired_change`` against ``base``; rows where some seed pair both reached."""
    lines = ["Paired by seed (the variants of a seed share its initial network and environment seeds): over "
             "the seeds where both runs reach the threshold, the change in mean steps with a 95% bootstrap "
             "CI (seeds resampled) and a Wilcoxon signed-rank p; then how many seeds only one of the two "
             "reached.", "",
             f"| task | variant vs {base} | seeds (both reach) | change in mean steps [95% CI] "
             f"| Wilcoxon p | only {base} reaches | only the variant reaches |",
             "|---|---|---|---|---|---|---|"]
    for task, per_task in paired.items():
        for lab, p in per_task.items():
            if p["pairs"]:
                lines.append(f"| {task} | {lab} | {p['pairs']} | {100 * p['change']:+.0f}% "
                             f"[{100 * p['lo']:+.0f}%, {100 * p['hi']:+.0f}%] | {p['p']} | "
                             f"{p['only_base']} | {p['only_other']} |")
    return lines + [""]


def _figures(t: _Grouped, out_dir: Path) -> list[str]:
    """Learning curves (and the online fraction of mixed runs), then the grid's [[report.figure]] entries: a subset
    of variants and tasks, the score or a column. Writes the PNGs; returns the Markdown that shows them."""
    grid, by, labels, tasks = t.grid, t.by, t.labels, t.tasks
    lines = []
    if t.data:
        png = plot_curves(grid, by, labels, tasks, out_dir / f"{grid.name}_curves.png", t.score_key)
        lines += [f"![learning curves]({png.name})", ""]
        if t.mixed:
            png = plot_curves(grid, by, labels, tasks, out_dir / f"{grid.name}_online_fraction.png",
                              FRACTION_KEY, column=FRACTION_KEY)
            lines += [f"![online fraction]({png.name})", ""]
    for fig in grid.report.get("figure", []):
        fig_labels = [lab for lab in fig.get("labels", labels) if lab in labels]
        fig_tasks = [task for task in fig.get("tasks", tasks) if task in tasks]
        column = fig.get("column")
        if not fig_labels or not fig_tasks or not any(by.get((lab, task)) for lab in fig_labels for task in fig_tasks):
            continue
        png = plot_curves(grid, by, fig_labels, fig_tasks, out_dir / f"{grid.name}_{fig['name']}.png",
                          column or t.score_key, column=column, title=fig.get("title"), log_y=fig.get("log_y", False))
        lines += [f"### {fig.get('title', fig['name'])}", "", f"![{fig['name']}]({png.name})", ""]
    return lines


def _bootstrap_band(curves: np.ndarray, reps: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = curves.shape[0]
    if n < 2:
        return curves[0], curves[0]
    means = curves[rng.integers(0, n, size=(reps, n))].mean(axis=1)
    return np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0)


def align_curves(series: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Put runs' curves on the longest run's evaluation steps, each holding its last value after it ends: a run
    stopped at its score threshold (``run.stop_at_return``, the ReaPER protocol) counts as solved from then on."""
    steps = max((s for s, _ in series), key=len)
    ys = []
    for s, y in series:
        idx = np.searchsorted(s, steps, side="right") - 1
        ys.append(np.where(idx >= 0, y[np.clip(idx, 0, len(y) - 1)], y[0]))
    return steps, np.stack(ys)


def plot_curves(grid, by, labels, tasks, path: Path, ylabel: str, column: str | None = None,
                title: str | None = None, log_y: bool = False) -> Path:
    import matplotlib  # (slow to import: only to plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # (slow to import: only to plot)

    fig, axes = plt.subplots(1, len(tasks), figsize=(max(6.5, 4.2 * len(tasks)), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for label in labels:
            runs = by.get((label, task), [])
            if not runs:
                continue
            series = [r.series(column) for r in runs]
            series = [(s, y) for s, y in (x for x in series if x is not None) if y is not None and len(s)]
            if not series:
                continue
            steps, ys = align_curves(series)
            lo, hi = _bootstrap_band(ys)
            (line,) = ax.plot(steps, ys.mean(axis=0), label=f"{label} (n={len(series)})")
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
        ax.set_title(task)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel("online env steps")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{title or grid.name}: mean over seeds, shaded 95% bootstrap CI", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
