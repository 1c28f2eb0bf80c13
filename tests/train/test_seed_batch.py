"""Seeds batched in one process (issue 15, item 4): `train_seeds` runs S seeds of one DDQN configuration around one
BatchedDDQN; each seed's run directory is a single run's, and its updates are the single run's."""

import json

import numpy as np
import pytest

from relive.replay.checkpoint import load_tree
from relive.train.seed_batch import train_seeds
from relive.train.trainer import train
from tests.train.test_trainer import TINY, _logs_without_times, cfg_for

ARGS = ["ddqn", "--env", "CartPole-v1", "--online-steps", "300", "--warmup", "100", "--eval-every", "150",
        "--log-every", "100", "--replay", "per", "--set", "agent.target_update_period=20", *TINY]


def _close_agents(dir_a, dir_b, atol=1e-4):
    a, b = load_tree(dir_a / "agent_final"), load_tree(dir_b / "agent_final")
    for part in ("q", "target_q"):
        for k in a[part]:
            np.testing.assert_allclose(b[part][k], a[part][k], atol=atol, err_msg=f"{part}.{k}")
    assert a["counters"] == b["counters"]


def test_batched_seeds_write_the_single_runs_directories_with_the_same_updates(tmp_path):
    """Two seeds batched vs each run alone: the same files, the same evaluations and log lines (float tolerance
    on the logged losses), and final networks equal to float tolerance after 200 updates each."""
    singles = [train(cfg_for([*ARGS, "--seed", str(s)], tmp_path / f"single{s}")) for s in (3, 4)]
    out = train_seeds([cfg_for([*ARGS, "--seed", str(s)], tmp_path / f"batched{s}") for s in (3, 4)])
    assert not [r for r in out if isinstance(r, BaseException)], out
    for s, single in zip((3, 4), singles, strict=True):
        a, b = tmp_path / f"single{s}", tmp_path / f"batched{s}"
        for name in ("config.json", "eval.csv", "metrics.jsonl", "summary.json", "agent_final/MANIFEST.json"):
            assert (b / name).is_file(), name
        assert json.loads((b / "summary.json").read_text())["num_grad_steps"] == single.num_grad_steps == 200
        (ma, ea), (mb, eb) = _logs_without_times(a), _logs_without_times(b)
        assert eb == ea  # evaluations: the same greedy returns
        for la, lb in zip(ma, mb, strict=True):
            assert la.keys() == lb.keys()
            for k in la:
                if isinstance(la[k], float):
                    assert lb[k] == pytest.approx(la[k], rel=1e-3, abs=1e-4), k
                else:
                    assert lb[k] == la[k], k
        _close_agents(a, b)


def test_a_seed_stopping_early_leaves_the_batch_and_the_other_goes_on(tmp_path):
    """Seed 3 stops at its first evaluation (threshold 0: any return); seed 4 runs its full budget, as alone."""
    stop = ["--stop-at-return", "0", "--set", "run.eval_at_start=false"]
    out = train_seeds([cfg_for([*ARGS, "--seed", "3", *stop], tmp_path / "b3"),
                       cfg_for([*ARGS, "--seed", "4"], tmp_path / "b4")])
    assert out[0].num_online_env_steps == 150 and out[1].num_online_env_steps == 300
    train(cfg_for([*ARGS, "--seed", "4"], tmp_path / "s4"))
    _close_agents(tmp_path / "s4", tmp_path / "b4")


def test_unsupported_or_mixed_configurations_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"support the agents \['ddqn'\]; got \['sac'\]"):
        train_seeds([cfg_for(["sac", "--seed", "0"], tmp_path / "a"), cfg_for(["sac", "--seed", "1"], tmp_path / "b")])
    with pytest.raises(ValueError, match="must share one configuration"):
        train_seeds([cfg_for([*ARGS, "--seed", "0"], tmp_path / "a"),
                     cfg_for([*ARGS, "--seed", "1", "--batch-size", "16"], tmp_path / "b")])
    with pytest.raises(ValueError, match="must differ"):
        train_seeds([cfg_for([*ARGS, "--seed", "0"], tmp_path / "a"), cfg_for([*ARGS, "--seed", "0"], tmp_path / "b")])


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_bench_run_with_seed_batch_trains_each_cell_in_one_process_and_reports(tmp_path):
    """A 2-variant x 3-seed DDQN grid with --seed-batch 2: cells of 2 + 1 seeds, every run finished with its own
    directory (the second seed's log points to the first's), a started run resumed alone; a SAC grid refused."""
    from relive.experiments.grid import parse_grid
    from relive.experiments.runner import _seed_batches, run_dir_of, run_grid

    args = ["--env", "CartPole-v1", "--online-steps", "200", "--warmup", "100", "--eval-every", "200", *TINY]
    g = parse_grid({"name": "sb", "seeds": 3, "tasks": ["CartPole-v1"],
                    "variant": [{"label": "per", "preset": "ddqn", "args": ["--replay", "per", *args]},
                                {"label": "uni", "preset": "ddqn", "args": args}]})
    assert sorted(len(j) for j in _seed_batches(g.runs(), tmp_path, 2)) == [1, 1, 2, 2]
    started = run_dir_of(tmp_path, next(s for s in g.runs() if s.seed == 0 and s.label == "uni"))
    started.mkdir(parents=True)
    (started / "config.json").write_text("{}")  # a started run goes alone (resumed from its checkpoint)
    jobs = _seed_batches(g.runs(), tmp_path, 2)
    assert sorted((len(j), j[0].label, j[0].seed) for j in jobs) == [(1, "per", 2), (1, "uni", 0), (2, "per", 0),
                                                                     (2, "uni", 1)]
    (started / "config.json").unlink()
    outcomes = run_grid(g, tmp_path, workers=2, progress=False, seed_batch=2)
    assert sorted(o.status for o in outcomes) == ["finished"] * 6
    for spec in g.runs():
        d = run_dir_of(tmp_path, spec)
        summary = json.loads((d / "summary.json").read_text())
        assert summary["num_online_env_steps"] == 200 and json.loads((d / "config.json").read_text())["run"][
            "seed"] == spec.seed
    second = next(s for s in g.runs() if s.seed == 1 and s.label == "per")  # batched with seed 0
    assert "seeds batched in one process: output in" in (run_dir_of(tmp_path, second) / "stdout.log").read_text()
    sac = parse_grid({"name": "s", "seeds": 2, "tasks": ["Pendulum-v1"], "variant": [{"label": "x", "preset": "sac"}]})
    with pytest.raises(ValueError, match=r"support the presets \['ddqn'\]; this grid's unfinished runs use \['sac'\]"):
        run_grid(sac, tmp_path, progress=False, seed_batch=2)
