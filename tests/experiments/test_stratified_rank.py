"""The stratified rank test of reports over raw-return tasks (relive.experiments.report.stratified_rank_test):
one test per pair of variants over every task at once, ranks taken within each task."""

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from relive.experiments.grid import parse_grid
from relive.experiments.report import make_report, stratified_rank_test
from tests.experiments.test_runner import _fake_run


def test_superiority_counts_pairs_with_ties_as_half():
    # a = [2, 3] vs b = [1, 4]: 2 > 1, 2 < 4, 3 > 1, 3 < 4 -> 2 of 4; a = [2, 2] vs b = [1, 2]: 1 + 0.5 + 1 + 0.5 of 4
    assert stratified_rank_test({"A": [2, 3]}, {"A": [1, 4]}, reps=100)[0] == pytest.approx(0.5)
    assert stratified_rank_test({"A": [2, 2]}, {"A": [1, 2]}, reps=100)[0] == pytest.approx(0.75)
    # averaged over the tasks, each task on its own scale
    sup, _, n = stratified_rank_test({"A": [2, 2], "B": [900, 1000]}, {"A": [1, 2], "B": [-5, 2000]}, reps=100)
    assert (sup, n) == (pytest.approx((0.75 + 0.5) / 2), 2)


def test_one_task_matches_the_exact_mann_whitney_p_value():
    a, b = [3.0, 5.0, 6.0, 8.0, 9.0], [1.0, 2.0, 4.0, 7.0, 10.0]
    exact = mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue
    sup, p, _ = stratified_rank_test({"A": a}, {"A": b}, reps=40_000, seed=3)
    assert abs(p - exact) < 0.012  # (Monte Carlo: standard error ~0.0025 at 40,000 permutations)
    assert sup == pytest.approx(mannwhitneyu(a, b).statistic / 25)


def test_complete_separation_on_every_task_is_the_smallest_p_and_scales_do_not_matter():
    rng = np.random.default_rng(0)
    a = {f"T{i}": rng.normal(10, 1, 5) for i in range(5)}
    b = {f"T{i}": rng.normal(0, 1, 5) for i in range(5)}
    sup, p, n = stratified_rank_test(a, b, reps=5000)
    assert (sup, p, n) == (1.0, pytest.approx(1 / 5001), 5)
    scaled = stratified_rank_test({k: v * 10.0 ** i - 7 for i, (k, v) in enumerate(a.items())},
                                  {k: v * 10.0 ** i - 7 for i, (k, v) in enumerate(b.items())}, reps=5000)
    assert scaled == (sup, p, n)  # ranks within each task: a task's units do not weigh
    assert stratified_rank_test(b, a, reps=5000)[:2] == (0.0, pytest.approx(1 / 5001))


def test_a_consistent_edge_over_tasks_is_found_where_no_single_task_shows_it():
    # every task: a = [3, 5, 7, 9, 10] vs b = [1, 2, 4, 6, 8], 19 of 25 pairs to a (0.76): p = 0.22 on each task
    # alone (exact Mann-Whitney), well below 0.05 over the five together
    a = {f"T{i}": np.array([3.0, 5, 7, 9, 10]) * (i + 1) for i in range(5)}
    b = {f"T{i}": np.array([1.0, 2, 4, 6, 8]) * (i + 1) for i in range(5)}
    per_task = [mannwhitneyu(a[t], b[t], method="exact").pvalue for t in a]
    sup, p, _ = stratified_rank_test(a, b, reps=20_000)
    assert min(per_task) == pytest.approx(0.2222, abs=1e-4) and sup == pytest.approx(0.76)
    assert p < 0.01


def test_the_test_holds_its_level_under_the_null():
    """Seeded: 300 data sets where both variants draw from one distribution per task: about 5% of p < 0.05."""
    rng = np.random.default_rng(1)
    ps = []
    for _ in range(300):
        scale = rng.uniform(1, 100, 4)
        a = {f"T{i}": rng.normal(0, scale[i], 5) for i in range(4)}
        b = {f"T{i}": rng.normal(0, scale[i], 5) for i in range(4)}
        ps.append(stratified_rank_test(a, b, reps=1000, seed=int(rng.integers(1 << 30)))[1])
    rate = np.mean(np.array(ps) < 0.05)
    assert 0.02 <= rate <= 0.09, rate


def test_tasks_without_two_runs_on_both_sides_are_left_out():
    assert stratified_rank_test({"A": [1.0]}, {"A": [2.0, 3.0]}, reps=10)[2] == 0
    sup, p, n = stratified_rank_test({"A": [1.0], "B": [5.0, 6.0]}, {"A": [2.0, 3.0], "B": [1.0, 2.0]}, reps=100)
    assert (sup, n) == (1.0, 1) and np.isfinite(p)


def test_a_report_with_compare_over_several_tasks_has_the_stratified_table(tmp_path):
    g = parse_grid({"name": "strat", "seeds": 3, "tasks": ["A", "B"], "report": {"compare": "reaper"},
                    "variant": [{"label": "per", "preset": "ddqn"}, {"label": "reaper", "preset": "ddqn"}]})
    finals = {("per", "A"): [1, 2, 3], ("reaper", "A"): [4, 5, 6], ("per", "B"): [100, 300, 200],
              ("reaper", "B"): [250, 50, 350]}
    for (label, task), values in finals.items():
        for seed, v in enumerate(values):
            _fake_run(tmp_path / "strat", f"{label}/{task}/seed_{seed}", [0, 1000], [0, v])
    text = make_report(g, tmp_path, tmp_path / "out", reps=100).read_text()
    assert "## reaper vs each other variant over all 2 tasks: stratified rank test" in text
    # P(reaper > per): A 9 of 9 pairs; B: 250 > 100, 200; 50 > none; 350 > all three -> 5 of 9; mean (1 + 5/9) / 2
    sup, p, _ = stratified_rank_test({"A": [4, 5, 6], "B": [250, 50, 350]}, {"A": [1, 2, 3], "B": [100, 300, 200]},
                                     reps=1000)
    assert sup == pytest.approx((1 + 5 / 9) / 2)
    assert f"| per | 2 | {sup:.2f}, p={p:.3f} |" in text
