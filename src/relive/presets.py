"""Presets are Python functions returning an ExperimentConfig: a few-line delta each, type-checked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from relive.agents.cal_ql import CalQLConfig
from relive.agents.ddpg import DDPGConfig
from relive.agents.ddqn import DDQNConfig
from relive.agents.residual_sac import ResidualSACConfig
from relive.agents.sac import RLPD_OFFLINE_FRACTION, SACConfig
from relive.agents.sac_refer import SACReFERConfig
from relive.agents.vracer import VRACERConfig
from relive.config import (
    EnvConfig,
    ExperimentConfig,
    InterventionConfig,
    ReplayConfig,
    RunConfig,
    ScheduleConfig,
)


def sac() -> ExperimentConfig:
    """SAC (twin critics) with uniform replay over offline + online rows."""
    return ExperimentConfig(preset="sac", agent_kind="sac", agent=SACConfig())


def rlpd() -> ExperimentConfig:
    """RLPD: SAC with 10 LayerNorm critics, subset-min of 2, UTD 20, target entropy -|A|/2, 50/50 symmetric
    sampling, no offline pre-training, 5000 random warm-up steps (Ball et al. 2023)."""
    return ExperimentConfig(preset="rlpd", agent_kind="sac", agent=SACConfig.rlpd(),
                            schedule=ScheduleConfig(utd_ratio=20, num_warmup_env_steps=5000),
                            replay=ReplayConfig.of("symmetric", offline_fraction=RLPD_OFFLINE_FRACTION))


def calql() -> ExperimentConfig:
    """Cal-QL: offline pre-training, then online fine-tuning with 50/50 symmetric sampling (CORL protocol,
    budgets scaled down); calibration stays on online with true online returns-to-go (official Cal-QL)."""
    return ExperimentConfig(preset="calql", agent_kind="calql", agent=CalQLConfig(),
                            schedule=ScheduleConfig(num_offline_grad_steps=20_000, num_warmup_env_steps=0),
                            replay=ReplayConfig.of("symmetric"))


def calql_arb() -> ExperimentConfig:
    """Cal-QL fine-tuned with ARB as in the ARB paper's code: on-policyness weights at trajectory level,
    lambda 5, 1000 env steps then 1000 updates, every row re-scored every 1000 gradient steps; calibration off
    online (the ARB code inherits CORL's Cal-QL)."""
    cfg = calql()
    return replace(cfg, preset="calql_arb", agent=replace(cfg.agent, calibrate_online=False),
                   schedule=replace(cfg.schedule, env_steps_per_chunk=1000),
                   replay=ReplayConfig.of("arb", temperature=5.0, refresh_every_grad_steps=1000))


def residual_sac() -> ExperimentConfig:
    """PLD stage 1: residual SAC on a frozen base policy (--base-policy PATH); Cal-QL critic pre-training on the
    base's successful episodes (--dataset), then online. Sources -- the PLD spec's §13 template: gamma 0.99,
    tau 0.005, batch 256 (schedule.batch_size), OTF K = 8 (agent.otf_candidates), 1 gradient step per stored env
    step (schedule.utd_ratio = 1; probing steps are executed, not stored, not trained on), warm-up 1000 steps of
    base-only acting (agent.warmup, stored, with updates; the trainer's random warm-up is off:
    schedule.num_warmup_env_steps = 0), probing H_probe 50, beta constant 0.5, alpha init 0.1, target entropy
    -|A| (agent.target_entropy = null), learning rates 3e-4, online capacity 1e6 (replay.capacity); its §10.2 loop:
    actor and alpha at every gradient step (agent.actor_every = 1); its §3: 50/50 symmetric replay; its §1.2: the
    residual reads the observation alone, dpi(delta_a | x) (agent.residual_input = "obs"; the PLD paper's
    dpi(delta_a | x, a_base) is "obs+base_action"); its §8.1: the Cal-QL pre-training's TD term is the standard SAC /
    clipped-double-Q target (agent.pretrain_target = "sac"; the OTF max of §4.4 stays for online training). PLD
    Table 5 (the spec is silent): widths 256, 2 LayerNorm critics, gradient-norm clip 1.0. Not from the spec: 5,000
    Cal-QL pre-training steps (schedule.num_offline_grad_steps; a third-party PLD reimplementation's value) with 10
    sampled actions per kind (agent.cql_n_actions; official Cal-QL's default), the other cql_* as the calql preset,
    init_log_std -3 (a ~= a_base at the start)."""
    return ExperimentConfig(preset="residual_sac", agent_kind="residual_sac", agent=ResidualSACConfig(),
                            schedule=ScheduleConfig(num_offline_grad_steps=5_000, num_warmup_env_steps=0,
                                                    batch_size=256),
                            replay=ReplayConfig.of("symmetric", offline_fraction=0.5))


def ddqn() -> ExperimentConfig:
    """Double DQN for discrete actions (the ReaPER paper's setting), uniform replay."""
    return ExperimentConfig(preset="ddqn", agent_kind="ddqn", agent=DDQNConfig(),
                            schedule=ScheduleConfig(num_online_env_steps=50_000, batch_size=64,
                                                    num_warmup_env_steps=1000),
                            replay=ReplayConfig.of("uniform", capacity=100_000))


def ddqn_per() -> ExperimentConfig:
    """Double DQN with proportional PER (alpha 0.6, beta 0.4 -> 1)."""
    cfg = ddqn()
    return replace(cfg, preset="ddqn_per", replay=ReplayConfig.of("per", capacity=cfg.replay.capacity))


# -- pixels: Atari and MinAtar (relive.atari_envs; the image Q-networks of relive.agents.encoders) ----------------
# Mnih et al. 2015 (Nature 518), Extended Data Table 1: RMSProp with squared gradient momentum 0.95 and min squared
# gradient 0.01 (Graves' centered RMSProp), read as torch's RMSprop(alpha=0.95, eps=0.01, centered=True) as MinAtar's
# reference code (examples/dqn.py) passes them.
DQN_RMSPROP: dict[str, Any] = {"optimizer": "rmsprop", "rmsprop_alpha": 0.95, "optimizer_eps": 0.01,
                               "rmsprop_centered": True}
ATARI_ENV_STEPS_PER_UPDATE = 4  # ReaPER App. D, "Steps per model update" (one gradient step per 4 agent steps)


def ddqn_atari() -> ExperimentConfig:
    """Double DQN on Atari at ReaPER's Atari column (Pleiss et al. 2025, seed 003, App. D, "Training
    specifications" table; preprocessing: App. D, "Atari preprocessing" -> relive.atari_envs; network: App. D,
    "Network architecture" = Mnih et al. 2015's Nature CNN): RMSprop 6.25e-5, budget 5e7 agent steps (SB3's
    total_timesteps; App. D does not name the unit), buffer 1e6, learning starts at 5e4, one gradient step every 4
    env steps, target copy every 3e4 env steps (SB3's target_update_interval counts env steps: 7,500 gradient steps
    here), batch 32, epsilon 1 -> 0.01 over 2% of the budget (1e6 steps), evaluation epsilon 0.001, gamma 0.99, no
    gradient clipping, 200 evaluations of one full game each; rewards clipped to their sign in the learner (Mnih et
    al. 2015; SB3's AtariWrapper clips them, App. D does not list it); replay uniform (App. D compares PER, alpha 0.6,
    and ReaPER, alpha 0.4 / omega 0.2, beta 0.4 -> 1: ``--replay per`` / ``--replay reaper``, whose defaults are
    those). Not checked (not in App. D): RMSprop's other settings (Mnih et al. 2015's: DQN_RMSPROP), the Huber loss
    (SB3's DQN: delta 1). Not as App. D: v5's sticky actions and no fire-on-reset (relive.atari_envs). Checkpoints
    every 1e6 env steps (a full buffer is ~7 GB on disk); on this 2-core machine pick --online-steps."""
    agent = DDQNConfig(encoder="nature", lr=6.25e-5, gamma=0.99,
                       target_update_period=30_000 // ATARI_ENV_STEPS_PER_UPDATE,
                       eps_start=1.0, eps_end=0.01, eps_decay_steps=1_000_000, max_grad_norm=None, clip_reward=True,
                       eval_epsilon=0.001, **DQN_RMSPROP)
    return ExperimentConfig(
        preset="ddqn_atari", agent_kind="ddqn", agent=agent, env=EnvConfig(id="ALE/Pong-v5"),
        schedule=ScheduleConfig(num_online_env_steps=50_000_000, env_steps_per_chunk=ATARI_ENV_STEPS_PER_UPDATE,
                                grad_steps_per_chunk=1, num_warmup_env_steps=50_000, batch_size=32),
        replay=ReplayConfig.of("uniform", capacity=1_000_000),
        run=RunConfig(eval_every_env_steps=250_000, eval_episodes=1, eval_fresh_starts=True, eval_at_start=False,
                      log_every_env_steps=10_000, checkpoint_every_env_steps=1_000_000))


def ddqn_atari100k() -> ExperimentConfig:
    """Double DQN on Atari-100k (100,000 agent steps = 400k frames) at DrQ(epsilon)'s setting (Agarwal et al.,
    NeurIPS 2021, "Deep RL at the Edge of the Statistical Precipice", Sec. / App. on Atari 100k; its published
    configuration, Dopamine's labs/atari_100k/configs/DrQ_eps.gin, checked): Double DQN, Adam 1e-4 with epsilon
    1.5e-4 (DER's, van Hasselt et al. 2019), batch 32, learning from 1,600 steps, one gradient step per env step,
    target copy every gradient step (target_update_period 1), epsilon 1 -> 0.01 over 5,000 steps, evaluation
    epsilon 0.001, gamma 0.99, replay uniform over every step (1M in the gin, "a proxy for unbounded": 100k holds the
    whole run), episodes of at most 27,000 steps (v5's 108,000 frames), no sticky actions (the gin's
    ``sticky_actions = False``, "Atari 100K benchmark doesn't use sticky actions": ``env.kwargs`` =
    ``{"repeat_action_probability": 0.0}``, since 2026-11-30; v5's 0.25 before). Not as DrQ(epsilon): one-step
    targets, not 10-step (rewards are clipped in the learner, which needs one-step rows); no dueling head and no
    random-shift augmentation (relive's DDQN has neither); evaluation every
    10k steps on 10 full games (DrQ(epsilon): 100 episodes at the end); the Nature CNN, the Huber loss and the reward
    clipping as ddqn_atari. ``--replay per|reaper`` as ddqn_atari. Time on the 2-core Xeon (docs/benchmarks.md,
    "Atari-100k wall time"): 98% of a run is the updates; a timed 25k-step run with ``--threads 2 --set
    agent.fused_adam=true --set agent.channels_last=true`` (float rounding away from these numbers) extrapolated to
    ~70 min of wall time for 100k steps, ~90 at one thread, before training flushed subnormal floats (its step grew
    from ~34 to ~43 ms); with the flush ~60 min is the estimate (not a timed 100k run); the defaults (one thread,
    flags off) are slower still. ``--threads 2`` only on an idle machine."""
    base = ddqn_atari()
    agent = replace(base.agent, lr=1e-4, optimizer="adam", optimizer_eps=1.5e-4, rmsprop_alpha=0.99,
                    rmsprop_centered=False, target_update_period=1, eps_end=0.01, eps_decay_steps=5000)
    return replace(base, preset="ddqn_atari100k", agent=agent,
                   env=replace(base.env, kwargs={"repeat_action_probability": 0.0}),
                   schedule=ScheduleConfig(num_online_env_steps=100_000, num_warmup_env_steps=1600, batch_size=32),
                   replay=ReplayConfig.of("uniform", capacity=100_000),
                   run=replace(base.run, eval_every_env_steps=10_000, eval_episodes=10, log_every_env_steps=1000,
                               checkpoint_every_env_steps=25_000))


#: MinAtar's games have no time limit (Freeway excepted: 2,500 steps), and a greedy policy can play one forever --
#: Seaquest's sub that never leaves the surface (MinAtar's author, kenjyoung/MinAtar issue 19) -- so an evaluation of
#: it never returned. 10,000 steps: the cap qlan3/Explorer's MinAtar configs give Seaquest (not checked against a
#: paper); a cut episode is a truncation (bootstrapped), not a termination.
MINATAR_MAX_EPISODE_STEPS = 10_000


def ddqn_minatar() -> ExperimentConfig:
    """Double DQN on MinAtar (``MinAtar/Breakout-v1`` ...) at MinAtar's DQN baseline (Young & Tian 2019, arXiv
    1903.03176, Sec. 4 and its reference code examples/dqn.py, checked): one 16-channel 3x3 conv and 128 units (the
    "minatar" Q-network), no frame stacking, centered RMSprop 2.5e-4 (squared-gradient decay 0.95, epsilon 0.01,
    momentum 0.95), batch 32, buffer 100k, learning from 5,000 steps (uniformly random actions until then), one
    gradient step per env step, target copy every 1,000 gradient steps, epsilon 1 -> 0.1 over the 100k steps after
    them, gamma 0.99, Huber loss, no gradient or reward clipping, 5M frames (agent steps: MinAtar has no frame
    skip). Not as the baseline: Double DQN's target (the ReaPER comparison's agent), not DQN's max; evaluations every
    100k steps of 10 greedy episodes (the paper reports training returns); episodes cut (truncated) at 10,000 steps
    (MINATAR_MAX_EPISODE_STEPS). ``--replay per|reaper`` (defaults: PER's alpha 0.6, ReaPER's App. D alpha 0.4 /
    omega 0.2, beta 0.4 -> 1)."""
    agent = DDQNConfig(encoder="minatar", lr=2.5e-4, gamma=0.99, target_update_period=1000, eps_start=1.0,
                       eps_end=0.1, eps_decay_steps=100_000, max_grad_norm=None, optimizer="rmsprop",
                       rmsprop_alpha=0.95, optimizer_eps=0.01, rmsprop_momentum=0.95, rmsprop_centered=True)
    return ExperimentConfig(
        preset="ddqn_minatar", agent_kind="ddqn", agent=agent,
        env=EnvConfig(id="MinAtar/Breakout-v1", max_episode_steps=MINATAR_MAX_EPISODE_STEPS),
        schedule=ScheduleConfig(num_online_env_steps=5_000_000, num_warmup_env_steps=5000, batch_size=32),
        replay=ReplayConfig.of("uniform", capacity=100_000),
        run=RunConfig(eval_every_env_steps=100_000, eval_episodes=10, log_every_env_steps=10_000,
                      checkpoint_every_env_steps=100_000))


REFER_CAPACITY = 2**18  # the ReF-ER paper's buffer (N, Sec. 3), for every DDPG variant of its Fig. 1


# The DDPG presets come in two settings. The "fast setting" (ddpg, ddpg_per, ddpg_refer, ddpg_refer1, ddpg_refer2):
# Adam 3e-4 for actor and critic, Gaussian noise for every variant, relive's exact recount of n_far -- what learns
# something in the short CPU runs of this library. The "paper setting" (the same names + "_paper"): the ReF-ER
# paper's DDPG (Novati & Koumoutsakos, ICML 2019), each value with its source in the preset's docstring.


def ddpg() -> ExperimentConfig:
    """DDPG with uniform replay (ER), fast setting: Adam 3e-4 for actor and critic (CleanRL's), Gaussian exploration
    sigma 0.2, a 2^18-row buffer; warm-up with the initial policy (as smarties fills its buffer), the same schedule
    for every DDPG variant of ReF-ER's Fig. 1. The paper's setting: ddpg_paper."""
    return ExperimentConfig(preset="ddpg", agent_kind="ddpg", agent=DDPGConfig(),
                            schedule=ScheduleConfig(warmup_policy="agent"),
                            replay=ReplayConfig.of("uniform", capacity=REFER_CAPACITY))


def ddpg_per() -> ExperimentConfig:
    """DDPG with proportional PER (alpha 0.6, beta 0.4 -> 1), fast setting (see ddpg). The paper's setting:
    ddpg_per_paper."""
    return replace(ddpg(), preset="ddpg_per", replay=ReplayConfig.of("per", capacity=REFER_CAPACITY))


def ddpg_refer() -> ExperimentConfig:
    """DDPG with ReF-ER (Novati & Koumoutsakos 2019), fast setting (see ddpg): C 4, D 0.1, A 5e-7 (Sec. 3), both
    rules; beta's step size 1e-4 (the paper's critic rate), initial beta 1e-4 (the authors' code; not in the
    paper), n_far with an exact recount every 2000 gradient steps (relive's estimator). Rows carry their behaviour
    (the actor's mean and sigma), so warm-up uses the agent's policy, not random actions (which have no record).
    The paper's setting: ddpg_refer_paper."""
    return replace(ddpg(), preset="ddpg_refer", replay=ReplayConfig.of("refer", capacity=REFER_CAPACITY))


def ddpg_refer1() -> ExperimentConfig:
    """DDPG with ReF-ER Rule 1 only (far rows skipped, no KL penalty): the paper's ReF-ER-1, fast setting."""
    cfg = ddpg_refer()
    return replace(cfg, preset="ddpg_refer1", agent=replace(cfg.agent, refer_rule2=False))


def ddpg_refer2() -> ExperimentConfig:
    """DDPG with ReF-ER Rule 2 only (KL penalty and beta, no row skipped): the paper's ReF-ER-2, fast setting."""
    cfg = ddpg_refer()
    return replace(cfg, preset="ddpg_refer2", agent=replace(cfg.agent, refer_rule1=False))


def td3() -> ExperimentConfig:
    """TD3 (Fujimoto, van Hoof & Meger, ICML 2018): DDPG with clipped double-Q (2 critics, targets from their min,
    Eq. 10), delayed policy updates (the actor and the target networks every 2nd critic step, Alg. 1) and target
    policy smoothing (noise 0.2 clipped to 0.5, Eq. 14), each in units of the action box's half-width as the
    authors' code scales them. The rest from the authors' code (sfujim/TD3 main.py, checked): Gaussian exploration
    0.1 half-widths (expl_noise), batch 256, gamma 0.99, tau 0.005, 25,000 uniform random steps before the first
    update (start_timesteps; with a shorter run pass --warmup), a 1e6-row uniform buffer (utils.py max_size). Networks
    2x256 with Adam 3e-4 for both: relive's defaults, the values the authors' TD3.py uses since its 2019 revision
    (not checked against that file here; the paper's Table 3 used 400-300 and 1e-3)."""
    return ExperimentConfig(preset="td3", agent_kind="ddpg",
                            agent=DDPGConfig(num_critics=2, actor_every=2, sigma=0.1, target_noise=0.2,
                                             target_noise_clip=0.5),
                            schedule=ScheduleConfig(num_warmup_env_steps=25_000, batch_size=256),
                            replay=ReplayConfig.of("uniform", capacity=1_000_000))


# What every paper-setting preset's docstring says (`relive presets --show NAME` prints it), with the sources.
_DDPG_PAPER = """Adam lr 1e-4 for the critic and 1e-5 for the actor (Sec. 5.1, below Fig. 2: "we use eta = 1e-4 for
    the critic and eta = 1e-5 for the policy"); 2x128 networks (the authors' code: smarties settings/DPG.json, a
    128-unit encoder and a 128-unit layer); critic L2 penalty (Adam weight decay) 1e-4 (Sec. 5.1 found a critic
    weight decay "necessary to stabilize DDPG with ER and PER" without giving a value: the authors' code's, smarties
    DPG.cpp nnLambda); exploration std sigma 0.2 (Sec. 2, Fig. 2); buffer N = 2^18 (Sec. 3); warm-up with the
    initial policy (as smarties fills its buffer). tau, batch size and gamma are relive's defaults (the paper's text
    does not give them)."""
_ER_PAPER = """Ornstein-Uhlenbeck exploration (Sec. 5.1: temporally-correlated noise "necessary to stabilize DDPG
    with ER and PER"), sigma 0.2 and mean reversion theta 0.15 (the authors' code: smarties DPG.h OrUhDecay 0.85,
    "as in original", i.e. Lillicrap et al.); learning rates not annealed (Sec. 5.1: annealing eta "worsened the
    instability of DDPG with regular ER and PER")."""
_REFER_PAPER = """ReF-ER: C 4, D 0.1, A 5e-7, N 2^18 (Sec. 3); learning rates annealed as eta / (1 + A t)
    (Eq. 13); beta's step size = the critic's learning rate, 1e-4 (Eq. 12: "eta is the NN's learning rate"), from
    initial beta 1e-4 (not in the paper: the authors' code, smarties MemoryBuffer.h); Gaussian exploration, no OU
    noise (Sec. 5.1: "with ReF-ER we do not use temporally-correlated noise"; rho needs the behaviour's density);
    n_far of Eq. 12 from each row's last computed rho, the paper's stale estimator (Sec. 3: "we store for each step
    its most recent rho_t"; Sec. 5.1: "outdated importance weights"; replay.refer.far_estimator = stale; the exact
    count every 2000 gradient steps is logged beside it, replay/refer_far_fraction_exact, and not used)."""


def ddpg_paper() -> ExperimentConfig:
    cfg = ddpg()
    return replace(cfg, preset="ddpg_paper", agent=DDPGConfig.paper(exploration_noise="ou"))


def ddpg_per_paper() -> ExperimentConfig:
    cfg = ddpg_paper()
    return replace(cfg, preset="ddpg_per_paper", replay=ReplayConfig.of("per", capacity=REFER_CAPACITY))


def ddpg_refer_paper() -> ExperimentConfig:
    cfg = ddpg_paper()
    agent = DDPGConfig.paper()
    return replace(cfg, preset="ddpg_refer_paper", agent=agent,
                   replay=ReplayConfig.of("refer", capacity=REFER_CAPACITY, beta_eta=agent.critic_lr,
                                          initial_beta=1e-4, far_estimator="stale"))


def ddpg_refer1_paper() -> ExperimentConfig:
    cfg = ddpg_refer_paper()
    return replace(cfg, preset="ddpg_refer1_paper", agent=replace(cfg.agent, refer_rule2=False))


def ddpg_refer2_paper() -> ExperimentConfig:
    cfg = ddpg_refer_paper()
    return replace(cfg, preset="ddpg_refer2_paper", agent=replace(cfg.agent, refer_rule1=False))


ddpg_paper.__doc__ = f"""DDPG with uniform replay (ER) at the ReF-ER paper's setting (Novati & Koumoutsakos, ICML
    2019), its Fig. 1 baseline: {_DDPG_PAPER} {_ER_PAPER} The fast setting: ddpg."""
ddpg_per_paper.__doc__ = f"""DDPG with PER at the ReF-ER paper's setting: {_DDPG_PAPER} {_ER_PAPER} PER is
    proportional (alpha 0.6, beta 0.4 -> 1), the paper's is rank-based (Fig. 1): relive has no rank-based PER, which
    orders every stored row by |TD error| (Schaul et al. 2016, Sec. 3.3: a periodically re-sorted heap with
    precomputed strata), a sampler of its own not written yet; the paper found rank-based the better PER variant
    (Sec. 5.2), so this baseline may be weaker than the paper's. The fast setting: ddpg_per."""
ddpg_refer_paper.__doc__ = f"""DDPG with ReF-ER (both rules) at the paper's setting: {_DDPG_PAPER} {_REFER_PAPER}
    The fast setting: ddpg_refer."""
ddpg_refer1_paper.__doc__ = f"""DDPG with ReF-ER Rule 1 only (far rows skipped, no KL penalty), the paper's
    ReF-ER-1 (Fig. 1), at the paper's setting: {_DDPG_PAPER} {_REFER_PAPER} The fast setting: ddpg_refer1."""
ddpg_refer2_paper.__doc__ = f"""DDPG with ReF-ER Rule 2 only (KL penalty and beta, no row skipped), the paper's
    ReF-ER-2 (Fig. 1), at the paper's setting: {_DDPG_PAPER} {_REFER_PAPER} The fast setting: ddpg_refer2."""


def sac_refer() -> ExperimentConfig:
    """SAC with ReF-ER's rules (our extension: far rows masked, KL to the pre-squash behaviour, beta on the actor
    loss, temperature untouched); warm-up with the agent's policy (random actions have no behaviour record)."""
    return ExperimentConfig(preset="sac_refer", agent_kind="sac_refer", agent=SACReFERConfig(),
                            schedule=ScheduleConfig(warmup_policy="agent"),
                            replay=ReplayConfig.of("refer", capacity=REFER_CAPACITY))


def vracer() -> ExperimentConfig:
    """V-RACER (Novati & Koumoutsakos 2019) without ReF-ER: one network for V and a Gaussian policy, Retrace
    targets, off-policy PG; uniform replay of 2^18 rows, batch 256, one gradient step per env step; warm-up with
    the agent's own policy (rho needs every row's behaviour record; random actions have none)."""
    return ExperimentConfig(preset="vracer", agent_kind="vracer", agent=VRACERConfig(),
                            schedule=ScheduleConfig(batch_size=256, utd_ratio=1, warmup_policy="agent"),
                            replay=ReplayConfig.of("uniform", capacity=REFER_CAPACITY))


def vracer_refer() -> ExperimentConfig:
    """V-RACER with ReF-ER, the paper's own pairing (its Fig. 4): C 4, D 0.1, A 5e-7, both rules; the learning
    rate anneals with the sampler's lr_scale."""
    return replace(vracer(), preset="vracer_refer", replay=ReplayConfig.of("refer", capacity=REFER_CAPACITY))


# -- goal-conditioned tasks with Hindsight Experience Replay (issue 30; docs/her.md) -------------------------
# replay her: the envs keep their goal dicts, the replay (replay.her.inner, uniform) is relabeled by a
# HindsightSampler (k = 4 relabeled goals per real one, "future": the paper's best, Sec. 4.5) with the task's
# compute_reward. The agents read observation + desired_goal (agent.obs_keys). Success = info["is_success"] at an
# episode's last step (Fetch, as the paper and SB3 count it; PointMaze: --set env.success_key=success). No HER at the
# same settings: --set replay.her.k=0. HER over PER: --set replay.her.inner.name=per.
# sac_her's SAC settings are the ones bench/sb3_her.py hands Stable-Baselines3's SAC + HerReplayBuffer (the
# her-fetch comparison): change them here and the SB3 side follows.
HER_OBS_KEYS = ("desired_goal", "observation")
HER_GAMMA = 0.98  # the HER paper, App. A ("discount factor of 0.98 for all transitions")
HER_ENV = EnvConfig(success_key="is_success", success_at="last")
HER_RUN = RunConfig(eval_every_env_steps=1000, eval_episodes=10)  # Fetch episodes are 50 steps
HER_REPLAY = ReplayConfig.of("her", capacity=1_000_000, k=4, strategy="future")  # over uniform replay


def sac_her() -> ExperimentConfig:
    """SAC + HER (k = 4, future) on goal-conditioned tasks (FetchReach-v4, FetchPush-v4; needs mujoco 3.3.0).
    Each value with its source (checked: OpenAI baselines her/experiment/config.py DEFAULT_PARAMS; the RL Zoo's
    hyperparams/sac.yml FetchReach entry, SB3's SAC + HerReplayBuffer; the HER paper's App. A as cited by ddpg_her,
    not re-read here): discount 0.98 (the HER paper; the Zoo's entry: 0.95); Adam 1e-3 for actor, critic and
    temperature (the paper and baselines' Q_lr / pi_lr; the Zoo's learning_rate 1e-3); batch 256 (baselines'
    batch_size per worker, the Zoo's entry; the paper: 128); a 10^6-row buffer (all three); k = 4 future (all
    three); 1000 random steps, then 1 gradient step per env step (the Zoo's learning_starts and train_freq). relive's
    own choices, in no source: Polyak tau 0.05 per gradient step (the Zoo's SAC FetchReach entry keeps SB3's 0.005;
    0.05 is the Zoo's TQC entries for FetchPush / Slide / PickAndPlace), 2x256 networks (the Zoo's entry: 2x64;
    baselines: 3x256), no observation normalisation (the Zoo's entry normalizes; baselines normalizes and clips to
    5). SAC's twin critics and learned temperature (the Zoo's ent_coef 'auto'). Success: info["is_success"] at the
    last step. Without HER: --set replay.her.k=0."""
    return ExperimentConfig(preset="sac_her", agent_kind="sac",
                            agent=SACConfig(gamma=HER_GAMMA, tau=0.05, actor_lr=1e-3, critic_lr=1e-3, temp_lr=1e-3,
                                            obs_keys=HER_OBS_KEYS),
                            env=HER_ENV, run=HER_RUN, replay=HER_REPLAY,
                            schedule=ScheduleConfig(batch_size=256, num_warmup_env_steps=1000))


HER_CYCLE_ENV_STEPS, HER_CYCLE_GRAD_STEPS = 100, 40  # baselines: a cycle = rollout_batch_size 2 episodes of T = 50
# steps, then n_batches 40 updates (her/experiment/train.py: the target update after them)

# ddpg_her is the authors' code, OpenAI baselines' HER (checked for issue 46 item 3: her/experiment/config.py
# DEFAULT_PARAMS at 152971d, her/ddpg.py and her/normalizer.py), on one worker, value by value:
#   layers 3, hidden 256                 -> agent.hidden = (256, 256, 256)
#   Q_lr 0.001, pi_lr 0.001 (Adam)       -> agent.critic_lr = agent.actor_lr = 1e-3
#   batch_size 256 (per MPI worker)      -> schedule.batch_size = 256
#   buffer_size 1e6                      -> replay capacity 10^6
#   polyak 0.95 (once per cycle)         -> agent.tau = 1 - 0.95^(1/40) per gradient step: the same decay per cycle
#   n_batches 40, rollout_batch_size 2   -> cycles of 100 env steps (2 x T = 50) then 40 gradient steps
#   gamma = 1 - 1/T (prepare_params)     -> 0.98 for T = 50 (Fetch)
#   clip_return 1/(1-gamma), clip_pos_returns True (configure_ddpg) -> agent.target_range = (-1/(1-gamma), 0)
#   action_l2 1.0 (on pi / max_u)        -> agent.action_l2 = 1.0
#   noise_eps 0.2 (std in units of max_u) -> agent.sigma = 0.2 (half-widths: max_u is the box's half-width)
#   random_eps 0.3                       -> agent.random_eps = 0.3
#   norm_eps 0.01, norm_clip 5, clip_obs 200 -> agent.obs_norm with obs_norm_eps 0.01, obs_norm_clip 5, obs_clip 200
#   relative_goals False                 -> the networks read the goal as it is (agent.obs_keys)
#   replay_strategy future, replay_k 4   -> replay her, k = 4, future
#   test_with_polyak False               -> evaluation with the online actor (relive's way)
#   n_test_rollouts 10                   -> run.eval_episodes 10
# What differs: the HER paper ran 8 workers (App. A, "8 threads", as cited here before, not re-read) and Plappert et
# al. 2018 19 MPI processes x 2 trajectories (the code's her/README.md, "Reproducing results"), each worker with
# rollout_batch_size 2 episodes, the gradients of 8 (19) x 256 rows averaged (MpiAdam) and the normalizer's sums
# synchronized over the workers; here one worker, one env, batches of 256: 1/8 (1/19) of the data per cycle and
# per update. (The README: FetchReach-v1 is solved in < 5k steps with `baselines.run --alg=her`, not checked.) Its
# n_cycles 50 per epoch (10 for FetchReach-v1, DEFAULT_ENV_PARAMS) and its number of epochs only set the budget:
# here --online-steps. Its normalizer sees HER-relabeled goals (store_episode draws the new episodes' transitions
# through the HER sampler), relive's the collected rows (agent.obs_norm in relive.agents.ddpg).
# The HER paper's App. A (Andrychowicz et al. 2017; values as cited here before, not re-read for this change)
# differs from the code: 3 x 64 networks, batch 128, Gaussian noise of 5% of the action range, 20% random actions.


def ddpg_her() -> ExperimentConfig:
    """DDPG + HER at the authors' code's settings (OpenAI baselines her/experiment/config.py DEFAULT_PARAMS; each
    value with its name in the comment above this function), one worker: 3x256 networks, Adam 1e-3, batch 256,
    buffer 10^6, gamma 0.98 (1 - 1/T), critic targets clipped to [-1/(1-gamma), 0], action L2 1, Gaussian noise of
    std 0.2 x max_u, 30% uniformly random actions, inputs (observation and desired goal) normalized by running
    mean / std (eps 0.01, clipped to 5; raw inputs clipped to 200), cycles of 2 episodes (100 env steps) then 40
    gradient steps, the target decay 0.95 once per cycle as tau = 1 - 0.95^(1/40) per step, k = 4 future,
    evaluation with the online actor. Not as the code: 8 MPI workers x 2 rollouts (gradients and statistics
    averaged over 8 x 256 rows; here one worker, batch 256); the statistics from the collected rows (the code's
    include HER-relabeled goals); the budget in env steps (set --online-steps). The HER paper's App. A setting
    (3x64, batch 128, 5% noise, 20% random): --set agent.hidden=[64,64,64] --batch-size 128 --set agent.sigma=0.1
    --set agent.random_eps=0.2. TD3's target smoothing: --set agent.target_noise=0.2."""
    return ExperimentConfig(
        preset="ddpg_her", agent_kind="ddpg",
        agent=DDPGConfig(hidden=(256, 256, 256), actor_lr=1e-3, critic_lr=1e-3, gamma=HER_GAMMA,
                         tau=1 - 0.95 ** (1 / HER_CYCLE_GRAD_STEPS), sigma=0.2, random_eps=0.3, action_l2=1.0,
                         target_range=(-1 / (1 - HER_GAMMA), 0.0), obs_norm=True, obs_norm_eps=0.01,
                         obs_norm_clip=5.0, obs_clip=200.0, obs_keys=HER_OBS_KEYS),
        env=HER_ENV, run=HER_RUN, replay=HER_REPLAY,
        schedule=ScheduleConfig(batch_size=256, env_steps_per_chunk=HER_CYCLE_ENV_STEPS,
                                grad_steps_per_chunk=HER_CYCLE_GRAD_STEPS, num_warmup_env_steps=0,
                                warmup_policy="agent"))


def hil_rlpd() -> ExperimentConfig:
    """HIL-SERL (Luo et al. 2024): RLPD whose online phase has an intervener; intervened stretches are kept on the
    ring and in a never-evicted demonstration segment (100k rows of room), and every batch draws half from the
    demonstrations (dataset + interventions) and half from the online rows. The intervener: ``scripted`` with a
    stand-in expert (``zero``); pick yours: ``--set intervention.expert=NAME`` (simulation) or
    ``--set intervention.kind=device`` (a person at a gamepad). docs/hil.md."""
    cfg = rlpd()
    return replace(cfg, preset="hil_rlpd", intervention=InterventionConfig(kind="scripted", expert="zero",
                                                                           demo_capacity=100_000))


# HIL-SERL's agent as the authors' code runs it: rail-berkeley/hil-serl at 5d02aed (2025-10-22), read for issue 46
# item 4. The file:line of each value is in hil_serl's docstring; HIL_SERL_* are the values relive expresses.
HIL_SERL_CRITIC_STEPS_PER_ACTOR_STEP = 2  # examples/experiments/config.py l.10: cta_ratio = 2 (train_rlpd.py l.317-338)
HIL_SERL_TRAINING_STARTS = 100  # examples/experiments/config.py l.17: training_starts = 100 (train_rlpd.py l.278)
HIL_SERL_CAPACITY = 200_000  # examples/experiments/config.py l.14: replay_buffer_capacity (each buffer)


def hil_serl() -> ExperimentConfig:
    """HIL-SERL (Luo et al. 2024) at the authors' code's settings (rail-berkeley/hil-serl at 5d02aed; state
    observations: the code's pixel encoders do not apply): SAC with 2 LayerNorm critics, the TD target on the min of
    both (serl_launcher/utils/launcher.py l.86-87: critic_ensemble_size 2, critic_subsample_size None;
    agents/continuous/sac.py l.164-176), the actor on their mean (sac.py l.224), no entropy in the critic target
    (launcher.py l.85: backup_entropy False; sac.py l.185-187), initial temperature 0.01 (launcher.py l.83), target
    entropy -|A|/2 (sac.py l.414-415: target_entropy None), gamma 0.97 (examples/experiments/config.py l.11,
    DefaultTrainingConfig; the tasks' configs set 0.97-0.985), tau 0.005 (sac.py l.369), Adam 3e-4 for actor, critic and
    temperature (sac.py l.358-366; launcher.py passes none), widths 256x256 (launcher.py l.73-82), Xavier-uniform init
    (common/common.py l.15, default_init), one actor + temperature step per 2 critic steps (config.py l.10: cta_ratio 2;
    train_rlpd.py l.317-338: cta_ratio - 1 critic-only steps, then a critic + actor + temperature step:
    ``agent.actor_every = 2``), batch 256 (config.py l.9) drawn half from the demonstrations and interventions, half
    from the online rows (train_rlpd.py l.288-302, 50/50; the interventions go to both buffers, l.198-202: relive's
    demonstration segment), no random actions (config.py l.16: random_steps 0), the first 100 online steps with the
    initial policy before any update (config.py l.17, training_starts 100; train_rlpd.py l.278: warm-up with
    ``warmup_policy = "agent"``), buffers of 200,000 rows (config.py l.14). The intervener is ``scripted`` with the
    stand-in expert ``zero`` as ``hil_rlpd``'s; a person watching the task: ``--set intervention.kind=state``
    (docs/hil.md).

    What relive cannot express: the code's learner runs asynchronously beside the actor (agentlace), so its updates
    per env step are whatever the machines give; relive runs one learner iteration (2 critic steps, 1 actor step) per
    env step (``schedule.utd_ratio = 2``: relive's choice). Its MLPs use tanh, and the actor has LayerNorm too
    (launcher.py l.73-82; relive: ReLU, no actor LayerNorm). Its actor's std is exp(linear) clipped to [1e-5, 5]
    (launcher.py l.67-72; relive: log-std clamped to [-20, 2]). Its temperature is a softplus-parameterized Lagrange
    multiplier (networks/lagrange.py l.81-83; relive learns log alpha). Its replay capacity is per buffer (online,
    demonstrations); relive's ``replay.capacity`` counts every row -- the dataset's, the demonstration segment
    (``intervention.demo_capacity``) and the online ring -- so it is set to both buffers' room (2 x 200k), the
    demonstration segment to one."""
    cfg = hil_rlpd()
    agent = SACConfig(num_qs=2, num_min_qs=2, critic_layer_norm=True, actor_q_reduce="mean", init="xavier",
                      gamma=0.97, tau=0.005, actor_lr=3e-4, critic_lr=3e-4, temp_lr=3e-4, init_temperature=0.01,
                      target_entropy_scale=0.5, backup_entropy=False, hidden=(256, 256),
                      actor_every=HIL_SERL_CRITIC_STEPS_PER_ACTOR_STEP)
    schedule = ScheduleConfig(utd_ratio=HIL_SERL_CRITIC_STEPS_PER_ACTOR_STEP, batch_size=256,
                              num_warmup_env_steps=HIL_SERL_TRAINING_STARTS, warmup_policy="agent")
    return replace(cfg, preset="hil_serl", agent=agent, schedule=schedule,
                   replay=replace(cfg.replay, capacity=2 * HIL_SERL_CAPACITY),  # (online ring + demonstrations)
                   intervention=replace(cfg.intervention, demo_capacity=HIL_SERL_CAPACITY))


WSRL_WARMUP_ENV_STEPS = 5000  # WSRL (Zhou et al., ICLR 2025): K = 5,000 warm-up steps with the pre-trained policy
# The authors' code, zhouzypaul/wsrl at 891ee35 (read for issue 46 item 5): experiments/configs/wsrl_config.py l.9-13
# and ensemble_config.py l.6-9 (the pre-training's --use_redq): critic_ensemble_size 10, critic_subsample_size 2,
# use_layer_norm on the critic (and the policy); wsrl/agents/sac.py l.235-247: the TD target is the min over a random
# subset of 2 target members, l.302: the actor's Q is the min over all members; experiments/configs/sac_config.py
# l.6-13, 37-51: gamma 0.99, no entropy in the backup, target entropy -|A| (sac.py l.526-527), tau 5e-3, initial
# temperature 1.0, lrs actor 1e-4 / critic 3e-4 / temperature 1e-4, widths 256x256.
WSRL_ENSEMBLE: dict[str, Any] = {"num_qs": 10, "num_min_qs": 2, "critic_layer_norm": True, "actor_q_reduce": "min"}


def wsrl_pretrain() -> ExperimentConfig:
    """The pre-training WSRL starts from: Cal-QL with WSRL's critic ensemble (the authors' README: pre-train with
    ``--use_redq``; zhouzypaul/wsrl ensemble_config.py l.6-9: 10 LayerNorm critics, target on the min of a random
    subset of 2), offline only (``--online-steps 0``), the ``calql`` preset otherwise. A finished run is what
    ``wsrl`` fine-tunes (``--init-from``); the networks must match, so pre-train with this preset, not ``calql``."""
    cfg = calql()
    return replace(cfg, preset="wsrl_pretrain", agent=replace(cfg.agent, **WSRL_ENSEMBLE),
                   schedule=replace(cfg.schedule, num_online_env_steps=0))


def wsrl() -> ExperimentConfig:
    """WSRL (Zhou et al., ICLR 2025, arXiv 2412.07762) as the authors' code runs it (zhouzypaul/wsrl at 891ee35;
    experiments/scripts/locomotion/launch_wsrl_finetune.sh l.5-15: --agent sac --utd 4 --warmup_steps 5000): fine-tune
    a pre-trained agent (``--init-from`` a finished ``wsrl_pretrain`` run) without its offline data (finetune.py
    l.41-44: offline_data_ratio 0; no ``--dataset``): 5,000 warm-up steps with the pre-trained policy
    (``warmup_policy = "agent"``, no updates: finetune.py l.337-343) seed the online buffer, then SAC (no conservative
    penalty: ``cql_alpha = 0``, no calibration, no max backup) from uniform replay over the online rows, UTD 4
    (``schedule.utd_ratio``) with one actor / temperature step per env step (sac.py l.624-672, update_high_utd:
    ``agent.actor_per_env_step``), 10 LayerNorm critics whose target takes the min of a random subset of 2
    (wsrl_config.py l.9-13) and an actor on the min of all 10 (sac.py l.302). Differences from the code: batch 256
    for every critic step and the actor's (the code draws 1,024 rows, splits them into 4 critic minibatches of 256
    and steps the actor on all 1,024); no LayerNorm in the actor and the default last-layer init (the code: policy
    LayerNorm, kernel_scale_final 1e-2) -- relive's actor has neither option."""
    schedule = ScheduleConfig(num_offline_grad_steps=0, num_warmup_env_steps=WSRL_WARMUP_ENV_STEPS,
                              warmup_policy="agent", utd_ratio=4)
    agent = CalQLConfig(cql_alpha=0.0, calibrate=False, max_target_backup=False, actor_per_env_step=True,
                        **WSRL_ENSEMBLE)
    return ExperimentConfig(preset="wsrl", agent_kind="calql", agent=agent, schedule=schedule,
                            replay=ReplayConfig.of("uniform"))


PRESETS: dict[str, Callable[[], ExperimentConfig]] = {
    "sac": sac, "rlpd": rlpd, "calql": calql, "calql_arb": calql_arb, "residual_sac": residual_sac, "ddqn": ddqn,
    "ddqn_per": ddqn_per, "ddpg": ddpg, "ddpg_per": ddpg_per, "ddpg_refer": ddpg_refer, "ddpg_refer1": ddpg_refer1,
    "ddpg_refer2": ddpg_refer2, "ddpg_paper": ddpg_paper, "ddpg_per_paper": ddpg_per_paper,
    "ddpg_refer_paper": ddpg_refer_paper, "ddpg_refer1_paper": ddpg_refer1_paper,
    "ddpg_refer2_paper": ddpg_refer2_paper, "sac_refer": sac_refer, "vracer": vracer, "vracer_refer": vracer_refer,
    "sac_her": sac_her, "ddpg_her": ddpg_her, "hil_rlpd": hil_rlpd, "hil_serl": hil_serl, "wsrl": wsrl, "td3": td3,
    "ddqn_atari": ddqn_atari, "ddqn_atari100k": ddqn_atari100k, "ddqn_minatar": ddqn_minatar,
    "wsrl_pretrain": wsrl_pretrain,
}


def get_preset(name: str) -> ExperimentConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None
