"""Behaviour cloning: learning a linear expert, episode selection, fine-tuning, pickle-free save/load, and
`relive bc` on a tiny .npz."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from relive.agents.bc import (
    BCConfig,
    fine_tune,
    load_bc_policy,
    new_policy,
    save_bc_policy,
    train_bc,
)
from relive.data.selection import episode_successes, select_episodes

LOW, HIGH = -np.ones(2, np.float32), np.ones(2, np.float32)
W = np.array([[0.3, -0.2], [0.1, 0.25], [-0.15, 0.05]], np.float32)  # a linear expert a = s W, inside (-1, 1)


pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


def expert_rows(n=2000, seed=0) -> dict:
    obs = np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)
    return {"obs": obs, "action": np.clip(obs @ W, -0.95, 0.95)}


def predict(policy, obs):
    with torch.no_grad():
        return policy(torch.as_tensor(obs)).numpy()


def test_bc_reduces_the_loss_and_reproduces_a_linear_expert():
    rows = expert_rows()
    policy, losses = train_bc(rows, LOW, HIGH, BCConfig(hidden=(32, 32), num_steps=400, lr=3e-3, batch_size=128),
                               seed=0)
    assert losses[-50:].mean() < 0.05 * losses[:10].mean()
    test = expert_rows(500, seed=1)
    err = np.mean((predict(policy, test["obs"]) - test["action"]) ** 2)
    assert err < 2e-3, err
    # an untrained policy is far off (so the test can fail)
    fresh = new_policy(3, 2, LOW, HIGH, BCConfig(hidden=(32, 32)), seed=0)
    assert np.mean((predict(fresh, test["obs"]) - test["action"]) ** 2) > 10 * err


def test_bc_is_deterministic_given_the_seed():
    rows = expert_rows(300)
    cfg = BCConfig(hidden=(16,), num_steps=50)
    a, la = train_bc(rows, LOW, HIGH, cfg, seed=4)
    b, lb = train_bc(rows, LOW, HIGH, cfg, seed=4)
    c, _ = train_bc(rows, LOW, HIGH, cfg, seed=5)
    np.testing.assert_array_equal(la, lb)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])
    assert not torch.equal(a.net[0].weight, c.net[0].weight)


def test_outputs_stay_inside_the_box():
    rows = {"obs": np.random.default_rng(0).normal(size=(200, 3)).astype(np.float32),
            "action": np.full((200, 2), 5.0, np.float32)}  # targets beyond the box are clipped to it
    policy, _ = train_bc(rows, LOW, HIGH, BCConfig(hidden=(16,), num_steps=200, lr=1e-2), seed=0)
    out = predict(policy, rows["obs"] * 10)
    assert (out <= 1.0).all() and (out >= -1.0).all() and out.mean() > 0.9


def episodes_rows() -> dict:
    """Four episodes of lengths 3, 2, 4, 1; episodes 1 and 3 end by termination (success), rewards 1 per step."""
    lengths, term = [3, 2, 4, 1], [False, True, False, True]
    n = sum(lengths)
    terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
    ep_id = np.repeat(np.arange(4), lengths)
    ends = np.cumsum(lengths) - 1
    for e, t in zip(ends, term, strict=True):
        (terminated if t else truncated)[e] = True
    return {"obs": ep_id[:, None].astype(np.float32) * np.ones((1, 3), np.float32), "action": np.zeros((n, 2)),
            "reward": np.ones(n, np.float32), "next_obs": np.zeros((n, 3), np.float32),
            "terminated": terminated, "truncated": truncated, "ep": ep_id}


def test_episode_selection_counts():
    rows = episodes_rows()
    assert len(select_episodes(rows)["obs"]) == 10
    two = select_episodes(rows, episodes=2)
    assert len(two["obs"]) == 5 and set(two["ep"]) == {0, 1}
    np.testing.assert_array_equal(episode_successes(rows), [False, True, False, True])
    ok = select_episodes(rows, successful_only=True)
    assert len(ok["obs"]) == 3 and set(ok["ep"]) == {1, 3}
    first_ok = select_episodes(rows, episodes=1, successful_only=True)
    assert len(first_ok["obs"]) == 2 and set(first_ok["ep"]) == {1}
    # success by return threshold: returns are the lengths 3, 2, 4, 1
    np.testing.assert_array_equal(episode_successes(rows, success_return=3), [True, False, True, False])
    assert set(select_episodes(rows, successful_only=True, success_return=3)["ep"]) == {0, 2}
    skipped = select_episodes(rows, episodes=2, skip=1)
    assert len(skipped["obs"]) == 6 and set(skipped["ep"]) == {1, 2}
    assert set(select_episodes(rows, episodes=1, successful_only=True, skip=1)["ep"]) == {3}
    with pytest.raises(ValueError, match="skip must be in"):
        select_episodes(rows, skip=4)
    with pytest.raises(ValueError, match="asked for 3 successful episodes, the dataset has 2"):
        select_episodes(rows, episodes=3, successful_only=True)
    with pytest.raises(ValueError, match="no successful episode"):
        select_episodes(rows, successful_only=True, success_return=100)
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        select_episodes(rows, episodes=0)


def test_fine_tune_moves_toward_new_targets_and_leaves_the_original_alone():
    rows = expert_rows(500)
    policy, _ = train_bc(rows, LOW, HIGH, BCConfig(hidden=(32, 32), num_steps=300, lr=3e-3), seed=0)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    target = {"obs": rows["obs"], "action": np.full_like(rows["action"], 0.5)}
    err_before = np.mean((predict(policy, rows["obs"]) - 0.5) ** 2)
    new, losses = fine_tune(policy, target, num_steps=200, lr=3e-3, seed=0)
    err_after = np.mean((predict(new, rows["obs"]) - 0.5) ** 2)
    assert err_after < 0.1 * err_before
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(new.obs_mean, policy.obs_mean)  # observation statistics are kept
    with pytest.raises(ValueError, match="SquashedMLP"):
        fine_tune(torch.nn.Linear(3, 2), target, num_steps=1)


def test_save_load_round_trip_is_pickle_free(tmp_path):
    policy, _ = train_bc(expert_rows(200), LOW, HIGH, BCConfig(hidden=(16, 8), num_steps=20), seed=0)
    out = save_bc_policy(tmp_path / "bc", policy, {"losses": np.arange(3.0)})
    loaded = load_bc_policy(out)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    files = {p.suffix for p in (out / "policy").iterdir()}
    assert files <= {".npy", ".json"}
    for f in (out / "policy").glob("*.npy"):
        np.load(f, allow_pickle=False)  # raises on any pickled array
    assert json.loads((out / "bc.json").read_text())["losses"] == [0.0, 1.0, 2.0]


def test_bad_rows_get_clear_errors():
    with pytest.raises(ValueError, match=r"action must have shape \[10, 2\]"):
        train_bc({"obs": np.zeros((10, 3)), "action": np.zeros((9, 2))}, LOW, HIGH, BCConfig(num_steps=1))
    with pytest.raises(ValueError, match="continuous actions"):
        train_bc({"obs": np.zeros((10, 3)), "action": np.zeros(10)}, LOW, HIGH, BCConfig(num_steps=1))
    with pytest.raises(ValueError, match="hidden"):
        BCConfig(hidden=())


def test_cli_bc_on_a_tiny_npz(tmp_path, capsys):
    from relive.agents.base_policy import load_base_policy
    from relive.cli import main
    from relive.data.npz_io import save_dataset
    from relive.envs import env_spec, make_env
    from relive.train.collector import collect_dataset

    rows = collect_dataset("Pendulum-v1", 400, seed=0)  # two episodes of uniform actions
    path = save_dataset(tmp_path / "tiny.npz", rows, env_id="Pendulum-v1")
    out = tmp_path / "bc"
    code = main(["bc", "--dataset", str(path), "--out", str(out), "--episodes", "1", "--steps", "30",
                 "--hidden", "16,16", "--eval-episodes", "2", "--success-return=-1e9", "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "200 of 400 rows, 1 episodes" in printed and "success rate 1.00" in printed
    ev = json.loads((out / "eval.json").read_text())
    assert ev["episodes"] == 2 and ev["success_rate"] == 1.0 and len(ev["returns"]) == 2
    info = json.loads((out / "bc.json").read_text())
    assert info["episodes"] == 1 and info["rows"] == 200 and info["config"]["num_steps"] == 30
    base = load_base_policy(out, env_spec(make_env("Pendulum-v1")))
    assert base(np.zeros((3, 3), np.float32)).shape == (3, 1)

    # an existing --out is refused before any work, untouched (issue 28 item 7); --overwrite replaces it whole
    (out / "note.txt").write_text("keep me")
    again = ["bc", "--dataset", str(path), "--out", str(out), "--episodes", "1", "--steps", "5", "--hidden", "8",
             "--eval-episodes", "0", "--no-progress"]
    capsys.readouterr()
    assert main(again) == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / "note.txt").read_text() == "keep me" and (out / "eval.json").is_file()
    assert main([*again, "--overwrite"]) == 0
    assert not (out / "note.txt").exists() and not (out / "eval.json").exists()
    assert json.loads((out / "bc.json").read_text())["config"]["num_steps"] == 5
    with pytest.raises(ValueError, match="exists; pass --overwrite"):
        save_bc_policy(out, new_policy(3, 1, [-2.0], [2.0], BCConfig(hidden=(8,)), seed=0))


def test_observation_statistics_and_constant_features():
    rows = expert_rows(400)
    rows["obs"][:, 2] = 7.0  # a feature constant in the data (the goal of a single demo)
    policy, _ = train_bc(rows, LOW, HIGH, BCConfig(hidden=(8,), num_steps=1), seed=0)
    np.testing.assert_allclose(policy.obs_mean.numpy(), rows["obs"].mean(0), rtol=1e-5)
    np.testing.assert_allclose(policy.obs_std.numpy()[:2], rows["obs"].std(0)[:2], rtol=1e-5)
    assert policy.obs_std[2] == 1.0  # centred, not divided by ~0


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "argument --steps: expected a positive integer, got 0"),
    (["--episodes", "-1"], "argument --episodes"),
    (["--lr", "nan"], "argument --lr: expected a positive number"),
    (["--eval-episodes", "-2"], "argument --eval-episodes: expected a non-negative integer"),
])
def test_cli_bc_rejects_bad_arguments(tmp_path, capsys, argv, message):
    from relive.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["bc", "--dataset", str(tmp_path / "x.npz"), "--out", str(tmp_path / "o"), *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_cli_bc_refused_input_is_one_line(tmp_path, capsys):
    from relive.cli import main

    assert main(["bc", "--dataset", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relive: error:") and "missing.npz" in err and err.count("\n") == 1

