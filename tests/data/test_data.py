import warnings

import h5py
import numpy as np
import pytest

from relive.data.d4rl_io import read_d4rl_hdf5, write_d4rl_hdf5
from relive.data.loaders import fill_offline, load_rows
from relive.data.minari_io import list_local, read_minari, write_minari
from relive.data.rows import split_episodes
from relive.data.scores import d4rl_reference, normalized_score
from relive.replay import ReplayBuffer
from relive.train.collector import collect_dataset


@pytest.fixture(scope="module")
def pendulum_rows():
    return collect_dataset("Pendulum-v1", 450, seed=0)  # 2 full episodes + a cut one (truncated at the end)


def test_minari_round_trip(tmp_path, pendulum_rows):
    import minari

    path = write_minari("test/pendulum/tiny-v0", pendulum_rows, "Pendulum-v1", root=tmp_path, ref_min_score=-1500.0,
                        ref_max_score=-150.0, extra_metadata={"note": "made by a test"})
    assert "test/pendulum/tiny-v0" in list_local(tmp_path)
    # minari itself reads it
    import os

    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path)
    try:
        ds = minari.load_dataset("test/pendulum/tiny-v0")
        assert ds.total_steps == 450 and ds.total_episodes == 3
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    for source in ("test/pendulum/tiny-v0", path):  # by id and by directory
        rows, meta = read_minari(source, root=tmp_path)
        for k in ("obs", "action", "next_obs", "terminated", "truncated"):
            np.testing.assert_array_equal(rows[k], pendulum_rows[k], err_msg=k)
        np.testing.assert_allclose(rows["reward"], pendulum_rows["reward"], rtol=1e-6)
        assert meta["env_id"] == "Pendulum-v1" and meta["ref_min_return"] == -1500.0
        assert meta["relive"]["note"] == "made by a test"


def test_minari_rejects_broken_episodes_and_missing_datasets(tmp_path, pendulum_rows):
    broken = {k: v.copy() for k, v in pendulum_rows.items()}
    broken["next_obs"][5] += 1.0
    with pytest.raises(ValueError, match="episode 0 breaks at step 5"):
        write_minari("test/broken-v0", broken, "Pendulum-v1", root=tmp_path)
    with pytest.raises(ValueError, match="no Minari dataset 'nope/x-v0'"):
        read_minari("nope/x-v0", root=tmp_path)


def test_d4rl_reader_with_next_observations(tmp_path, pendulum_rows):
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", pendulum_rows)
    rows, meta = read_d4rl_hdf5(path)
    for k in pendulum_rows:
        np.testing.assert_array_equal(rows[k], pendulum_rows[k], err_msg=k)
    assert meta["dropped_rows"] == 0


