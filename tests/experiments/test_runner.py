import json

import numpy as np
import pytest

from relive.experiments.grid import parse_grid
from relive.experiments.report import make_report
from relive.experiments.runner import run_grid

TINY = ["--online-steps", "300", "--warmup", "100", "--eval-every", "100", "--eval-episodes", "1",
        "--batch-size", "32", "--set", "agent.hidden=[16,16]"]


def grid(extra_variant=None):
    raw = {
        "name": "tiny",
        "description": "two presets x two seeds, a few hundred steps",
        "seeds": 2,
        "tasks": ["Pendulum-v1"],
        "variant": [
            {"label": "sac-uniform", "preset": "sac", "args": [*TINY, "--replay", "uniform"]},
            {"label": "sac-per", "preset": "sac", "args": [*TINY, "--replay", "per"]},
        ],
        "report": {"figure": [{"name": "per_only", "title": "PER alone", "labels": ["sac-per", "no-such-label"]}],
                   "thresholds": {"Pendulum-v1": -1e9}, "baseline": "sac-uniform"},
    }
    if extra_variant:
        raw["variant"].append(extra_variant)
    return parse_grid(raw)


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_runner_skips_finished_runs_records_crashes_and_reports(tmp_path):
    broken = {"label": "broken", "preset": "sac", "args": [*TINY, "--set", "agent.num_qs=0"]}
    g = grid(broken)
    outcomes = run_grid(g, tmp_path, workers=2, progress=False)
    status = {o.spec.key: o.status for o in outcomes}
    assert sum(s == "finished" for s in status.values()) == 4
    assert status["broken/Pendulum-v1/seed_0"] == "crashed"
    crash = json.loads((tmp_path / "tiny" / "broken" / "Pendulum-v1" / "seed_0" / "crash.json").read_text())
    assert crash["returncode"] != 0 and any("num_qs" in line for line in crash["log_tail"])

    again = run_grid(g, tmp_path, workers=2, progress=False)
    again_status = {o.spec.key: o.status for o in again}
    assert all(again_status[k] == "skipped" for k, v in status.items() if v == "finished")

    md = make_report(g, tmp_path, tmp_path / "report", reps=200)
    text = md.read_text()
    assert "| Pendulum-v1 |" in text and "→" in text and "IQM" in text and "Crashed runs" in text
    assert (tmp_path / "report" / "tiny_curves.png").stat().st_size > 1000
    assert (tmp_path / "report" / "tiny_per_only.png").stat().st_size > 1000 and "### PER alone" in text
    # every run reaches a threshold of -1e9 at its first evaluation (env step 0)
    assert "| Pendulum-v1 (-1000000000.0) | 0 ± 0 (2/2 reach) | 0 ± 0 (2/2 reach) | — | — | — |" in text


def test_grid_validation():
    with pytest.raises(ValueError, match="no \\[\\[variant\\]\\]"):
        parse_grid({"name": "x", "tasks": ["A"]})
    with pytest.raises(ValueError, match="unique"):
        parse_grid({"tasks": ["A"], "variant": [{"label": "a", "preset": "sac"}, {"label": "a", "preset": "sac"}]})
    with pytest.raises(ValueError, match="no tasks"):
        parse_grid({"variant": [{"label": "a", "preset": "sac"}]})
    g = parse_grid({"seeds": [3, 4], "tasks": ["A", "B"], "variant": [{"label": "a", "preset": "sac",
                                                                         "args": ["--set", "run.x={seed}"]}]})
    assert [r.key for r in g.runs()] == ["a/A/seed_3", "a/B/seed_3", "a/A/seed_4", "a/B/seed_4"]
    assert g.runs()[0].args == ("--set", "run.x=3")
    g = parse_grid({"tasks": ["A"], "args": ["--init-from", "runs/pre/{task}/seed_{seed}"],
                    "task_args": {"A": ["--no-progress"]},
                    "variant": [{"label": "a", "preset": "sac", "args": ["--utd", "2"]}]})
    assert g.runs()[0].args == ("--init-from", "runs/pre/A/seed_0", "--utd", "2", "--no-progress")  # grid, variant,
    # task


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_built_in_grids_expand_to_valid_train_commands(tmp_path):
    """Every run of every shipped grid parses into a valid experiment config (catches typos in grid files)."""
    from relive.cli import build_parser
    from relive.experiments.grid import GRID_DIR, load_grid
    from relive.train.cli import config_from_args

    names = sorted(p.stem for p in GRID_DIR.glob("*.toml"))
    assert {"arb", "arb-pretrain", "reaper", "rlpd"} <= set(names)
    for name in names:
        g = load_grid(name)
        for spec in g.runs():
            args = build_parser().parse_args(["train", spec.preset, "--env", spec.task, "--seed", str(spec.seed),
                                              "--run-dir", str(tmp_path / spec.key), *spec.args])
            cfg = config_from_args(args)
            assert cfg.run.seed == spec.seed
            assert cfg.env.id in ("CartPole-v1", "Acrobot-v1", "LunarLander-v3", "Hopper-v5", "Pendulum-v1",
                                  "HalfCheetah-v5", "PointMaze_UMaze-v3", "PixelPendulum-v0", "Reacher-v5",
                                  "MetaWorld/pick-place-v3", "MetaWorld/push-v3", "FetchReach-v4", "FetchPush-v4",
                                  "MinAtar/Asterix-v1", "MinAtar/Breakout-v1", "MinAtar/Freeway-v1",
                                  "MinAtar/Seaquest-v1", "MinAtar/SpaceInvaders-v1", "ALE/Amidar-v5",
                                  "ALE/Frostbite-v5", "ALE/Qbert-v5"), cfg.env.id


