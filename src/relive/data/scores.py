"""D4RL normalized scores: 100 * (R - R_random) / (R_expert - R_random)."""

from __future__ import annotations

import math

# D4RL's published reference returns (d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE) for the -v2 MuJoCo
# tasks. They were measured on the old mujoco-py environments: the v5 tasks here differ slightly, which is
# why relive reports its own normalization (its own random and expert policies) next to these.
D4RL_REFERENCE = {
    "hopper": (-20.272305, 3234.3),
    "halfcheetah": (-280.178953, 12135.0),
    "walker2d": (1.629008, 4592.3),
}


def normalized_score(ret: float, ref_min: float | None, ref_max: float | None) -> float:
    """100 * (R - R_random) / (R_expert - R_random); nan without reference returns."""
    if ref_min is None or ref_max is None or (isinstance(ref_min, float) and math.isnan(ref_min)) \
            or (isinstance(ref_max, float) and math.isnan(ref_max)):
        return float("nan")
    if ref_max == ref_min:
        raise ValueError(f"reference returns must differ, got {ref_min} and {ref_max}")
    return 100.0 * (ret - ref_min) / (ref_max - ref_min)


def d4rl_reference(env_id: str) -> tuple[float, float] | None:
    """D4RL's (random, expert) returns for a task family, e.g. 'Hopper-v5' -> hopper's; None if unknown."""
    family = env_id.split("-")[0].lower()
    return D4RL_REFERENCE.get(family)
