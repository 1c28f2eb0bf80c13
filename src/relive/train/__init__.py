"""Training: environments, rollouts, the offline -> online trainer, evaluation, run logging, checkpoints."""
