"""Atari's DQN preprocessing and MinAtar (relive.atari_envs through relive.envs.make_env): shapes, dtypes, the frame
stack the trainer reads, and life loss as a termination of training episodes only."""

import gymnasium as gym
import numpy as np
import pytest

from relive.envs import env_spec, frame_stack_of, make_env

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

FIRE = 1  # Breakout's FIRE: the ball launches, the paddle stays, a life is lost within a few dozen steps


def test_atari_observations_are_uint8_stacks_of_four_84x84_grey_frames():
    env = make_env("ALE/Breakout-v5")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert all(np.array_equal(obs[0], obs[i]) for i in range(4))  # a first step: padded with its own frame
    obs, *_ = env.step(FIRE)
    spec = env_spec(env)
    assert (spec.obs_shape, spec.obs_dtype, spec.frame_stack, spec.discrete) == ((4, 84, 84), np.uint8,
                                                                                  (4, "reset"), True)
    env.close()


def _steps_to_first_life_loss(env) -> tuple[int, bool, dict]:
    env.reset(seed=0)
    lives = env.unwrapped.ale.lives()
    for t in range(1, 2000):
        _, _, terminated, truncated, info = env.step(FIRE)
        if env.unwrapped.ale.lives() < lives:
            return t, terminated, info
        assert not (terminated or truncated)
    raise AssertionError("no life lost in 2000 steps")


def test_a_lost_life_ends_a_training_episode_and_the_game_goes_on():
    env = make_env("ALE/Breakout-v5")
    _, terminated, info = _steps_to_first_life_loss(env)
    assert terminated and info["game_over"] is False
    lives = env.unwrapped.ale.lives()
    obs, _ = env.reset()  # continues the game (one no-op step), not a new one
    assert env.unwrapped.ale.lives() == lives and obs.shape == (4, 84, 84)
    env.close()


def test_evaluation_plays_full_games():
    env = make_env("ALE/Breakout-v5", evaluation=True)
    _, terminated, _ = _steps_to_first_life_loss(env)
    assert not terminated
    env.close()


def test_an_atari_dataset_holds_whole_games_not_lives():
    """collect_dataset records the game's episodes: a lost life (a training episode's end for the learner) is not a
    termination in the data, so a dataset's episode returns are game scores."""
    from relive.train.collector import collect_dataset

    lives: list[int] = []

    def policy_from_env(env):
        rng = np.random.default_rng(0)

        def act(obs):
            lives.append(env.unwrapped.ale.lives())
            return rng.integers(0, env.action_space.n, (1,))
        return act

    rows = collect_dataset("ALE/Breakout-v5", 600, seed=0, policy_from_env=policy_from_env)
    step = np.diff(lives)  # row i lost a life (game on): step[i] < 0; row i ended the game: a new one, step[i] > 0
    lost, new_game = np.flatnonzero(step < 0), np.flatnonzero(step > 0)
    assert lost.size >= 4 and new_game.size >= 1  # (random play in Breakout: games of ~150 steps, 5 lives each)
    assert not rows["terminated"][lost].any()  # a lost life is no episode end in the data
    assert rows["terminated"][new_game].all()  # the game's end is
    assert np.flatnonzero(rows["terminated"][:-1]).tolist() == new_game.tolist()  # and nothing else is


@pytest.mark.parametrize("evaluation", [False, True])
def test_an_atari_time_limit_counts_agent_steps_of_a_game_not_emulator_frames(evaluation):
    """env.max_episode_steps = N truncates an Atari game after N agent steps, as on every other env (not after N
    emulator frames, ~N / 4 agent steps, as ALE's own max_episode_steps below the frame skip would), life losses and
    the no-op step that follows each one included: the limit is the game's, not a life's."""
    env = make_env("ALE/Breakout-v5", max_episode_steps=40, evaluation=evaluation)  # (the first life: ~25 steps)
    assert env.spec.max_episode_steps == 40 and env_spec(env).max_episode_steps == 40
    env.reset(seed=0)
    steps, lives_lost = 0, 0
    while True:
        _, _, terminated, truncated, info = env.step(FIRE)
        steps += 1
        if truncated:
            break
        assert steps < 40
        if terminated:  # (training: a lost life; the game goes on)
            assert not evaluation and not info["game_over"]
            lives_lost += 1
            env.reset()
            steps += 1  # (the reset's no-op step)
    assert steps == 40 and (evaluation or lives_lost >= 1)
    env.close()


def test_env_kwargs_reach_ale_and_minatar_but_not_the_frame_skip():
    """env.kwargs: ALE's own gym.make keywords (no sticky actions: the Atari-100k benchmark's setting) and MinAtar's;
    the frame skip is the preprocessing's, and a ValueError says so."""
    assert make_env("ALE/Pong-v5").unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    for evaluation in (False, True):
        env = make_env("ALE/Pong-v5", evaluation=evaluation, env_kwargs={"repeat_action_probability": 0.0})
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
        assert env.reset(seed=0)[0].shape == (4, 84, 84)
    with pytest.raises(ValueError, match="frameskip is set by relive's Atari preprocessing"):
        make_env("ALE/Pong-v5", env_kwargs={"frameskip": 4})
    env = make_env("MinAtar/Breakout-v1", env_kwargs={"sticky_action_prob": 0.0})
    assert env.unwrapped.game.sticky_action_prob == 0.0


def test_minatar_observations_are_bool_planes_channels_first_without_a_stack():
    env = make_env("MinAtar/Breakout-v1")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 10, 10) and obs.dtype == np.bool_
    spec = env_spec(env)
    assert (spec.obs_shape, spec.obs_dtype, spec.frame_stack, spec.num_actions) == ((4, 10, 10), np.bool_, None, 3)
    env.close()


def test_frame_stack_of_reads_gymnasiums_wrapper_and_nothing_above_it():
    base = gym.make("CartPole-v1")
    assert frame_stack_of(base) is None
    assert frame_stack_of(gym.wrappers.FrameStackObservation(base, 3, padding_type="zero")) == (3, "zero")
    custom = gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 3, padding_type=np.zeros(4, np.float32))
    assert frame_stack_of(custom) is None  # a custom padding is no frame the buffer can rebuild
    flat = gym.wrappers.FlattenObservation(gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 3))
    assert frame_stack_of(flat) is None
    assert env_spec(make_env("CartPole-v1")).obs_dtype == np.float32  # vectors: as before
