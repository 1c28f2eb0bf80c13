"""The pixel task (PixelPendulum-v0) and the image path end to end: env spaces and seeding, make_env keeping
image Dict spaces (and still flattening other Dict spaces), a generated image dataset through Minari, a tiny
`relive train rlpd` run on it, and an agent checkpoint round trip with dict observations."""

import json

import gymnasium as gym
import numpy as np
import pytest

from relive.envs import env_spec, has_image_keys, make_env
from relive.pixel_envs import pendulum_image


def test_observation_space_and_spec():
    env = make_env("PixelPendulum-v0")
    space = env.observation_space
    assert isinstance(space, gym.spaces.Dict) and has_image_keys(space)
    assert space["image"].shape == (3, 24, 24) and space["image"].dtype == np.uint8
    assert space["state"].shape == (1,)
    spec = env_spec(env)
    assert spec.obs_shape == {"image": ((3, 24, 24), np.uint8), "state": ((1,), np.float32)}
    assert spec.action_shape == (1,) and spec.max_episode_steps == 200
    obs, _ = env.reset(seed=0)
    assert space.contains(obs)
    # the state key is the angular velocity; the image shows the angle
    theta, theta_dot = env.unwrapped.state
    assert obs["state"][0] == np.float32(theta_dot)
    np.testing.assert_array_equal(obs["image"], pendulum_image(float(theta), 24))


def test_image_shows_the_angle():
    up, down = pendulum_image(0.0, 24), pendulum_image(np.pi, 24)
    rod = (up[0] == 204) & (up[1] == 77)
    rows = np.flatnonzero(rod.any(axis=1))
    assert rows.min() <= 2 and rows.max() <= 13  # upright: from the pivot (row 11.5, width 1.7) to the top
    rod = (down[0] == 204) & (down[1] == 77)
    rows = np.flatnonzero(rod.any(axis=1))
    assert rows.min() >= 10 and rows.max() >= 21  # hanging: from the pivot to the bottom
    assert not np.array_equal(pendulum_image(0.5, 24), pendulum_image(-0.5, 24))


def test_same_seed_same_episode():
    def rollout(seed):
        env = make_env("PixelPendulum-v0")
        obs, _ = env.reset(seed=seed)
        frames, rng = [obs], np.random.default_rng(0)
        for _ in range(20):
            obs, *_ = env.step(rng.uniform(-2, 2, 1).astype(np.float32))
            frames.append(obs)
        return frames

    a, b, c = rollout(3), rollout(3), rollout(4)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["image"], y["image"])
        np.testing.assert_array_equal(x["state"], y["state"])
    assert any(not np.array_equal(x["image"], z["image"]) for x, z in zip(a, c, strict=True))


def test_other_dict_spaces_are_still_flattened():
    class GoalEnv(gym.Env):
        observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "b": gym.spaces.Box(-1, 1, (3,))})
        action_space = gym.spaces.Box(-1, 1, (1,))

    assert not has_image_keys(GoalEnv.observation_space)
    gym.register("ReliveTestGoal-v0", entry_point=lambda: GoalEnv(), max_episode_steps=5)
    try:
        assert make_env("ReliveTestGoal-v0").observation_space.shape == (5,)
    finally:
        del gym.registry["ReliveTestGoal-v0"]


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    from relive.train.generate import make_dataset

    root = tmp_path_factory.mktemp("minari")
    did, summary = make_dataset("pixel-pendulum-v0", "random", steps=400, seed=0, root=root,
                                out=tmp_path_factory.mktemp("out"), progress=False)
    return did, root, summary


def test_generated_dataset_keeps_images(tiny_dataset):
    from relive.data.loaders import load_rows

    did, root, summary = tiny_dataset
    assert summary["rows"] == 400 and summary["episodes"] == 2
    rows, _ = load_rows(str(root / did), env_id="PixelPendulum-v0")
    assert rows["obs"]["image"].shape == (400, 3, 24, 24) and rows["obs"]["image"].dtype == np.uint8
    assert rows["obs"]["state"].shape == (400, 1)
    np.testing.assert_array_equal(rows["obs"]["image"][1:200], rows["next_obs"]["image"][:199])


def test_medium_replay_is_refused_for_a_pixel_task(tmp_path):
    from relive.train.generate import make_dataset

    with pytest.raises(ValueError, match="no medium-replay level"):
        make_dataset("pixel-pendulum-v0", "medium-replay", root=tmp_path, out=tmp_path, progress=False)