def test_d4rl_reader_without_next_observations_drops_rows_it_cannot_complete(tmp_path):
    # two episodes: a terminal one (rows 0-2) and one cut by a timeout (rows 3-5)
    obs = np.arange(6, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    rows = dict(obs=obs, action=np.zeros((6, 1), np.float32), reward=np.arange(6, dtype=np.float32),
                next_obs=obs, terminated=np.array([0, 0, 1, 0, 0, 0], bool),
                truncated=np.array([0, 0, 0, 0, 0, 1], bool))
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", rows, with_next_observations=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got, meta = read_d4rl_hdf5(path)
    assert meta["dropped_rows"] == 1 and any("dropped 1 rows" in str(x.message) for x in w)
    np.testing.assert_array_equal(got["reward"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(got["next_obs"][:, 0], [1, 2, 2, 4, 5])  # obs[t+1]; terminal keeps its own
    assert got["terminated"].tolist() == [False, False, True, False, False]
    assert got["truncated"].tolist() == [False, False, False, False, True]  # row 4 now ends its episode


@pytest.mark.parametrize("mutate, match", [
    (lambda f: f.__delitem__("rewards"), r"missing key\(s\) \['rewards'\]"),
    (lambda f: (f.__delitem__("rewards"), f.create_dataset("rewards", data=np.zeros(3))), "'rewards' has 3 rows"),
    (lambda f: (f.__delitem__("observations"), f.create_dataset("observations", data=np.full((450, 3), np.nan))),
     "'observations' row 0 is not finite"),
])
def test_d4rl_bad_files(tmp_path, pendulum_rows, mutate, match):
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", pendulum_rows)
    with h5py.File(path, "a") as f:
        mutate(f)
    with pytest.raises(ValueError, match=match):
        read_d4rl_hdf5(path)
    with pytest.raises(ValueError, match="does not exist"):
        read_d4rl_hdf5(tmp_path / "missing.hdf5")


def test_loader_checks_spaces_and_fills_returns_to_go(tmp_path, pendulum_rows):
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", pendulum_rows)
    with pytest.raises(ValueError, match="observations have shape \\(3,\\), Hopper-v5 expects \\(11,\\)"):
        load_rows(path, env_id="Hopper-v5")
    bad = {k: v.copy() for k, v in pendulum_rows.items()}
    bad["action"][7] = 5.0
    with pytest.raises(ValueError, match="action row 7 .* outside"):
        load_rows(write_d4rl_hdf5(tmp_path / "b.hdf5", bad), env_id="Pendulum-v1")
    rows, _ = load_rows(path, env_id="Pendulum-v1")
    buf = ReplayBuffer(1000, (3,), (1,), extra_columns={"mc_return": ()})
    fill_offline(buf, rows, gamma=0.9)
    ep = split_episodes(rows)[0]
    r = rows["reward"][ep].astype(np.float64)
    expected0 = sum(r[t] * 0.9**t for t in range(r.size))
    assert buf.storage.columns["mc_return"][0] == pytest.approx(expected0, rel=1e-4)
    assert buf.storage.episodes.live().ids.tolist() == [0, 1, 2]


def test_normalized_score_formula_and_d4rl_references():
    assert normalized_score(50.0, 0.0, 200.0) == 25.0
    assert normalized_score(-20.272305, *d4rl_reference("Hopper-v5")) == pytest.approx(0.0)
    assert normalized_score(3234.3, *d4rl_reference("Hopper-v5")) == pytest.approx(100.0)
    assert np.isnan(normalized_score(1.0, None, 2.0))
    assert d4rl_reference("Pendulum-v1") is None
    with pytest.raises(ValueError):
        normalized_score(1.0, 2.0, 2.0)


def test_trainer_reads_a_minari_dataset(tmp_path, pendulum_rows):
    from relive.cli import main

    write_minari("test/pendulum/tiny-v0", pendulum_rows, "Pendulum-v1", root=tmp_path, ref_min_score=-1500.0,
                 ref_max_score=-150.0)
    import os

    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path)
    try:
        code = main(["train", "calql", "--env", "Pendulum-v1", "--dataset", "test/pendulum/tiny-v0",
                     "--offline-steps", "20", "--online-steps", "200", "--eval-every", "200", "--eval-episodes", "1",
                     "--batch-size", "32", "--set", "agent.hidden=[16,16]", "--set", "agent.cql_n_actions=2",
                     "--run-dir", str(tmp_path / "run"), "--no-progress"])
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    assert code == 0
    header, first = (tmp_path / "run" / "eval.csv").read_text().splitlines()[:2]
    score = float(first.split(",")[header.split(",").index("eval/normalized_score")])
    assert np.isfinite(score)  # the dataset's reference returns reached the evaluation


def test_maze_shortest_path_and_scripted_collector_reach_the_goal():
    from relive.data.maze import shortest_path, waypoint_policy
    from relive.envs import make_env

    free = np.array([[0, 0, 0, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 1, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0]], bool)
    assert shortest_path(free, (1, 1), (3, 1)) == [(1, 1), (1, 2), (1, 3), (2, 3), (3, 3), (3, 2), (3, 1)]
    assert shortest_path(free, (1, 1), (0, 0)) == [(1, 1)]  # unreachable: stay
    env = make_env("PointMaze_UMaze-v3")
    assert env.observation_space.shape == (8,)  # achieved goal, desired goal, position, velocity
    scripted = collect_dataset("PointMaze_UMaze-v3", 900, seed=0,
                               policy=waypoint_policy(env, np.random.default_rng(0)))
    random = collect_dataset("PointMaze_UMaze-v3", 900, seed=0)
    assert scripted["terminated"].sum() >= 5 * max(1, random["terminated"].sum())  # it reaches the goal
    assert set(np.unique(scripted["reward"])) <= {0.0, 1.0}  # sparse reward


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_make_dataset_levels_from_one_training_run(tmp_path):
    from relive.train.generate import make_dataset

    kw = dict(steps=400, seed=0, root=tmp_path / "minari", out=tmp_path, expert_train_steps=400, progress=False)
    summaries = {level: make_dataset("pendulum-v1", level, **kw)[1]
                 for level in ("random", "medium", "medium-replay", "expert", "medium-expert")}
    runs = [p for p in (tmp_path / "policies" / "pendulum-v1").iterdir() if p.is_dir()]
    assert len(runs) == 1  # one SAC run served every level
    med = summaries["medium"]
    assert (runs[0] / "snapshots" / f"agent_{med['medium_snapshot_step']}").exists()
    assert summaries["medium-replay"]["rows"] == med["medium_snapshot_step"]
    import csv

    evals = {int(float(r["env_step"])): float(r["eval/return_mean"]) for r in csv.DictReader(
        (runs[0] / "eval.csv").open())}
    assert med["expert_eval_return"] == max(evals.values())  # the expert is the best evaluated policy
    assert 0 < med["medium_snapshot_step"] < med["expert_snapshot_step"]
    target = med["ref_min_return"] + (med["ref_max_return"] - med["ref_min_return"]) / 3
    earlier = [r for step, r in evals.items() if 0 < step < med["expert_snapshot_step"]]
    assert abs(med["medium_snapshot_eval_return"] - target) == min(abs(r - target) for r in earlier)
    assert summaries["medium-expert"]["rows"] == 800 and summaries["expert"]["rows"] == 400
    assert len({s["ref_min_return"] for s in summaries.values()}) == 1  # one R_random for every level
    assert summaries["random"]["ref_min_return"] == pytest.approx(summaries["random"]["return_mean"])
    # one R_expert (the expert level's mean return) for every level made after the training run
    for level in ("medium", "medium-replay", "medium-expert"):
        assert summaries[level]["ref_max_return"] == pytest.approx(summaries["expert"]["return_mean"]), level
    assert summaries["random"]["ref_max_return"] is None  # the random level never records R_expert itself
    # ... it reads it from the task's references.json, which the other levels wrote: whatever the order in
    # which the levels were made (here random first; in r2 the expert first), every level reads one pair
    refs = {}
    for level in ("expert", "random"):
        assert make_dataset("pendulum-v1", level, **(kw | {"root": tmp_path / "r2"}))[1]["ref_max_return"] == (
            None if level == "random" else pytest.approx(summaries["expert"]["return_mean"]))
    for root in ("minari", "r2"):
        for level in ("random", "expert"):
            meta = read_minari(f"relive/pendulum-v1/{level}-v0", root=tmp_path / root)[1]
            refs[root, level] = (meta["ref_min_return"], meta["ref_max_return"])
    assert len(set(refs.values())) == 1, refs
    assert refs["minari", "random"] == pytest.approx((summaries["random"]["return_mean"],
                                                       summaries["expert"]["return_mean"]))
    assert (tmp_path / "minari" / "relive" / "pendulum-v1" / "references.json").is_file()
    assert list_local(tmp_path / "r2") == ["relive/pendulum-v1/expert-v0", "relive/pendulum-v1/random-v0"]
    for level in summaries:
        rows, meta = read_minari(f"relive/pendulum-v1/{level}-v0", root=tmp_path / "minari")
        assert len(rows["obs"]) == summaries[level]["rows"] and meta["env_id"] == "Pendulum-v1"
    me, _ = read_minari("relive/pendulum-v1/medium-expert-v0", root=tmp_path / "minari")
    ex, _ = read_minari("relive/pendulum-v1/expert-v0", root=tmp_path / "minari")
    np.testing.assert_array_equal(me["obs"][400:], ex["obs"])  # medium rows, then the expert's
    # deterministic for a seed: the same level again (rollout rows not cached) holds the same rows
    import shutil

    shutil.rmtree(runs[0] / "rollouts")
    again, _ = make_dataset("pendulum-v1", "medium", **(kw | {"root": tmp_path / "again"}))
    a, _ = read_minari("relive/pendulum-v1/medium-v0", root=tmp_path / "minari")
    b, _ = read_minari(again, root=tmp_path / "again")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match="not made for"):
        make_dataset("pendulum-v1", "scripted", **kw)
    with pytest.raises(ValueError, match="unknown task"):
        make_dataset("pong-v0", "random", **kw)


def test_maze_references_do_not_depend_on_the_order_the_levels_were_made(tmp_path):
    """The scripted level (the maze's R_expert) writes the task's references; the random level reads them,
    whether it was made before or after (and reports none while no scripted level exists)."""
    from relive.train.data_cli import describe
    from relive.train.generate import make_dataset

    refs = {}
    for order in (("random", "scripted"), ("scripted", "random")):
        root = tmp_path / "-".join(order)
        for level in order:
            make_dataset("pointmaze-umaze-v3", level, steps=300, root=root, out=root / "out", progress=False)
            if level == "random" and order[0] == "random":
                assert describe("relive/pointmaze-umaze-v3/random-v0", root)["ref_max_return"] is None
        for level in order:
            d = describe(f"relive/pointmaze-umaze-v3/{level}-v0", root)
            refs[order, level] = (d["ref_min_return"], d["ref_max_return"], d["normalized_score"])
    assert len({v[:2] for v in refs.values()}) == 1 and None not in next(iter(refs.values())), refs
    assert refs[("random", "scripted"), "random"] == refs[("scripted", "random"), "random"]


def test_random_dataset_is_uniform_and_deterministic():
    from relive.train.generate import random_dataset

    a, b = random_dataset("Pendulum-v1", 300, seed=3), random_dataset("Pendulum-v1", 300, seed=3)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert not np.array_equal(a["action"], random_dataset("Pendulum-v1", 300, seed=4)["action"])
    assert a["action"].min() >= -2.0 and a["action"].max() <= 2.0 and a["action"].std() > 1.0  # U(-2, 2): sd 1.15
    assert a["truncated"].sum() == 2 and a["truncated"][[199, 299]].all()  # one 200-step episode + the cut one


def test_minari_dict_observations_are_flattened_in_the_envs_order(tmp_path):
    """Minari's goal-conditioned datasets (D4RL PointMaze/AntMaze) store Dict observations; relive flattens them
    as gymnasium's FlattenObservation does (keys in the space's sorted order), matching relive's envs."""
    import os

    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float64)  # noqa: E731
    space = gym.spaces.Dict({"observation": box(4), "desired_goal": box(2), "achieved_goal": box(2)})
    rng = np.random.default_rng(0)
    obs = {k: rng.normal(size=(7, n)) for k, n in (("observation", 4), ("desired_goal", 2), ("achieved_goal", 2))}
    ep = EpisodeBuffer(id=0, observations=obs, actions=rng.uniform(-1, 1, (6, 2)).astype(np.float32),
                       rewards=[0.0] * 5 + [1.0], terminations=[False] * 5 + [True], truncations=[False] * 6)
    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            minari.create_dataset_from_buffers("test/maze/dict-v0", [ep], observation_space=space,
                                               action_space=gym.spaces.Box(-1, 1, (2,), np.float32), data_format="hdf5")
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    rows, meta = read_minari("test/maze/dict-v0", root=tmp_path)
    assert meta["flattened_observation_keys"] == ["achieved_goal", "desired_goal", "observation"]
    flat = np.concatenate([obs["achieved_goal"], obs["desired_goal"], obs["observation"]], axis=1)
    np.testing.assert_allclose(rows["obs"], flat[:-1], rtol=1e-6)
    np.testing.assert_allclose(rows["next_obs"], flat[1:], rtol=1e-6)
    # gymnasium's flatten, which the FlattenObservation wrapper of relive's envs calls, gives the same order
    np.testing.assert_allclose(gym.spaces.flatten(space, {k: v[0] for k, v in obs.items()}), flat[0])
    assert rows["terminated"].tolist() == [False] * 5 + [True]
    # PointMaze's flattened observation has these 8 numbers, so such data passes relive's space check
    rows, _ = load_rows(tmp_path / "test" / "maze" / "dict-v0", env_id="PointMaze_UMaze-v3")
    assert rows["obs"].shape == (6, 8)


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.pop("reward"), r"missing column\(s\) \['reward'\]"),
    (lambda r: r.__setitem__("terminated", r["terminated"][:-1]), "column 'terminated' has 449 rows but 'obs' has 450"),
    (lambda r: r["obs"].__setitem__((9, 1), np.nan), "column 'obs' row 9 is not finite"),
    (lambda r: r["reward"].__setitem__(3, np.inf), "column 'reward' row 3 is not finite"),
])
def test_minari_writer_rejects_bad_rows(tmp_path, pendulum_rows, mutate, match):
    rows = {k: v.copy() for k, v in pendulum_rows.items()}
    mutate(rows)
    with pytest.raises(ValueError, match=match):
        write_minari("test/bad-v0", rows, "Pendulum-v1", root=tmp_path)
    assert list_local(tmp_path) == []  # nothing written


