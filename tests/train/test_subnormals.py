"""A run flushes subnormal floats to zero while it trains (relive.train.trainer.train: a long run's Adam moments decay
into subnormals, whose arithmetic costs the CPU ~100x) and gives the thread its mode back afterwards, also when the
build fails (Hypothesis, for one, refuses to run where subnormals are flushed)."""

import pytest
import torch

import relive.train
from relive.cli import build_parser
from relive.train.cli import config_from_args
from relive.train.trainer import flushes_subnormals, train


def cfg_for(run_dir, *args):
    return config_from_args(build_parser().parse_args(
        ["train", "ddqn", "--env", "CartPole-v1", "--warmup", "20", "--online-steps", "60", "--eval-every", "60",
         "--eval-episodes", "1", "--set", "agent.hidden=[8,8]", "--batch-size", "8", "--no-progress",
         "--run-dir", str(run_dir), *args]))


class Seen(relive.train.Callback):
    def __init__(self):
        self.modes = set()

    def on_step(self, env_steps, grad_steps):
        tiny = torch.tensor([1e-40], dtype=torch.float32)
        self.modes.add(((tiny * 1.0).item() == 0.0, flushes_subnormals()))


def test_a_run_flushes_subnormals_and_restores_the_mode(tmp_path):
    assert not flushes_subnormals()  # (torch's default: the test starts where a user's process starts)
    seen = Seen()
    train(cfg_for(tmp_path / "r"), callbacks=[seen])
    assert seen.modes == {(True, True)}
    assert not flushes_subnormals()
    assert torch.tensor([1e-40]).mul(1.0).item() > 0.0


def test_a_failed_build_restores_the_mode(tmp_path):
    with pytest.raises(ValueError, match="needs a dataset"):
        train(cfg_for(tmp_path / "r", "--offline-steps", "10"))
    assert not flushes_subnormals()


def test_a_caller_that_flushes_keeps_flushing(tmp_path):
    torch.set_flush_denormal(True)
    try:
        train(cfg_for(tmp_path / "r"))
        assert flushes_subnormals()
    finally:
        torch.set_flush_denormal(False)
