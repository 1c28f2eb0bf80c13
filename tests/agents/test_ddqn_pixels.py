"""DDQN on images (Atari frame stacks, MinAtar planes): the image Q-networks' shapes and scaling, the options
Atari asks for (RMSprop, reward clipping, evaluation epsilon), a seeded learning test through a frame-stacked
buffer, the pixel presets, and the CLI end to end on MinAtar."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.encoders import IMAGE_Q_NETS, image_q_net, image_q_net_name
from relive.envs import EnvSpec
from relive.replay import ReplayBuffer
from relive.replay.storage.frame_stack import FrameStack

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/agents/conftest.py


def spec(shape, dtype, num_actions=4) -> EnvSpec:
    return EnvSpec("Pix-v0", shape, True, (), num_actions, None, None, 100, obs_dtype=np.dtype(dtype))


@pytest.mark.parametrize("name, shape, dtype, conv_out", [("nature", (4, 84, 84), np.uint8, 64 * 7 * 7),
                                                          ("minatar", (7, 10, 10), np.bool_, 16 * 8 * 8)])
def test_image_q_networks_have_the_papers_layers_and_output_one_value_per_action(name, shape, dtype, conv_out):
    net = image_q_net(name, shape, dtype, 5, torch.Generator().manual_seed(0))
    convs = [m for m in net if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == list(IMAGE_Q_NETS[name][0])
    assert (linears[0].in_features, linears[0].out_features, linears[1].out_features) == \
        (conv_out, IMAGE_Q_NETS[name][1], 5)
    x = torch.zeros(3, *shape, dtype=torch.uint8 if dtype == np.uint8 else torch.bool)
    assert net(x).shape == (3, 5)


def test_pixels_are_scaled_to_unit_range_on_the_device_and_planes_read_as_0_or_1():
    u8 = image_q_net("minatar", (2, 10, 10), np.uint8, 3, torch.Generator().manual_seed(0))
    b = image_q_net("minatar", (2, 10, 10), np.bool_, 3, torch.Generator().manual_seed(0))
    on = torch.ones(1, 2, 10, 10)
    assert torch.allclose(u8((on * 255).to(torch.uint8)), b(on.bool()))
    assert (image_q_net_name((4, 84, 84)), image_q_net_name((4, 10, 10))) == ("nature", "minatar")
    with pytest.raises(ValueError, match="too small"):
        image_q_net("nature", (4, 10, 10), np.uint8, 3, torch.Generator())


def test_the_encoder_follows_the_observation_and_vectors_keep_the_mlp():
    assert DDQN.from_spec(spec((4, 84, 84), np.uint8), DDQNConfig(), 0).image_shape == (4, 84, 84)
    assert DDQN.from_spec(spec((4, 10, 10), np.bool_), DDQNConfig(), 0).image_shape == (4, 10, 10)
    vec = DDQN.from_spec(spec((4,), np.float32), DDQNConfig(), 0)
    assert vec.image_shape is None and isinstance(vec.q[0], torch.nn.Linear)
    assert DDQN.from_spec(spec((4, 10, 10), np.bool_), DDQNConfig(encoder="mlp"), 0).image_shape is None
    with pytest.raises(ValueError, match="reads images"):
        DDQN.from_spec(spec((4,), np.float32), DDQNConfig(encoder="nature"), 0)


def test_options_rmsprop_reward_clipping_and_evaluation_epsilon():
    with pytest.raises(ValueError, match="clip_reward"):
        DDQNConfig(clip_reward=True, n_step=3)
    cfg = DDQNConfig(optimizer="rmsprop", rmsprop_alpha=0.95, optimizer_eps=0.01, rmsprop_centered=True,
                     clip_reward=True, eval_epsilon=1.0, target_update_period=1)
    agent = DDQN.from_spec(spec((2, 10, 10), np.bool_, 3), cfg, 0)
    assert isinstance(agent.opt, torch.optim.RMSprop) and agent.opt.defaults["centered"]
    obs = np.zeros((200, 2, 10, 10), bool)
    assert len(set(agent.act(obs, explore=False).tolist())) == 3  # eval_epsilon 1: uniform actions
    assert agent.num_act_steps == 0  # evaluation leaves the exploration schedule alone
    # clip_reward: a reward of 100 and one of 1 give the same target
    rows = dict(obs=np.zeros((2, 2, 10, 10), bool), action=np.zeros(2, np.int64), reward=np.array([100.0, 1.0]),
                next_obs=np.zeros((2, 2, 10, 10), bool), terminated=np.ones(2, bool), truncated=np.zeros(2, bool))
    buf = ReplayBuffer(10, (2, 10, 10), (), obs_dtype=np.bool_, action_dtype=np.int64)
    buf.extend(rows)
    td = agent.update(buf.gather(np.arange(2))).signals["td_error"]
    assert td[0] == pytest.approx(td[1])
    state = agent.state_dict()
    other = DDQN.from_spec(spec((2, 10, 10), np.bool_, 3), cfg, 1)
    other.load_state_dict(state)
    assert np.array_equal(other.act(obs, explore=False), agent.act(obs, explore=False))


def moving_dot_episode(rng, length: int = 6, size: int = 36) -> tuple[np.ndarray, int]:
    """Frames [length + 1, 1, size, size] (uint8) of a dot moving one pixel a step left (0) or right (1)."""
    direction = int(rng.integers(2))
    x0, y = int(rng.integers(8, size - 8)), int(rng.integers(2, size - 2))
    frames = np.zeros((length + 1, 1, size, size), np.uint8)
    for t in range(length + 1):
        x = x0 + (t if direction else -t)
        frames[t, 0, y - 1:y + 2, x - 1:x + 2] = 255
    return frames, direction


def stacks(frames: np.ndarray, k: int) -> np.ndarray:
    """Gymnasium FrameStackObservation's stacks of an episode's frames (reset padding): [T, k, H, W]."""
    idx = np.maximum(np.arange(len(frames))[:, None] - np.arange(k - 1, -1, -1)[None], 0)
    return frames[idx][:, :, 0]


@pytest.mark.slow  # ~9 s on 2 cores: 600 updates of the Nature CNN
def test_pixel_ddqn_learns_the_direction_of_motion_from_stacks_stored_once():
    """Only the stack shows which way the dot moves (one frame cannot): the agent is rewarded for naming it. The
    stacks go through a frame-stacked buffer (each frame stored once, stacks rebuilt when sampled) and the Nature
    CNN; gamma 0 (a contextual bandit per step), so 600 updates suffice (~7 s)."""
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(4000, (4, 36, 36), (), obs_dtype=np.uint8, action_dtype=np.int64, frame_stack=FrameStack(4),
                       seed=0)
    for _ in range(150):
        frames, direction = moving_dot_episode(rng)
        s = stacks(frames, 4)
        action = rng.integers(0, 2, len(s) - 1)
        done = np.zeros(len(s) - 1, bool)
        done[-1] = True
        buf.extend(dict(obs=s[:-1], action=action, reward=(action == direction).astype(np.float32),
                        next_obs=s[1:], terminated=done, truncated=np.zeros_like(done)))
    assert buf.storage.columns["obs"].shape[1:] == (1, 36, 36)  # frames, not stacks
    cfg = DDQNConfig(encoder="nature", lr=3e-4, gamma=0.0, target_update_period=50, max_grad_norm=None)
    agent = DDQN.from_spec(spec((4, 36, 36), np.uint8, 2), cfg, 0)
    for _ in range(600):
        agent.update(buf.sample(32))
    test = [moving_dot_episode(rng) for _ in range(40)]
    obs = np.concatenate([stacks(f, 4)[2:] for f, _ in test])  # stacks that show two moves or more
    want = np.concatenate([np.full(len(f) - 2, d) for f, d in test])
    accuracy = float((agent.act(obs, explore=False) == want).mean())
    assert accuracy > 0.9, accuracy  # (0.97 here; chance: 0.5)


# -- presets -------------------------------------------------------------------------------------------------
def test_pixel_presets_at_their_sources():
    from relive.presets import get_preset

    atari = get_preset("ddqn_atari")
    a, s = atari.agent, atari.schedule
    assert (a.encoder, a.optimizer, a.lr, a.rmsprop_alpha, a.target_update_period, a.eps_end,
            a.eps_decay_steps, a.max_grad_norm, a.clip_reward, a.eval_epsilon) == \
        ("nature", "rmsprop", 6.25e-5, 0.95, 7500, 0.01, 1_000_000, None, True, 0.001)
    assert (s.batch_size, s.num_warmup_env_steps, s.env_steps_per_chunk, s.grad_steps_per_chunk,
            atari.replay.capacity, atari.run.eval_episodes) == (32, 50_000, 4, 1, 1_000_000, 1)
    k100 = get_preset("ddqn_atari100k")
    assert (k100.agent.optimizer, k100.agent.lr, k100.agent.optimizer_eps, k100.agent.target_update_period,
            k100.agent.eps_decay_steps, k100.schedule.num_online_env_steps, k100.schedule.num_warmup_env_steps,
            k100.schedule.utd_ratio, k100.env.kwargs) == ("adam", 1e-4, 1.5e-4, 1, 5000, 100_000, 1600, 1,
                                                          {"repeat_action_probability": 0.0})  # no sticky actions
    m = get_preset("ddqn_minatar")
    assert (m.agent.encoder, m.agent.lr, m.agent.rmsprop_momentum, m.agent.target_update_period, m.agent.eps_end,
            m.agent.eps_decay_steps, m.replay.capacity, m.schedule.num_warmup_env_steps, m.agent.clip_reward) == \
        ("minatar", 2.5e-4, 0.95, 1000, 0.1, 100_000, 100_000, 5000, False)


@pytest.mark.parametrize("preset", ["ddqn_atari", "ddqn_atari100k", "ddqn_minatar"])
@pytest.mark.parametrize("replay", ["uniform", "per", "reaper"])
def test_every_pixel_preset_takes_each_replay(preset, replay):
    from relive.cli import build_parser
    from relive.train.cli import config_from_args
    from relive.train.trainer import build_sampler

    cfg = config_from_args(build_parser().parse_args(["train", preset, "--replay", replay]))
    assert cfg.replay.name == replay and cfg.replay.capacity == get_capacity(preset)
    build_sampler(cfg)
    if replay == "reaper":  # ReaPER App. D's alpha / omega are the sampler's defaults
        assert (cfg.replay.options.priority_exponent, cfg.replay.options.reliability_exponent) == (0.4, 0.2)


def get_capacity(preset):
    from relive.presets import get_preset

    return get_preset(preset).replay.capacity


def test_the_new_options_leave_every_other_ddqn_as_it_was():
    """The options' defaults are the DDQN of before: an MLP, the fused Adam, no reward clipping, greedy evaluation."""
    cfg = DDQNConfig()
    assert (cfg.encoder, cfg.optimizer, cfg.optimizer_eps, cfg.clip_reward, cfg.eval_epsilon) == \
        ("auto", "adam", None, False, 0.0)
    agent = DDQN(4, 2, cfg, seed=0)
    assert type(agent.opt).__name__ == "LeanAdam" and agent.image_shape is None
    before = dataclasses.asdict(DDQNConfig())
    assert {k: before[k] for k in ("hidden", "lr", "target_update_period", "eps_end")} == \
        {"hidden": (256, 256), "lr": 1e-3, "target_update_period": 500, "eps_end": 0.05}