def test_curves_of_runs_stopped_at_their_threshold_hold_their_last_value():
    from relive.experiments.report import align_curves, steps_to_threshold

    full = (np.array([0, 500, 1000, 1500]), np.array([10.0, 100.0, 200.0, 480.0]))
    stopped = (np.array([0, 500, 1000]), np.array([10.0, 300.0, 476.0]))
    steps, ys = align_curves([full, stopped])
    np.testing.assert_array_equal(steps, full[0])
    np.testing.assert_array_equal(ys, [[10, 100, 200, 480], [10, 300, 476, 476]])
    assert steps_to_threshold(*stopped, 475) == 1000 and steps_to_threshold(*full, 475) == 1500
    assert np.isnan(steps_to_threshold(*full, 500))


def test_task_filter_keeps_only_the_named_tasks():
    g = parse_grid({"seeds": 2, "tasks": ["A", "B"], "variant": [{"label": "a", "preset": "sac"},
                                                               {"label": "b", "preset": "sac", "tasks": ["B"]}]})
    from dataclasses import replace

    assert [r.key for r in replace(g, only_tasks=("A",)).runs()] == ["a/A/seed_0", "a/A/seed_1"]
    assert len(replace(g, only_tasks=("B",)).runs()) == 4


def test_a_variant_may_run_fewer_seeds_than_the_grid():
    g = parse_grid({"seeds": 3, "tasks": ["A"], "variant": [{"label": "a", "preset": "sac"},
                                                          {"label": "b", "preset": "sac", "seeds": 2}]})
    assert [r.key for r in g.runs()] == ["a/A/seed_0", "b/A/seed_0", "a/A/seed_1", "b/A/seed_1", "a/A/seed_2"]
    with pytest.raises(ValueError, match="outside the grid"):
        parse_grid({"seeds": 2, "tasks": ["A"], "variant": [{"label": "b", "preset": "sac", "seeds": [5]}]})


def _fake_run(root, key, steps, returns):
    d = root / key
    d.mkdir(parents=True)
    d.joinpath("eval.csv").write_text("env_step,eval/return_mean\n" + "".join(
        f"{s},{r}\n" for s, r in zip(steps, returns, strict=True)))
    d.joinpath("summary.json").write_text(json.dumps({"final_return": returns[-1]}))


