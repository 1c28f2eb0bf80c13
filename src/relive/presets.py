"""Presets are Python functions returning an ExperimentConfig: a few-line delta each, type-checked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from relive.agents.cal_ql import CalQLConfig
from relive.agents.ddqn import DDQNConfig
from relive.agents.residual_sac import ResidualSACConfig
from relive.agents.sac import RLPD_OFFLINE_FRACTION, SACConfig
from relive.config import ExperimentConfig, ReplayConfig, ScheduleConfig


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
    base's successful episodes (--dataset), then 50/50 symmetric replay; the agent's own base-only warm-up (1000
    stored steps, with updates; the trainer's random warm-up is off) and probing (H_probe = 50); batch 256 (PLD
    Table 5)."""
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


PRESETS: dict[str, Callable[[], ExperimentConfig]] = {
    "sac": sac, "rlpd": rlpd, "calql": calql, "calql_arb": calql_arb, "residual_sac": residual_sac, "ddqn": ddqn,
    "ddqn_per": ddqn_per,
}


def get_preset(name: str) -> ExperimentConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None
