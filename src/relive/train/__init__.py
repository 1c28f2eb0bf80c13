"""Training: rollouts (one env, vector envs, Ray collectors), the offline -> online trainer, evaluation, run logging,
checkpoints, seed batching, D4RL-style dataset generation, the train / data command lines (envs: ``relive.envs``)."""