def test_report_from_hand_made_run_directories(tmp_path):
    """Two tasks on raw-return scales: per-task IQMs (none across tasks), steps to threshold with the fraction
    that reach it and the change vs the baseline, and stopped runs' curves held at their last value."""
    g = parse_grid({"name": "hand", "seeds": 3, "tasks": ["A", "B"],
                    "variant": [{"label": "per", "preset": "ddqn"}, {"label": "reaper", "preset": "ddqn"}],
                    "report": {"baseline": "per", "thresholds": {"A": 100, "B": -50}, "auc": True}})
    steps = [0, 1000, 2000, 3000]
    runs = {("per", "A"): [[0, 50, 100, 120], [0, 20, 60, 100], [0, 10, 20, 30]],
            ("reaper", "A"): [[0, 100], [0, 50, 100], [0, 100]],
            ("per", "B"): [[-500, -100, -60, -40]] * 3, ("reaper", "B"): [[-500, -40]] * 3}
    for (label, task), series in runs.items():
        for seed, r in enumerate(series):
            _fake_run(tmp_path / "hand", f"{label}/{task}/seed_{seed}", steps[:len(r)], r)
    text = make_report(g, tmp_path, tmp_path / "out", reps=100).read_text()
    assert "IQM over runs per task" in text and "Aggregate final score" not in text
    # per on A: reaches 100 at 2000 and 3000 (2 of 3 runs): mean 2500, SD 707; reaper: 1000, 2000, 1000
    assert "| A (100) | 2500 ± 707 (2/3 reach) | 1333 ± 577 (3/3 reach) | reaper: -47% (p=" in text
    assert "| B (-50) | 3000 ± 0 (3/3 reach) | 1000 ± 0 (3/3 reach) | reaper: -67% (p=" in text
    # paired by seed on A: seeds 0 and 1 both reach (per 2000, 3000; reaper 1000, 2000); seed 2 only reaper
    assert "| A | reaper | 2 | -40% [" in text and "| 0 | 1 |" in text  # (1000 + 2000) / (2000 + 3000) - 1
    assert "| B | reaper | 3 | -67% [-67%, -67%] |" in text
    assert (tmp_path / "out" / "hand_curves.png").stat().st_size > 1000
    # area under the curve: per on A: mean of [50, 100, 120], [20, 60, 100], [10, 20, 30] = 90, 60, 20
    assert (f"| A | {np.mean([90, 60, 20]):.1f} ± {np.std([90, 60, 20]):.1f} (n=3) | "
            f"{np.mean([100, 75, 100]):.1f} ± {np.std([100, 75, 100]):.1f} (n=3) |") in text
    # (reaper's runs on A stopped at the threshold hold it on the cell's steps: [0, 100, 100] -> 100)


def test_paired_change_by_seed_on_a_hand_case():
    from relive.experiments.report import paired_change

    nan = float("nan")
    base = {0: 1000.0, 1: 2000.0, 2: 3000.0, 3: nan, 4: 4000.0}
    other = {0: 500.0, 1: 1000.0, 2: 1500.0, 3: 800.0, 4: nan}
    p = paired_change(base, other, reps=500)
    assert p["pairs"] == 3 and p["only_base"] == 1 and p["only_other"] == 1
    assert p["change"] == pytest.approx(-0.5) and p["lo"] == pytest.approx(-0.5) and p["hi"] == pytest.approx(-0.5)
    assert float(p["p"]) == pytest.approx(0.25)  # n = 3, all differences negative: exact two-sided p = 2 / 8
    same = paired_change({0: 500.0, 1: 500.0}, {0: 500.0, 1: 500.0})
    assert same["change"] == 0 and same["p"] == "—"  # every pair tied: no test


HOLD = ("import sys, time; from relive.files import DirectoryLock; lock = DirectoryLock(sys.argv[1], sys.argv[2]); "
        "print('held', flush=True); time.sleep(120)")