@pytest.mark.parametrize("key, value, match", [
    ("terminals", 0.5, "'terminals' row 4 is 0.5, expected a flag"),  # not silently True
    ("timeouts", 2, "'timeouts' row 4 is 2.0, expected a flag"),
    ("rewards", np.inf, "'rewards' row 4 is not finite"),
    ("next_observations", -np.inf, "'next_observations' row 4 is not finite"),
])
def test_d4rl_bad_values(tmp_path, pendulum_rows, key, value, match):
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", pendulum_rows)
    with h5py.File(path, "a") as f:
        data = f[key][()].astype(np.float64)
        data[4] = value
        del f[key]
        f[key] = data
    with pytest.raises(ValueError, match=match):
        read_d4rl_hdf5(path)


def test_loader_rejects_mismatched_spaces_and_sources(tmp_path, pendulum_rows):
    from relive.data.npz_io import save_dataset

    wide = {k: v.copy() for k, v in pendulum_rows.items()}
    wide["action"] = np.repeat(wide["action"], 2, axis=1)
    with pytest.raises(ValueError, match=r"actions have shape \(2,\), Pendulum-v1 expects \(1,\)"):
        load_rows(write_d4rl_hdf5(tmp_path / "w.hdf5", wide), env_id="Pendulum-v1")
    with pytest.raises(ValueError, match="observations have shape \\(3,\\), CartPole-v1 expects \\(4,\\)"):
        load_rows(write_d4rl_hdf5(tmp_path / "p.hdf5", pendulum_rows), env_id="CartPole-v1")
    write_minari("test/pendulum/tiny-v0", pendulum_rows, "Pendulum-v1", root=tmp_path)
    with pytest.raises(ValueError, match="recorded on Pendulum-v1, not MountainCarContinuous-v0"):
        load_rows("test/pendulum/tiny-v0", env_id="MountainCarContinuous-v0", root=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_rows(tmp_path / "missing.npz")
    partial = {k: v for k, v in pendulum_rows.items() if k != "next_obs"}
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['next_obs'\]"):
        load_rows(save_dataset(tmp_path / "partial.npz", partial))


def test_data_cli_list_info_and_report_keep_hand_written_notes(tmp_path, pendulum_rows, capsys):
    import json

    from relive.cli import main
    from relive.train.data_cli import NOTES_MARKER

    root = tmp_path / "minari"
    write_minari("test/pendulum/tiny-v0", pendulum_rows, "Pendulum-v1", root=root, ref_min_score=-1500.0,
                 ref_max_score=-150.0)
    assert main(["data", "list", "--root", str(root)]) == 0
    assert capsys.readouterr().out.split() == ["test/pendulum/tiny-v0"]
    assert main(["data", "info", "test/pendulum/tiny-v0", "--root", str(root)]) == 0
    info = json.loads(capsys.readouterr().out)
    returns = [pendulum_rows["reward"][sl].sum() for sl in split_episodes(pendulum_rows)]
    assert info["rows"] == 450 and info["episodes"] == 3 and info["megabytes"] > 0
    assert info["normalized_score"] == pytest.approx(100 * (np.mean(returns) + 1500) / 1350, rel=1e-5)
    out = tmp_path / "datasets.md"
    assert main(["data", "report", "--root", str(root), "--out", str(out)]) == 0
    row = next(line for line in out.read_text().splitlines() if "test/pendulum/tiny-v0" in line)
    assert "| Pendulum-v1 | 450 | 3 |" in row and f"{info['normalized_score']:.1f}" in row
    out.write_text(out.read_text() + "\nNotes: made by hand.\n")
    before = out.read_text()
    assert main(["data", "report", "--root", str(root), "--out", str(out)]) == 2  # refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err and out.read_text() == before
    assert main(["data", "report", "--root", str(root), "--out", str(out), "--overwrite"]) == 0
    assert out.read_text().split(NOTES_MARKER)[1].strip() == "Notes: made by hand."
    assert main(["data", "report", "--root", str(root), "--out", str(out), "--overwrite"]) == 0  # kept again
    assert out.read_text().split(NOTES_MARKER)[1].strip() == "Notes: made by hand."


def test_data_report_defaults_outside_docs_and_the_committed_notes_survive(tmp_path, monkeypatch):
    """Tools do not rewrite tracked docs unless asked: the default --out is reports/ (gitignored), and a
    regeneration of docs/datasets.md keeps its notes (the committed file carries the marker)."""
    from pathlib import Path

    from relive.cli import build_parser, main
    from relive.train.data_cli import NOTES_MARKER

    repo = Path(__file__).resolve().parents[2]
    out = build_parser().parse_args(["data", "report"]).out
    assert not Path(out).parts[0] == "docs" and Path(out).parts[0] + "/" in (repo / ".gitignore").read_text()
    doc = (repo / "docs" / "datasets.md").read_text()
    notes = doc.split(NOTES_MARKER)[1].strip()
    assert notes.startswith("Notes")
    copy = tmp_path / "datasets.md"
    copy.write_text(doc)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "report", "--root", str(tmp_path / "none"), "--out", str(copy), "--overwrite"]) == 0
    assert copy.read_text().split(NOTES_MARKER)[1].strip() == notes
    assert main(["data", "report", "--root", str(tmp_path / "none")]) == 0
    assert (tmp_path / "reports" / "datasets.md").is_file()


