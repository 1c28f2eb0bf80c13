"""relive inside other RL libraries: a replay buffer for Stable-Baselines3's algorithms (:mod:`relive.integrations.sb3`,
extra ``sb3``) and one that speaks TorchRL's interface (:mod:`relive.integrations.torchrl`, extra ``torchrl``).

Each module imports its peer library at import time; nothing else in relive imports them (``import relive`` works
without either installed). They sit on the top floor, beside the CLIs (pyproject.toml, ``[tool.importlinter]``)."""