def test_train_rlpd_on_the_pixel_task_end_to_end(tiny_dataset, tmp_path):
    """`relive train rlpd --env PixelPendulum-v0` from the generated image dataset (the CNN encoder chosen by
    agent.encoder = "auto"), then the final agent reloaded: the same actions on the same observations."""
    from relive.cli import main
    from relive.config import load_config
    from relive.replay.checkpoint import load_tree
    from relive.train.trainer import build_agent

    did, root, _ = tiny_dataset
    run = tmp_path / "run"
    code = main(["train", "rlpd", "--env", "PixelPendulum-v0", "--dataset", str(root / did), "--online-steps", "60",
                 "--warmup", "20", "--utd", "1", "--batch-size", "16", "--eval-every", "60", "--eval-episodes", "1",
                 "--set", "agent.num_qs=2", "--set", "agent.actor_every=1", "--set", "agent.hidden=[16,16]",
                 "--set", "agent.encoder_channels=4", "--set", "agent.encoder_layers=1",
                 "--set", "agent.encoder_feature_dim=8", "--set", "agent.augment_pad=2", "--checkpoint-every", "20",
                 "--run-dir", str(run), "--no-progress"])
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_online_env_steps"] == 60 and summary["num_grad_steps"] > 0
    cfg = load_config(run / "config.json")
    env = make_env("PixelPendulum-v0")
    agent = build_agent(cfg, env_spec(env))
    state = load_tree(run / "agent_final", kind="agent")
    assert any(k.startswith("encoder__convs") for k in state["critic"])  # the checkpoint holds the CNN
    agent.load_state_dict(state)
    obs, _ = env.reset(seed=1)
    batch = {k: v[None] for k, v in obs.items()}
    fresh = build_agent(cfg, env_spec(env))
    assert not np.array_equal(fresh.act(batch, explore=False), agent.act(batch, explore=False))
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.act(batch, explore=False), agent.act(batch, explore=False))


def test_residual_sac_refuses_image_observations():
    from relive.agents.residual_sac import ResidualSAC, ResidualSACConfig

    with pytest.raises(ValueError, match="flat Box observations"):
        ResidualSAC.from_spec(env_spec(make_env("PixelPendulum-v0")), ResidualSACConfig(), np.random.SeedSequence(0))


def test_vector_collector_stores_dict_rows_with_the_true_final_observation():
    from relive.envs import make_vector_env, random_actions
    from relive.train.collector import VectorCollector

    envs = make_vector_env("PixelPendulum-v0", 2, max_episode_steps=5)
    spec = env_spec(make_env("PixelPendulum-v0", 5))
    col = VectorCollector(envs, spec, seed=0)
    rng = np.random.default_rng(0)
    chunks, steps = col.step_streams(lambda obs: random_actions(spec, len(obs["state"]), rng), 12)
    assert steps == 12
    for _, rows in chunks:
        assert rows["obs"]["image"].shape == (6, 3, 24, 24) and rows["obs"]["image"].dtype == np.uint8
        assert rows["truncated"].tolist() == [False] * 4 + [True, False]
        # within the episode next_obs is the following obs; at the truncation it is the final frame, not the reset
        np.testing.assert_array_equal(rows["next_obs"]["image"][:4], rows["obs"]["image"][1:5])
        assert not np.array_equal(rows["next_obs"]["image"][4], rows["obs"]["image"][5])
    col.close()


TINY_CNN = ["--utd", "1", "--batch-size", "16", "--eval-episodes", "1", "--set", "agent.num_qs=2",
            "--set", "agent.hidden=[16,16]", "--set", "agent.encoder_channels=4", "--set", "agent.encoder_layers=1",
            "--set", "agent.encoder_feature_dim=8", "--no-progress"]


@pytest.mark.slow
def test_calql_offline_then_online_on_the_pixel_task(tiny_dataset, tmp_path):
    from relive.cli import main

    did, root, _ = tiny_dataset
    run = tmp_path / "calql"
    assert main(["train", "calql", "--env", "PixelPendulum-v0", "--dataset", str(root / did), "--offline-steps", "20",
                 "--online-steps", "30", "--warmup", "0", "--eval-every", "30", "--set", "agent.cql_n_actions=2",
                 *TINY_CNN, "--run-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_offline_grad_steps"] == 20 and summary["num_grad_steps"] == 50


@pytest.mark.slow
def test_a_stopped_pixel_run_resumes_to_the_same_result(tiny_dataset, tmp_path):
    """Checkpoints of a dict-observation run (image buffer, CNN agent) resume exactly: a run stopped after its
    checkpoint at env step 40 and resumed ends with the same parameters as one never stopped."""
    from relive.cli import main
    from relive.config import override
    from relive.presets import get_preset
    from relive.replay.checkpoint import load_tree
    from relive.train.trainer import train

    did, root, _ = tiny_dataset
    sets = ['env.id="PixelPendulum-v0"', f'data.dataset="{root / did}"', "schedule.num_online_env_steps=80",
            "schedule.num_warmup_env_steps=20", "schedule.utd_ratio=1", "schedule.batch_size=16",
            "run.eval_every_env_steps=80", "run.eval_episodes=1", "run.checkpoint_every_env_steps=20",
            "agent.num_qs=2", "agent.hidden=[16,16]", "agent.encoder_channels=4", "agent.encoder_layers=1",
            "agent.encoder_feature_dim=8", "agent.augment_pad=2", "run.progress=false"]

    def cfg(name):
        return override(get_preset("rlpd"), [*sets, f'run.run_dir="{tmp_path / name}"'])

    train(cfg("whole"))

    class Stop(Exception):
        pass

    def stop(env_steps, grad_steps):
        if env_steps > 45:
            raise Stop

    with pytest.raises(Stop):
        train(cfg("stopped"), on_step=stop)
    assert main(["train", "--resume", str(tmp_path / "stopped")]) == 0
    a, b = (load_tree(tmp_path / n / "agent_final", kind="agent") for n in ("whole", "stopped"))
    for part in ("actor", "critic"):
        for k in a[part]:
            np.testing.assert_array_equal(a[part][k], b[part][k])