def test_minari_dict_observations_round_trip_as_columns(tmp_path, pendulum_rows):
    """Dict observations (a uint8 image + a float32 state) written to Minari as a Dict space and read back with
    ``flatten=False`` keep each key's shape, dtype and values exactly, and fill a dict-observation buffer whose
    next_obs (rebuilt from the next row) equals the dataset's."""
    n = len(pendulum_rows["reward"])
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(n + 3, 2, 4, 4), dtype=np.uint8)  # rows + one final frame per episode
    image, next_image, f = np.empty((n, 2, 4, 4), np.uint8), np.empty((n, 2, 4, 4), np.uint8), 0
    for sl in split_episodes(pendulum_rows):
        m = sl.stop - sl.start
        image[sl], next_image[sl] = frames[f : f + m], frames[f + 1 : f + m + 1]
        f += m + 1
    rows = dict(pendulum_rows)
    rows["obs"] = {"image": image, "state": pendulum_rows["obs"].astype(np.float32)}
    rows["next_obs"] = {"image": next_image, "state": pendulum_rows["next_obs"].astype(np.float32)}
    write_minari("test/pendulum/pixels-v0", rows, "Pendulum-v1", root=tmp_path)
    back, meta = read_minari("test/pendulum/pixels-v0", root=tmp_path, flatten=False)
    assert meta["observation_keys"] == ["image", "state"]
    for col in ("obs", "next_obs"):
        assert back[col]["image"].dtype == np.uint8 and back[col]["state"].dtype == np.float32
        for k in ("image", "state"):
            np.testing.assert_array_equal(back[col][k], rows[col][k])
    flat, meta = read_minari("test/pendulum/pixels-v0", root=tmp_path)  # the default still flattens
    assert flat["obs"].shape == (n, 2 * 4 * 4 + 3) and meta["flattened_observation_keys"] == ["image", "state"]
    buf = ReplayBuffer(n + 10, {"image": ((2, 4, 4), np.uint8), "state": (3,)}, (1,))
    assert buf.storage.dedup_next_obs
    fill_offline(buf, back)
    b = buf.gather(np.arange(n))
    for col in ("obs", "next_obs"):
        for k in ("image", "state"):
            np.testing.assert_array_equal(getattr(b, col)[k], rows[col][k])
    assert buf.storage._nx.num_used == len(split_episodes(pendulum_rows))  # one explicit copy per episode end


