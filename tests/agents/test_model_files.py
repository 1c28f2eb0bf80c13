"""Model files relive reads besides base policies: `--init-from` agent directories of another agent kind, network
size or environment are one error naming the directory and the tensor (no KeyError / RuntimeError traceback), read
before the run directory is written; module states are checked whole before anything is copied."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relive.agents import networks as nets
from relive.agents.sac import SAC, SACConfig
from relive.replay.checkpoint import save_tree


def test_init_from_an_agent_that_does_not_fit_is_one_clear_error(tmp_path, capsys):
    from relive.agents.ddqn import DDQN, DDQNConfig
    from relive.cli import main

    small = SAC(3, 1, [-2.0], [2.0], SACConfig(hidden=(16, 16)), seed=0)  # Pendulum's sizes, other widths
    save_tree(tmp_path / "small" / "agent_final", small.state_dict(), kind="agent")
    ddqn = DDQN(4, 2, DDQNConfig(hidden=(8,)), seed=0)
    save_tree(tmp_path / "ddqn" / "agent_final", ddqn.state_dict(), kind="agent")
    run = tmp_path / "run"
    for source, expect in (("small", "TanhGaussianActor tensor trunk.0."), ("ddqn", "KeyError: 'actor'")):
        assert main(["train", "sac", "--env", "Pendulum-v1", "--init-from", str(tmp_path / source), "--run-dir",
                     str(run), "--online-steps", "10", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("relive: error: run.init_from:") and str(tmp_path / source) in err, err
        assert expect in err and len(err.splitlines()) == 1, err
        assert not run.exists()


def test_a_module_state_of_another_architecture_is_refused_before_anything_is_copied():
    net = nets.mlp(3, (4,), 2)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    good = nets.module_state(nets.mlp(3, (4,), 2))
    for bad, match in (({**good, "2__weight": np.zeros((2, 5), np.float32)}, r"2.weight has shape \(2, 5\)"),
                       ({k: v for k, v in good.items() if k != "2__bias"}, r"missing \['2.bias'\]"),
                       ({**good, "9__weight": np.zeros(1)}, r"unexpected \['9.weight'\]"),
                       ({**good, "0__bias": np.array(["a"] * 4)}, "not numbers"),
                       ([1, 2], "must map tensor names")):
        with pytest.raises(ValueError, match=match):
            nets.load_module_state(net, bad)
        for k, v in net.state_dict().items():
            assert torch.equal(v, before[k])
    nets.load_module_state(net, good)
    assert torch.equal(net.state_dict()["0.weight"], torch.as_tensor(good["0__weight"]))


def test_an_optimizer_state_of_another_architecture_is_refused_before_anything_is_set():
    net = nets.mlp(3, (4,), 2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    good = nets.optimizer_state(opt)
    other = nets.mlp(3, (5,), 2)
    other_opt = torch.optim.Adam(other.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match=r"state 'exp_avg' of parameter 0 has shape \(4, 3\), the parameter has "
                                         r"\(5, 3\)"):
        nets.load_optimizer_state(other_opt, good)
    assert other_opt.state_dict()["state"] == {}
    with pytest.raises(ValueError, match="Adam state is malformed"):
        nets.load_optimizer_state(opt, {"state": {}})
    nets.load_optimizer_state(opt, good)


def test_base_policy_api_inputs_get_one_clear_error(tmp_path):
    from relive.agents.base_policy import load_base_policy
    from relive.agents.bc import BCConfig, new_policy, save_bc_policy
    from relive.envs import EnvSpec

    spec = EnvSpec("Toy-v0", (4,), False, (2,), 0, -np.ones(2, np.float32), np.ones(2, np.float32), 20)
    save_bc_policy(tmp_path / "bc", new_policy(4, 2, [-1, -1], [1, 1], BCConfig(hidden=(8,)), 0), {})
    with pytest.raises(ValueError, match="device 'bogus' is not usable here"):
        load_base_policy(tmp_path / "bc", spec, device="bogus")
    with pytest.raises(ValueError, match="must be a str or a path, got NoneType"):
        load_base_policy(None, spec)
    agent = SAC(4, 2, [-1.0, -1.0], [1.0, 1.0], SACConfig(hidden=(8, 8)), seed=0)
    save_tree(tmp_path / "run" / "agent_final", agent.state_dict(), kind="agent")
    for text in ("{garbage", '{"agent": 5}', "[1]"):
        (tmp_path / "run" / "config.json").write_text(text)
        with pytest.raises(ValueError, match=r"the run .*config.json is not a relive configuration"):
            load_base_policy(tmp_path / "run", spec)