def _hold_in_another_process(directory, name):
    """A process that holds ``directory``'s DirectoryLock ``name`` until killed."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), name], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"held\n"
    return proc


def test_a_run_held_by_a_live_runner_is_left_to_it_and_a_stale_lock_is_taken_over(tmp_path):
    """The runner's claim and the training's run lock are flocks (relive.files.DirectoryLock): a run claimed by a
    live runner, or run by a live training whose runner was killed alone, is busy; once their holders are killed
    (SIGKILL, nothing cleaned up) the run is taken over."""
    from relive.experiments.runner import LOCK, RUN_LOCK, execute, run_dir_of, status_line

    g = parse_grid({"name": "locks", "tasks": ["Pendulum-v1"],
                    "variant": [{"label": "bad", "preset": "sac", "args": ["--set", "agent.num_qs=0", *TINY]}]})
    spec = g.runs()[0]
    d = run_dir_of(tmp_path, spec)
    d.mkdir(parents=True)
    holders = [_hold_in_another_process(d, LOCK), _hold_in_another_process(d, RUN_LOCK)]
    try:
        assert execute(spec, tmp_path).status == "busy" and not (d / "crash.json").exists()  # a runner has it
        holders[0].kill()  # the runner killed alone: its training (holding the run lock) goes on
        holders[0].wait()
        assert execute(spec, tmp_path).status == "busy" and not (d / "crash.json").exists()
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert (d / LOCK).exists() and (d / RUN_LOCK).exists()  # left behind by the killed holders: they mean nothing
    out = execute(spec, tmp_path)
    assert out.status == "crashed" and (d / "crash.json").is_file()
    assert status_line(out) == f"[CRASHED] bad/Pendulum-v1/seed_0 ({out.seconds:.0f} s) -> see {d / 'crash.json'}"
    # finished by another runner while this one waited: reported as such, not as a crash
    (d / "summary.json").write_text("{}")
    assert status_line(execute(spec, tmp_path)) == "[done by another runner] bad/Pendulum-v1/seed_0 (0 s)"


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_training_started_by_hand_that_takes_the_run_first_leaves_it_busy_not_crashed(tmp_path, monkeypatch):
    """The runner's training refuses a run another process holds (exit 2, "in use"); the runner then finds the run
    held and reports it busy, without a crash.json. (Staged: the runner's own check that no training holds the run
    is skipped, as if the other process took it right after that check.)"""
    from relive.experiments import runner

    g = parse_grid({"name": "race", "tasks": ["Pendulum-v1"], "variant": [{"label": "a", "preset": "sac",
                                                                           "args": list(TINY)}]})
    spec = g.runs()[0]
    d = runner.run_dir_of(tmp_path, spec)
    d.mkdir(parents=True)
    monkeypatch.setattr(runner, "_take_lock", lambda run_dir: runner.DirectoryLock(run_dir, runner.LOCK))
    holder = _hold_in_another_process(d, runner.RUN_LOCK)
    try:
        out = runner.execute(spec, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert out.status == "busy" and not (d / "crash.json").exists()
    assert f"is in use by process {holder.pid}" in (d / runner.LOG).read_text()
    assert not (d / "config.json").exists()  # the refused training wrote nothing


def test_the_runner_and_the_trainer_agree_on_the_run_lock_and_the_files_a_new_run_may_find():
    from relive.experiments import runner
    from relive.train.trainer import NEW_RUN_MAY_HOLD, RUN_LOCK

    assert runner.RUN_LOCK == RUN_LOCK
    assert {runner.LOCK, runner.LOG, runner.CRASHED, runner.RUN_LOCK} <= NEW_RUN_MAY_HOLD


def test_normalized_scores_get_an_average_row_and_one_iqm_across_tasks(tmp_path):
    g = parse_grid({"name": "norm", "seeds": 2, "tasks": ["A", "B"], "variant": [{"label": "x", "preset": "sac"}]})
    scores = {"A": [[10, 30], [20, 50]], "B": [[0, 60], [10, 80]]}
    for task, series in scores.items():
        for seed, r in enumerate(series):
            d = tmp_path / "norm" / f"x/{task}/seed_{seed}"
            d.mkdir(parents=True)
            d.joinpath("eval.csv").write_text(f"env_step,eval/normalized_score\n0,{r[0]}\n100,{r[1]}\n")
            d.joinpath("summary.json").write_text("{}")
    text = make_report(g, tmp_path, tmp_path / "out", reps=100).read_text()
    # first: mean of task means (15, 5) = 10; final: mean of (40, 70) = 55
    assert "| **average** | 10.0 → 55.0 |" in text and "Aggregate final score" in text


def test_compare_table_and_online_share_on_hand_made_runs(tmp_path):
    """[report] compare = focal: differences of the means and Mann-Whitney p per task; the online share at the
    last evaluation as mean [min, max]."""
    from scipy.stats import mannwhitneyu

    g = parse_grid({"name": "cmp", "seeds": 3, "tasks": ["A"], "report": {"compare": "arb"},
                    "variant": [{"label": "uni", "preset": "sac"}, {"label": "arb", "preset": "sac"}]})
    curves = {"uni": [[0, 2, 4], [0, 3, 5], [0, 1, 6]], "arb": [[0, 4, 7], [0, 5, 8], [0, 6, 9]]}
    shares = {"uni": [0.04, 0.04, 0.04], "arb": [0.05, 0.06, 0.04]}
    for label, series in curves.items():
        for seed, ys in enumerate(series):
            d = tmp_path / "cmp" / f"{label}/A/seed_{seed}"
            d.mkdir(parents=True)
            rows_ = "".join(f"{100 * i},{y},{shares[label][seed] * i / 2}\n" for i, y in enumerate(ys))
            d.joinpath("eval.csv").write_text("env_step,eval/normalized_score,replay/online_fraction\n" + rows_)
            d.joinpath("summary.json").write_text("{}")
    text = make_report(g, tmp_path, tmp_path / "out", reps=100).read_text()
    # final: arb (7, 8, 9) - uni (5, 6, 4) = 8 - 5 = +3; online means: arb (5.5, 6.5, 7.5) - uni (3, 4, 3.5) = +3
    p_final = mannwhitneyu([7, 8, 9], [5, 6, 4]).pvalue
    p_auc = mannwhitneyu([5.5, 6.5, 7.5], [3, 4, 3.5]).pvalue
    assert f"| A | uni | +3.00 (p={p_final:.2f}) | +3.00 (p={p_auc:.2f}) |" in text
    assert "| A | 0.040 [0.040, 0.040] | 0.050 [0.040, 0.060] |" in text


def test_a_report_figure_can_plot_a_key_logged_in_metrics_jsonl(tmp_path):
    """ReF-ER's Figure 2 plots the KL of replayed behaviours, a training metric (metrics.jsonl), not eval.csv."""
    from relive.experiments.report import collect

    grid = parse_grid({"name": "g", "tasks": ["A"], "seeds": 2, "variant": [{"label": "a", "preset": "sac"}],
                       "report": {"figure": [{"name": "kl", "column": "train/kl_behaviour", "log_y": True}]}})
    for seed, kl in ((0, [0.5, 0.25]), (1, [1.0, 2.0])):
        d = tmp_path / "g" / f"a/A/seed_{seed}"
        d.mkdir(parents=True)
        d.joinpath("eval.csv").write_text("env_step,eval/return_mean\n0,1\n100,2\n")
        d.joinpath("summary.json").write_text("{}")
        lines = [{"env_step": 0, "phase": "offline", "train/kl_behaviour": 9.0},
                 {"env_step": 50, "phase": "online", "train/kl_behaviour": kl[0]},
                 {"env_step": 100, "phase": "online", "train/kl_behaviour": kl[1]}]
        d.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"partial")
    data, crashed, missing = collect(grid, tmp_path)
    assert not crashed and not missing and len(data) == 2
    steps, values = data[1].series("train/kl_behaviour")
    np.testing.assert_array_equal(steps, [50, 100])  # online lines only; the partial last line is skipped
    np.testing.assert_array_equal(values, [1.0, 2.0])
    assert data[0].series(None)[1].tolist() == [1.0, 2.0] and data[0].series("nope") is None
    out = make_report(grid, tmp_path, tmp_path / "out")
    assert (tmp_path / "out" / "g_kl.png").is_file() and "g_kl.png" in out.read_text()