def test_scripted_levels_are_refused_where_no_controller_exists_and_noise_only_on_noisy_scripted(tmp_path):
    """noisy-scripted is made for Meta-World tasks only; --noise belongs to that level and must be a finite
    number >= 0; both refused before any collection (nothing is written)."""
    import importlib.util

    from relive.train.generate import make_dataset

    kw = {"steps": 100, "root": tmp_path / "m", "out": tmp_path / "o", "progress": False}
    for task in ("pendulum-v1", "pointmaze-umaze-v3"):
        with pytest.raises(ValueError, match="not made for"):
            make_dataset(task, "noisy-scripted", **kw)
    with pytest.raises(ValueError, match="noise"):
        make_dataset("pendulum-v1", "random", noise=0.5, **kw)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise"):
            make_dataset("metaworld-reach-v3", "noisy-scripted", noise=bad, **kw)
    if importlib.util.find_spec("metaworld") is None:  # the main venv: a clear pointer to the extra
        with pytest.raises(ValueError, match="metaworld"):
            make_dataset("metaworld-reach-v3", "scripted", **kw)
    assert not (tmp_path / "m").exists()


def test_data_info_reads_every_format_the_dataset_option_accepts(tmp_path, pendulum_rows, capsys):
    """Issue 31 item 6: `relive data info` on a .npz and a D4RL-style .hdf5 (it read Minari ids only)."""
    import json

    from relive.cli import main
    from relive.data.npz_io import save_dataset
    from relive.data.rows import split_episodes

    expect = np.mean([pendulum_rows["reward"][sl].sum() for sl in split_episodes(pendulum_rows)])
    for path in (save_dataset(tmp_path / "d.npz", pendulum_rows, env_id="Pendulum-v1"),
                 write_d4rl_hdf5(tmp_path / "d.hdf5", pendulum_rows)):
        assert main(["data", "info", str(path)]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["rows"] == 450 and info["episodes"] == 3 and info["megabytes"] > 0
        assert info["return_mean"] == pytest.approx(expect, rel=1e-6)
