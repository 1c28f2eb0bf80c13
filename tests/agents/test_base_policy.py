"""Loading frozen base policies of every kind: BC directories, SAC run / agent directories, TorchScript and
safetensors MLPs; frozen parameters; shape checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from relive.agents.base_policy import BasePolicy, UntrustedCodeError, load_base_policy, save_mlp_safetensors
from relive.agents.bc import BCConfig, new_policy, save_bc_policy
from relive.agents.sac import SAC, SACConfig
from relive.envs import EnvSpec
from relive.replay.checkpoint import save_tree

OBS, ACT = 4, 2


pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)
LOW, HIGH = np.array([-1.0, -2.0], np.float32), np.array([1.0, 2.0], np.float32)


def spec(obs=OBS, act=ACT) -> EnvSpec:
    return EnvSpec("Toy-v0", (obs,), False, (act,), 0, -np.ones(act, np.float32), np.ones(act, np.float32), 20)


def obs_batch(n=16, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, OBS)).astype(np.float32)


def bc_policy(seed=0):
    return new_policy(OBS, ACT, LOW, HIGH, BCConfig(hidden=(16, 16)), seed)


def expected(module, obs):
    with torch.no_grad():
        return module(torch.as_tensor(obs)).numpy()


def test_bc_directory_loads_and_matches(tmp_path):
    policy = bc_policy()
    save_bc_policy(tmp_path / "bc", policy, {"note": "test"})
    obs = obs_batch()
    for path in (tmp_path / "bc", tmp_path / "bc" / "policy"):
        base = load_base_policy(path, spec())
        np.testing.assert_array_equal(base(obs), expected(policy, obs))
        assert base.action_dim == ACT and base(obs).dtype == np.float32
        assert "behaviour-cloning" in base.describe() and str(path) in base.describe()
    assert base(obs[0]).shape == (ACT,)  # a single observation gives a single action


def test_base_policy_is_frozen_and_bit_identical_after_use(tmp_path):
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    base = load_base_policy(tmp_path / "bc", spec())
    before = {k: v.clone() for k, v in base.module.state_dict().items()}
    digest = base.digest()
    assert not base.module.training
    assert all(not p.requires_grad for p in base.module.parameters())
    for i in range(5):
        base(obs_batch(seed=i))
        out = base.torch(torch.as_tensor(obs_batch(seed=i), dtype=torch.float32))
        assert not out.requires_grad
    # an optimizer on anything downstream cannot reach the base: a loss through base.torch has no graph
    x = torch.tensor(obs_batch(), requires_grad=True)
    assert base.torch(x).grad_fn is None
    assert base.digest() == digest
    for k, v in base.module.state_dict().items():
        assert torch.equal(v, before[k]), k


def _sac(hidden=(32, 32), seed=3):
    return SAC(OBS, ACT, LOW, HIGH, SACConfig(hidden=hidden), seed=seed)


def _write_run(tmp_path, agent, hidden=(32, 32)):
    from relive.config import override, save_config
    from relive.presets import get_preset

    run = tmp_path / "run"
    save_tree(run / "agent_final", agent.state_dict(), kind="agent")
    cfg = override(get_preset("sac"), [f"agent.hidden={list(hidden)}"])
    save_config(cfg, run / "config.json")
    return run


def test_sac_run_and_agent_directories_give_the_deterministic_mean_action(tmp_path):
    agent = _sac()
    run = _write_run(tmp_path, agent)
    obs = obs_batch()
    want = agent.act(obs, explore=False)  # center + scale * tanh(mu(s)), clipped to the box
    for path in (run, run / "agent_final"):
        base = load_base_policy(path, spec())
        np.testing.assert_allclose(base(obs), want, rtol=0, atol=1e-6)
        assert "SAC actor" in base.describe()
    # an agent directory without a run around it: hidden sizes read off the weights
    save_tree(tmp_path / "lone_agent", agent.state_dict(), kind="agent")
    np.testing.assert_allclose(load_base_policy(tmp_path / "lone_agent", spec())(obs), want, atol=1e-6)


def test_ddpg_agent_directory_gives_its_deterministic_actor(tmp_path):
    from relive.agents.ddpg import DDPG, DDPGConfig

    agent = DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(hidden=(16, 8)), seed=2)
    save_tree(tmp_path / "ddpg_agent", agent.state_dict(), kind="agent")
    base = load_base_policy(tmp_path / "ddpg_agent", spec())
    obs = obs_batch()
    np.testing.assert_allclose(base(obs), expected(agent.actor, obs), atol=1e-6)
    assert "DDPG" in base.describe()


def test_sac_run_whose_config_disagrees_with_the_weights_is_rejected(tmp_path):
    run = _write_run(tmp_path, _sac(hidden=(32, 32)), hidden=(64, 64))
    with pytest.raises(ValueError, match=r"hidden=\(64, 64\).*\(32, 32\)"):
        load_base_policy(run, spec())


class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(OBS, ACT)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(obs))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_module_is_refused_without_trust_and_loads_with_it(tmp_path):
    """TorchScript carries a program: without trusted=True it is refused (naming the file, the format and the
    opt-in) before torch.jit.load sees it; with it, it loads and acts like the module."""
    torch.manual_seed(0)
    m = Lin()
    path = tmp_path / "policy.pt"
    torch.jit.save(torch.jit.script(m), str(path))
    for suffix in (".pt", ".pth", ".ts", ".jit"):
        other = path.with_suffix(suffix)
        if other != path:
            other.write_bytes(path.read_bytes())
        with pytest.raises(UntrustedCodeError, match=rf"{other.name} is a TorchScript file.*--trust-code.*trusted="):
            load_base_policy(other, spec())
    base = load_base_policy(path, spec(), trusted=True)
    obs = obs_batch()
    np.testing.assert_allclose(base(obs), expected(m, obs), atol=1e-6)
    assert base.kind == "TorchScript"
    d = base.digest()
    base(obs)
    assert base.digest() == d


def test_safetensors_mlp_loads(tmp_path):
    pytest.importorskip("safetensors")
    policy = bc_policy(seed=5)
    with torch.no_grad():
        policy.obs_mean.fill_(0.5)
    path = save_mlp_safetensors(policy, tmp_path / "mlp")
    obs = obs_batch()
    for p in (path, path.with_suffix(".json")):
        np.testing.assert_array_equal(load_base_policy(p, spec())(obs), expected(policy, obs))
    # the description must match the tensors
    arch = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps(arch | {"hidden": [8, 8]}))
    with pytest.raises(ValueError, match="shape"):
        load_base_policy(path, spec())
    path.with_suffix(".json").unlink()
    with pytest.raises(ValueError, match="JSON description"):
        load_base_policy(path, spec())


def test_wrong_action_shape_names_both_shapes(tmp_path):
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    with pytest.raises(ValueError, match=r"\(1, 2\).*expects \(1, 3\)"):
        load_base_policy(tmp_path / "bc", spec(act=3))


def test_wrong_observation_size_is_rejected(tmp_path):
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    with pytest.raises(ValueError, match=r"\(4,\).*\(5,\)"):
        load_base_policy(tmp_path / "bc", spec(obs=5))


def test_unknown_paths_and_discrete_specs_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_base_policy(tmp_path / "nothing", spec())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a run directory"):
        load_base_policy(tmp_path / "empty", spec())
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ValueError, match="TorchScript"):
        load_base_policy(tmp_path / "x.txt", spec())
    discrete = EnvSpec("CartPole-v1", (4,), True, (), 2, None, None, 500)
    with pytest.raises(ValueError, match="continuous"):
        load_base_policy(tmp_path / "x.txt", discrete)


def test_base_policy_rejects_wrong_observation_batches(tmp_path):
    base = BasePolicy(bc_policy(), OBS, ACT, "test", "memory")
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        base(np.zeros((3, 5), np.float32))


def test_exported_program_loads(tmp_path):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(OBS, 8), torch.nn.ReLU(), torch.nn.Linear(8, ACT), torch.nn.Tanh())
    batch = torch.export.Dim("batch", min=1)
    prog = torch.export.export(m, (torch.zeros(2, OBS),), dynamic_shapes=({0: batch},))
    torch.export.save(prog, str(tmp_path / "policy.pt2"))
    with pytest.raises(UntrustedCodeError, match=r"policy.pt2 is a torch.export program file.*--trust-code"):
        load_base_policy(tmp_path / "policy.pt2", spec())
    base = load_base_policy(tmp_path / "policy.pt2", spec(), trusted=True)
    obs = obs_batch()
    np.testing.assert_allclose(base(obs), expected(m, obs), atol=1e-6)


# -- files that can carry code: refused without the opt-in, and nothing in them runs ---------------------------------
def _malicious_pt2(tmp_path, marker):
    """A real torch.export archive whose first weight entry is marked ``use_pickle`` and holds a pickle that creates
    ``marker`` when unpickled (``torch.export.load`` reads such entries with ``torch.load(weights_only=False)``)."""
    import pickle
    import zipfile
    from pathlib import Path

    class CreateFile:  # unpickling it calls Path(marker).touch(): a stand-in for any code a pickle can run
        def __reduce__(self):
            return (Path.touch, (Path(marker),))

    m = torch.nn.Sequential(torch.nn.Linear(OBS, 8), torch.nn.ReLU(), torch.nn.Linear(8, ACT))
    torch.export.save(torch.export.export(m, (torch.zeros(2, OBS),)), str(tmp_path / "plain.pt2"))
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(tmp_path / "plain.pt2") as src, zipfile.ZipFile(evil, "w") as out:
        names = src.namelist()
        config_name = next(n for n in names if n.endswith("data/weights/model_weights_config.json"))
        config = json.loads(src.read(config_name))
        entry = next(iter(config["config"].values()))
        entry["use_pickle"] = True
        weight_name = config_name.rsplit("/", 1)[0] + "/" + entry["path_name"]
        for n in names:
            data = {config_name: json.dumps(config).encode(), weight_name: pickle.dumps(CreateFile())}.get(n)
            out.writestr(n, src.read(n) if data is None else data)
    return evil


def test_a_malicious_export_archive_is_refused_without_trust_and_nothing_runs(tmp_path):
    marker = tmp_path / "payload_ran"
    evil = _malicious_pt2(tmp_path, marker)
    with pytest.raises(UntrustedCodeError, match=r"evil.pt2 is a torch.export program file.*--trust-code"):
        load_base_policy(evil, spec())
    assert not marker.exists()
    # the archive is a real exploit: told to trust it, torch.export.load runs the payload (then fails on it)
    with pytest.raises(ValueError, match="not a torch.export program"):
        load_base_policy(evil, spec(), trusted=True)
    assert marker.exists()


def test_the_cli_refuses_code_formats_without_trust_code_and_writes_nothing(tmp_path, capsys):
    """`relive train residual_sac --base-policy X.pt2` and `relive pld collect --base X.pt2` stop with one line
    naming the file, the format and the flag; the payload never runs and no run directory / dataset is written."""
    from relive.cli import main

    marker = tmp_path / "payload_ran"
    evil = _malicious_pt2(tmp_path, marker)
    run = tmp_path / "run"
    assert main(["train", "residual_sac", "--env", "Pendulum-v1", "--base-policy", str(evil), "--run-dir", str(run),
                 "--online-steps", "10", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "evil.pt2 is a torch.export program file" in err and "--trust-code" in err and len(err.splitlines()) == 1
    assert main(["pld", "collect", "--base", str(evil), "--env", "Pendulum-v1", "--episodes", "1",
                 "--success-return", "0", "--out", str(tmp_path / "d.npz")]) == 2
    assert "--trust-code" in capsys.readouterr().err
    assert not marker.exists() and not run.exists() and not (tmp_path / "d.npz").exists()
    # a preset without a base policy has nothing to trust: the flag is refused, not silently ignored
    assert main(["train", "sac", "--env", "Pendulum-v1", "--trust-code", "--run-dir", str(run)]) == 2
    assert "--trust-code" in capsys.readouterr().err and not run.exists()


def test_trust_code_reaches_the_loader_and_a_resume_must_say_it_again(tmp_path):
    """--trust-code sets agent.trust_code (which from_spec passes to load_base_policy as trusted=); a run directory
    read back (open_run_dir, which a resume uses) has agent.trust_code = false whatever its config.json says, and
    `--resume ... --trust-code` sets it."""
    from relive.agents.run_dir import open_run_dir
    from relive.cli import build_parser
    from relive.config import save_config
    from relive.train.cli import config_from_args, resume_settings
    from relive.train.trainer import _resume_config

    parser = build_parser()
    args = parser.parse_args(["train", "residual_sac", "--base-policy", "p.pt2", "--trust-code"])
    cfg = config_from_args(args)
    assert cfg.agent.trust_code is True and cfg.agent.base_policy == "p.pt2"
    assert config_from_args(parser.parse_args(["train", "residual_sac"])).agent.trust_code is False
    save_config(cfg, tmp_path / "config.json")  # (an edited config.json: relive itself never writes it true)
    read = open_run_dir(tmp_path)
    assert read.config.agent.trust_code is False and "agent.trust_code = true is ignored" in read.notes[0]
    assert _resume_config(read.config, []).agent.trust_code is False
    again = resume_settings(parser.parse_args(["train", "--resume", "RUN", "--trust-code"]))
    assert "agent.trust_code=true" in again
    assert _resume_config(read.config, again).agent.trust_code is True


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_from_spec_passes_the_configs_trust_to_the_loader(tmp_path):
    from relive.agents.residual_sac import ResidualSAC, ResidualSACConfig

    torch.jit.save(torch.jit.script(Lin()), str(tmp_path / "p.pt"))
    cfg = ResidualSACConfig(hidden=(8, 8), base_policy=str(tmp_path / "p.pt"))
    with pytest.raises(UntrustedCodeError, match="p.pt is a TorchScript file"):
        ResidualSAC.from_spec(spec(), cfg, np.random.SeedSequence(0))
    agent = ResidualSAC.from_spec(spec(), ResidualSACConfig(hidden=(8, 8), base_policy=str(tmp_path / "p.pt"),
                                                            trust_code=True), np.random.SeedSequence(0))
    assert agent.base.kind == "TorchScript"


def test_the_code_free_formats_never_reach_torch_jit_or_torch_export(tmp_path, monkeypatch):
    """relive's own directories (and the safetensors MLP, where installed) load with torch.jit.load and
    torch.export.load made to fail: the default path does not touch a loader that can run code."""
    def forbidden(*a, **k):
        raise AssertionError("a code-running loader was called")

    monkeypatch.setattr(torch.jit, "load", forbidden)
    monkeypatch.setattr(torch.export, "load", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    paths = [tmp_path / "bc", _write_run(tmp_path, _sac())]
    try:
        import safetensors  # noqa: F401

        paths.append(save_mlp_safetensors(bc_policy(), tmp_path / "mlp"))
    except ImportError:
        pass
    for path in paths:
        assert load_base_policy(path, spec(), trusted=True)(obs_batch()).shape == (16, ACT)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_nan_weights_and_nan_actions_are_refused(tmp_path):
    policy = bc_policy()
    with torch.no_grad():
        policy.net[0].weight[0, 0] = float("nan")
    save_bc_policy(tmp_path / "bc", policy, {})
    with pytest.raises(ValueError, match=r"tensor net.0.weight holds NaN"):
        load_base_policy(tmp_path / "bc", spec())

    class NaNOut(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.full((obs.shape[0], 2), float("nan"))

    torch.jit.save(torch.jit.script(NaNOut()), str(tmp_path / "nan.pt"))
    with pytest.raises(ValueError, match="must return finite floating-point actions"):
        load_base_policy(tmp_path / "nan.pt", spec(), trusted=True)


def test_agent_directories_of_another_layout_get_one_clear_error(tmp_path):
    """An actor whose layers do not chain (edited weights) or whose layer names are not numbered: a ValueError
    naming the directory and the tensor, not a torch traceback."""
    state = _sac(hidden=(16, 16)).state_dict()
    actor = dict(state["actor"])
    actor["trunk__2__weight"] = np.zeros((16, 5), np.float32)  # layer 2 takes 5 inputs; layer 0 gives 16
    save_tree(tmp_path / "bad", state | {"actor": actor}, kind="agent")
    with pytest.raises(ValueError, match=r"bad: .*trunk.2.weight has shape \(16, 5\)"):
        load_base_policy(tmp_path / "bad", spec())
    renamed = {k.replace("__0__", "__x__"): v for k, v in state["actor"].items()}
    save_tree(tmp_path / "renamed", state | {"actor": renamed}, kind="agent")
    with pytest.raises(ValueError, match="renamed: unknown actor layout"):
        load_base_policy(tmp_path / "renamed", spec())


def test_a_safetensors_description_cannot_make_relive_allocate_more_than_the_file_holds(tmp_path, monkeypatch):
    """The JSON beside the tensors asks for far larger layers than the file holds (hidden = [10**9] would be 4 GB;
    10**6 here, so the test stays cheap on code that allocates first): refused from the tensor shapes in the file's
    header before any module is allocated (only a shape-only build on the meta device runs); invalid JSON is one
    error naming the file."""
    pytest.importorskip("safetensors")
    import relive.agents.bc as bc

    path = save_mlp_safetensors(bc_policy(), tmp_path / "mlp")
    desc = path.with_suffix(".json")
    arch = json.loads(desc.read_text())
    desc.write_text(json.dumps(arch | {"hidden": [10**6, 16]}))
    built = []
    real_init = bc.SquashedMLP.__init__
    monkeypatch.setattr(bc.SquashedMLP, "__init__",
                        lambda self, *a, **k: built.append(torch.empty(0).device.type) or real_init(self, *a, **k))
    with pytest.raises(ValueError, match=r"has shape \(16.*the MLP of mlp.json needs \(1000000"):
        load_base_policy(path, spec())
    assert built == ["meta"]  # only the shape-only build ran
    desc.write_text("{not json")
    with pytest.raises(ValueError, match="mlp.json is not valid JSON"):
        load_base_policy(path, spec())
    desc.write_text(json.dumps(arch | {"hidden": "16"}))
    with pytest.raises(ValueError, match="mlp.json"):
        load_base_policy(path, spec())


def test_the_grid_runner_says_trust_code_again_when_it_resumes_a_run(tmp_path):
    from relive.experiments.grid import RunSpec
    from relive.experiments.runner import train_command

    (tmp_path / "config.json").write_text("{}")
    trusted = RunSpec("g", "v", "residual_sac", "Pendulum-v1", 0, ("--base-policy", "p.pt2", "--trust-code"))
    assert train_command(trusted, tmp_path)[-3:] == ["--resume", str(tmp_path), "--trust-code"]
    plain = RunSpec("g", "v", "residual_sac", "Pendulum-v1", 0, ("--base-policy", "bc_dir"))
    assert train_command(plain, tmp_path)[-2:] == ["--resume", str(tmp_path)]
