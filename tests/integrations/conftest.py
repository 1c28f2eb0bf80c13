"""Fixtures shared by the integration tests."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture
def torchrl_quiet(monkeypatch):
    """TorchRL's tests: one torch thread, a fixed torch seed, its warnings off (RL_WARNINGS and UserWarning)."""
    import torch

    monkeypatch.setenv("RL_WARNINGS", "False")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield
    torch.set_num_threads(n)
