"""relive: experience replay for off-policy and offline-to-online reinforcement learning."""

__version__ = "0.1.0"
