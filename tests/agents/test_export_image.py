"""`relive export` of an image DDQN (issue 45): the Nature CNN over uint8 frame stacks and MinAtar's CNN over bool
planes, in every format, act as the agent's greedy ``act`` does on the frames as stored; the safetensors form is
rebuilt from numbers and checked sizes only."""

import json

import numpy as np
import pytest
import torch

from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.export import export_policy, load_safetensors_policy

CASES = {"nature-uint8": ("nature", (4, 36, 36), np.uint8), "minatar-bool": ("minatar", (4, 10, 10), np.bool_)}


def frames(shape, dtype, n=40, seed=1):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random((n, *shape)) < 0.3
    # (uniform noise gives an untrained CNN the same argmax everywhere: each frame its own brightness and gradient)
    c, h, w = shape
    ramp = np.linspace(0, 1, h)[:, None] * rng.uniform(-1, 1, (n, c, 1, 1)) + np.linspace(0, 1, w)[None, :] \
        * rng.uniform(-1, 1, (n, c, 1, 1))
    return np.clip(128 + 127 * ramp + rng.normal(0, 20, (n, c, h, w)), 0, 255).astype(np.uint8)


def agent_for(net, shape, dtype, **cfg):
    agent = DDQN(0, 5, DDQNConfig(encoder=net, **cfg), seed=3, image=(shape, dtype))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # (PyTorch's init picks one action for every frame: weights that tell frames apart)
        for p in agent.q.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 2.0 / np.sqrt(p[0].numel()) if p.dim() > 1 else 0.0 * p)
    return agent


def run_policy(fmt, path, obs):
    if fmt == "torchscript":
        return torch.jit.load(str(path))(torch.as_tensor(obs)).numpy()  # trusted-code: the file this test just wrote
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
        return ort.InferenceSession(str(path)).run(None, {"obs": obs})[0]
    return load_safetensors_policy(path)(torch.as_tensor(obs)).numpy()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "safetensors"])
def test_an_exported_image_q_network_acts_as_the_agent(tmp_path, case, fmt):
    net, shape, dtype = CASES[case]
    agent = agent_for(net, shape, dtype)
    obs = frames(shape, dtype)
    path = export_policy(agent, tmp_path / f"q.{fmt}", fmt)
    expect = agent.act(obs, explore=False)
    assert len(set(expect.tolist())) > 1  # (the frames tell the actions apart: the comparison can fail)
    np.testing.assert_array_equal(run_policy(fmt, path, obs), expect)


def test_channels_last_weights_export_the_same_policy(tmp_path):
    agent = agent_for("nature", (4, 36, 36), np.uint8, channels_last=True)
    obs = frames((4, 36, 36), np.uint8)
    path = export_policy(agent, tmp_path / "q.safetensors", "safetensors")
    np.testing.assert_array_equal(load_safetensors_policy(path)(torch.as_tensor(obs)).numpy(),
                                  agent.act(obs, explore=False))


def _rewrite_meta(src, dst, change):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["relive_policy"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    change(meta, tensors)
    save_file(tensors, str(dst), metadata={"relive_policy": json.dumps(meta)})
    return dst


@pytest.mark.parametrize("change, match", [
    (lambda m, t: m.update(image_net="resnet"), "unknown image policy"),
    (lambda m, t: m.update(obs_dtype="float64"), "unknown image policy"),
    (lambda m, t: m.update(obs_shape=[4, 10**6, 10]), "out of range"),
    (lambda m, t: m.update(obs_shape=[4, 10]), "out of range"),
    (lambda m, t: m.update(out=7), "do not match the declared policy"),
    (lambda m, t: m.pop("obs_shape"), "malformed"),
])
def test_a_malformed_image_policy_is_one_clear_error(tmp_path, change, match):
    agent = agent_for("minatar", (4, 10, 10), np.bool_)
    good = export_policy(agent, tmp_path / "q.safetensors", "safetensors")
    bad = _rewrite_meta(good, tmp_path / "bad.safetensors", change)
    with pytest.raises(ValueError, match=match):
        load_safetensors_policy(bad)


def test_relive_export_of_a_minatar_run(tmp_path, capsys):
    pytest.importorskip("minatar")
    from relive.cli import main

    run = tmp_path / "run"
    assert main(["train", "ddqn_minatar", "--env", "MinAtar/Breakout-v1", "--online-steps", "150", "--warmup", "100",
                 "--eval-every", "150", "--eval-episodes", "1", "--no-progress", "--run-dir", str(run)]) == 0
    out = tmp_path / "q.safetensors"
    assert main(["export", str(run), "--format", "safetensors", "--out", str(out)]) == 0
    assert "obs [N, 4, 10, 10] bool -> action" in capsys.readouterr().out
    from relive.train.run_cli import load_run_agent

    _, env, _, agent, _ = load_run_agent(run)
    env.close()
    obs = frames((4, 10, 10), np.bool_, n=64)
    np.testing.assert_array_equal(load_safetensors_policy(out)(torch.as_tensor(obs)).numpy(),
                                  agent.act(obs, explore=False))
