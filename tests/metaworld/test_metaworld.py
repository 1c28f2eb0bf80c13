"""Meta-World tasks (relive.metaworld_envs) against the real metaworld package. metaworld pins mujoco 3.3.0,
so these run in their own venv: `make test-metaworld` (skipped in the main suite, where metaworld is absent)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("metaworld")

from relive.envs import make_env, reports_success  # noqa: E402
from relive.metaworld_envs import scripted_policy  # noqa: E402


def rollout(env, policy, seed):
    obs, _ = env.reset(seed=seed)
    first, total, steps = obs.copy(), 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs[None])[0])
        total, steps = total + reward, steps + 1
        assert reward in (0.0, 1.0) and reward == float(info["success"])  # the sparse reward is the success flag
        if terminated or truncated:
            return first, total, steps, terminated, info


def test_seeded_resets_repeat_and_differ_across_seeds():
    env = make_env("MetaWorld/reach-v3")
    starts = {s: env.reset(seed=s)[0] for s in range(6)}
    assert all(np.array_equal(env.reset(seed=s)[0], starts[s]) for s in range(6))
    goals = {tuple(np.round(o[-3:], 4)) for o in starts.values()}
    assert len(goals) >= 3  # the goal (observable: the last 3 floats) moves between placements


def test_the_scripted_expert_succeeds_and_success_ends_the_episode():
    env = make_env("MetaWorld/pick-place-v3")
    assert env.spec.max_episode_steps == 200 and reports_success(env)
    policy = scripted_policy("MetaWorld/pick-place-v3")
    for seed in range(3):
        _, total, steps, terminated, info = rollout(env, policy, seed)
        assert total == 1.0 and terminated and info["success"] and steps < 200
        assert "dense_reward" in info


def test_action_noise_makes_near_misses():
    env = make_env("MetaWorld/pick-place-v3")
    policy = scripted_policy("MetaWorld/pick-place-v3", noise=1.0, rng=np.random.default_rng(0))
    successes = [rollout(env, policy, seed)[1] for seed in range(12)]
    assert 0 < sum(successes) < 12


def test_unknown_tasks_and_bad_noise_are_refused():
    with pytest.raises(ValueError, match="unknown Meta-World task"):
        make_env("MetaWorld/no-such-task-v3")
    with pytest.raises(ValueError, match="noise"):
        scripted_policy("MetaWorld/reach-v3", noise=-1.0)


def test_data_make_writes_the_noisy_scripted_level(tmp_path):
    pytest.importorskip("minari")
    from relive.data.loaders import load_rows
    from relive.train.generate import make_dataset

    did, summary = make_dataset("metaworld-reach-v3", "noisy-scripted", steps=600, seed=0, root=tmp_path / "m",
                                out=tmp_path / "d", progress=False, noise=0.3)
    assert did == "relive/metaworld-reach-v3/noisy-scripted-v0" and summary["action_noise_std"] == 0.3
    assert summary["ref_max_return"] > 0.5  # the scripted expert's success rate is the reference
    rows, _ = load_rows(did, root=tmp_path / "m")
    assert len(rows["reward"]) == 600 and set(np.unique(rows["reward"])) <= {0.0, 1.0}