def test_a_report_reads_odd_run_files_without_a_traceback(tmp_path):
    """A metrics.jsonl line that is JSON but not an object (was an AttributeError) is not plotted; a summary.json
    that is not JSON is named (was a bare JSONDecodeError)."""
    from relive.experiments.report import collect

    grid = parse_grid({"name": "g", "tasks": ["A"], "variant": [{"label": "a", "preset": "sac"}],
                       "report": {"figure": [{"name": "kl", "column": "train/kl"}]}})
    d = tmp_path / "g" / "a/A/seed_0"
    d.mkdir(parents=True)
    d.joinpath("eval.csv").write_text("env_step,eval/return_mean\n0,1\n")
    d.joinpath("summary.json").write_text("{}")
    d.joinpath("metrics.jsonl").write_text('5\n["x"]\n{"env_step": 7, "phase": "online", "train/kl": 0.5}\n')
    data, _, _ = collect(grid, tmp_path)
    assert data[0].series("train/kl")[1].tolist() == [0.5]
    d.joinpath("summary.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"summary.json: not valid JSON"):
        collect(grid, tmp_path)


def test_a_report_is_replaced_only_with_overwrite_and_keeps_notes_below_its_marker(tmp_path, capsys):
    """Tools do not rewrite tracked docs unless asked: `relive bench report` defaults to reports/ (gitignored),
    refuses an existing GRID.md without --overwrite (`bench run --report` before running anything), and keeps
    hand-written notes below the marker line."""
    from pathlib import Path

    from relive.cli import build_parser, main
    from relive.experiments.report import NOTES_MARKER

    repo = Path(__file__).resolve().parents[2]
    for argv in (["bench", "report", "reaper"], ["bench", "run", "reaper", "--report"]):
        out = build_parser().parse_args(argv).out
        assert Path(out).parts[0] != "docs" and f"/{out}/" in (repo / ".gitignore").read_text()
    g = parse_grid({"name": "hand", "seeds": 1, "tasks": ["A"], "variant": [{"label": "per", "preset": "ddqn"}]})
    _fake_run(tmp_path / "hand", "per/A/seed_0", [0, 1000], [0, 50])
    md = make_report(g, tmp_path, tmp_path / "out", reps=50)
    assert md.read_text().rstrip().endswith(NOTES_MARKER)
    md.write_text(md.read_text() + "Notes: by hand.\n")
    with pytest.raises(ValueError, match="--overwrite"):
        make_report(g, tmp_path, tmp_path / "out", reps=50)
    assert make_report(g, tmp_path, tmp_path / "out", reps=50, overwrite=True).read_text().split(
        NOTES_MARKER)[1].strip() == "Notes: by hand."
    toml = tmp_path / "hand.toml"
    toml.write_text('name = "hand"\nseeds = 1\ntasks = ["A"]\n[[variant]]\nlabel = "per"\npreset = "ddqn"\n')
    # refused before any run starts: the grid's run is not even attempted
    assert main(["bench", "run", str(toml), "--root", str(tmp_path / "fresh"), "--report",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--overwrite" in capsys.readouterr().err and not (tmp_path / "fresh").exists()


def test_report_score_option_picks_the_column_the_tables_use(tmp_path):
    """[report] score = "eval/success_rate": the tables read that column, not the return (PLD's grids)."""
    g = parse_grid({"name": "succ", "seeds": 2, "tasks": ["A"], "report": {"score": "eval/success_rate"},
                    "variant": [{"label": "x", "preset": "sac"}]})
    for seed, (ret, succ) in enumerate((([-500, -200], [0.1, 0.7]), ([-400, -300], [0.3, 0.5]))):
        d = tmp_path / "succ" / f"x/A/seed_{seed}"
        d.mkdir(parents=True)
        d.joinpath("eval.csv").write_text("env_step,eval/return_mean,eval/success_rate\n" + "".join(
            f"{100 * i},{r},{s}\n" for i, (r, s) in enumerate(zip(ret, succ, strict=True))))
        d.joinpath("summary.json").write_text("{}")
    text = make_report(g, tmp_path, tmp_path / "out", reps=100).read_text()
    assert "Score: `eval/success_rate`" in text
    assert "| A | 0.2 ± 0.1 → 0.6 ± 0.1 (n=2) |" in text  # first (0.1, 0.3) -> final (0.7, 0.5)


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_run_interrupted_before_its_first_checkpoint_is_restarted_not_refused(tmp_path):
    import shutil

    from relive.experiments.runner import execute, run_dir_of, train_command

    g = parse_grid({"name": "restart", "tasks": ["Pendulum-v1"],
                    "variant": [{"label": "sac", "preset": "sac", "args": list(TINY)}]})
    spec = g.runs()[0]
    d = run_dir_of(tmp_path, spec)
    assert "--resume" not in train_command(spec, d)  # a new run
    assert execute(spec, tmp_path).status == "finished"
    # as if killed before its first checkpoint: config.json and logs written, no checkpoint, no summary
    (d / "summary.json").unlink()
    shutil.rmtree(d / "checkpoint", ignore_errors=True)
    assert train_command(spec, d)[-2:] == ["--resume", str(d)]
    out = execute(spec, tmp_path)
    assert out.status == "finished", (d / "crash.json").read_text() if (d / "crash.json").exists() else ""
    assert "has no checkpoint yet: starting it from the beginning" in (d / "stdout.log").read_text()


def test_a_report_without_rliable_says_how_to_install_it(monkeypatch):
    """(The Meta-World venv has no rliable: the report stopped with a bare ModuleNotFoundError.)"""
    import sys

    from relive.experiments.report import iqm_with_ci

    monkeypatch.setitem(sys.modules, "rliable", None)
    with pytest.raises(ValueError, match=r"pip install 'relive\[experiments\]'"):
        iqm_with_ci({"a": np.ones((3, 1))})


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_runs_log_shows_its_progress(tmp_path, monkeypatch):
    """Issue 31 item 6: `relive bench run`'s per-run logs get plain progress lines (the run's output is a file)."""
    from relive.experiments.runner import LOG

    monkeypatch.setenv("RELIVE_PROGRESS_SECONDS", "0")
    g = parse_grid({"name": "prog", "seeds": 1, "tasks": ["Pendulum-v1"],
                    "variant": [{"label": "sac", "preset": "sac", "args": list(TINY)}]})
    assert [o.status for o in run_grid(g, tmp_path, workers=1, progress=False)] == ["finished"]
    log = (tmp_path / "prog" / "sac" / "Pendulum-v1" / "seed_0" / LOG).read_text()
    assert "online: " in log and "env steps" in log and "ETA" in log