def test_ddqn_minatar_cuts_episodes_so_an_evaluation_of_a_policy_that_never_ends_one_returns():
    """Seaquest's sub left at the surface plays forever (MinAtar has no time limit): the preset's evaluation env
    truncates the episode at MINATAR_MAX_EPISODE_STEPS (an evaluation of such a greedy policy used to hang)."""
    from relive.cli import build_parser
    from relive.presets import MINATAR_MAX_EPISODE_STEPS
    from relive.train.cli import config_from_args
    from relive.train.trainer import _make_envs, seed_streams

    cfg = config_from_args(build_parser().parse_args(["train", "ddqn_minatar", "--env", "MinAtar/Seaquest-v1"]))
    assert cfg.env.max_episode_steps == MINATAR_MAX_EPISODE_STEPS == 10_000
    envs = _make_envs(cfg, seed_streams(0))
    for env in (envs.eval_env, envs.env):
        env.reset(seed=0)
        steps, terminated, truncated = 0, False, False
        while not (terminated or truncated) and steps < 20_000:
            _, _, terminated, truncated, _ = env.step(0)  # (no-op: the sub stays at the surface)
            steps += 1
        assert (steps, terminated, truncated) == (10_000, False, True)


# -- the CLI, end to end -------------------------------------------------------------------------------------
def test_ddqn_minatar_trains_from_the_cli_and_writes_a_run_dir(tmp_path):
    from relive.cli import main

    run = tmp_path / "run"
    code = main(["train", "ddqn_minatar", "--env", "MinAtar/Breakout-v1", "--replay", "reaper", "--online-steps",
                 "200", "--warmup", "100", "--eval-every", "200", "--eval-episodes", "1", "--no-progress",
                 "--run-dir", str(run)])
    assert code == 0
    for name in ("config.json", "metrics.jsonl", "summary.json", "eval.csv"):
        assert (run / name).is_file()
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["agent"]["encoder"], cfg["replay"]["name"], cfg["env"]["id"]) == \
        ("minatar", "reaper", "MinAtar/Breakout-v1")


@pytest.mark.slow  # ~10 s: the Nature CNN's updates and Atari's emulator
def test_ddqn_atari_trains_from_the_cli_storing_each_frame_once(tmp_path):
    pytest.importorskip("ale_py")
    from relive.cli import main
    from relive.replay.checkpoint import load_tree

    run = tmp_path / "run"
    code = main(["train", "ddqn_atari", "--env", "ALE/Pong-v5", "--replay", "per", "--online-steps", "300",
                 "--warmup", "200", "--capacity", "1000", "--eval-every", "300", "--eval-episodes", "1",
                 "--set", "env.max_episode_steps=400", "--set", "run.save_final_buffer=true", "--no-progress",
                 "--run-dir", str(run)])
    assert code == 0
    buf = ReplayBuffer.from_state_dict(load_tree(run / "buffer_final", kind="replay_buffer"))
    assert buf.storage.columns["obs"].shape[1:] == (1, 84, 84) and buf.storage.columns["obs"].dtype == np.uint8
    assert buf.sample(4).obs.shape == (4, 4, 84, 84)
