"""Frozen base policies for residual RL (PLD, arXiv 2511.00091; spec §1.1 and §6.1: a_base = pi_theta(x),
theta never updated).

``load_base_policy(path, spec)`` accepts
  (a) a relive run directory (``<run>/config.json`` + ``<run>/agent_final``) or an agent directory written by
      ``save_tree(..., kind="agent")`` (``agent_final``, ``snapshots/agent_N``) of a SAC / RLPD / Cal-QL run
      (the actor's deterministic action center + scale * tanh(mu(s))) or of a DDPG run (its deterministic
      actor); layer sizes read off the weights and checked against the run's config.json when there is one;
  (b) a behaviour-cloning directory written by ``relive bc`` (``relive.agents.bc``);
  (c) a saved torch module mapping float32 obs [N, obs_dim] to actions [N, A]: a TorchScript file
      (``torch.jit.save``), a ``torch.export.save`` program (``.pt2``; exported with a dynamic batch
      dimension), or an MLP state dict in safetensors with a JSON description beside it (same name,
      ``.json``; see :func:`save_mlp_safetensors` for the layout).
The result is a :class:`BasePolicy`: eval mode, ``requires_grad_(False)``, no optimizer; calling it never
changes a parameter (``digest()`` lets a test or a run check that).

Trust: (a), (b) and the safetensors MLP are data only (``.npy`` + JSON read with ``allow_pickle=False``, safetensors'
flat tensor format): nothing in them can run. TorchScript carries a program and ``torch.export.load`` unpickles
archive entries marked ``use_pickle`` (any Python code), so those two are read only with ``trusted=True`` (the
command line's ``--trust-code``, ``agent.trust_code`` of a config given to the call -- never one read from a run
directory, ``relive.agents.run_dir``); without it they are refused before the file is opened (docs/guarantees.md,
"Files that can carry code").

Example::

    base = load_base_policy("runs/bc-umaze", env_spec(make_env("PointMaze_UMaze-v3")))
    a_base = base(obs)                        # [N, obs_dim] -> [N, action_dim] float32, deterministic
    a_base_t = base.torch(obs_tensor)         # the same on tensors, for a critic target (no grad)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from relive.agents import bc
from relive.agents import networks as nets
from relive.agents.bc import SquashedMLP
from relive.agents.ddpg import DeterministicActor
from relive.agents.run_dir import CONFIG_FILE, open_run_dir
from relive.replay.checkpoint import CheckpointError, load_tree

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")
EXPORT_SUFFIX = ".pt2"
#: file formats that can run code when loaded: read only with ``trusted=True`` (``--trust-code``)
CODE_FORMATS = {EXPORT_SUFFIX: "torch.export program", **{s: "TorchScript" for s in TORCHSCRIPT_SUFFIXES}}
TRUST_HINT = ("--trust-code on the command line, load_base_policy(..., trusted=True) in Python, agent.trust_code=true "
              "in a config given to the call; never a run directory's config.json")


class UntrustedCodeError(ValueError):
    """A model file in a format that can run code when loaded (TorchScript, torch.export), given without the opt-in."""

    def __init__(self, path, what: str):
        fmt = CODE_FORMATS.get(Path(path).suffix, "code-carrying")
        super().__init__(
            f"{what} {path} is a {fmt} file: loading it can run code (TorchScript carries a program; torch.export "
            f"unpickles parts of the archive), so relive reads it only when told to trust it ({TRUST_HINT}). "
            "Files that cannot run code: a relive run / agent / `relive bc` directory, or a safetensors MLP + JSON "
            "(relive.agents.base_policy.save_mlp_safetensors)")


class _ActorMean(nn.Module):
    """A SAC actor's deterministic action: center + scale * tanh(mu(s))."""

    def __init__(self, actor: nets.TanhGaussianActor):
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.squash(self.actor(obs)[0])


class BasePolicy:
    """A frozen deterministic policy ``obs [N, obs_dim] -> action [N, action_dim]`` (NumPy float32)."""

    def __init__(self, module: nn.Module, obs_dim: int, action_dim: int, kind: str, source: str,
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.module = _eval_mode(module.to(self.device))
        for p in self.module.parameters():  # (TorchScript modules have no requires_grad_)
            p.requires_grad_(False)
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.kind, self.source = kind, str(source)

    @torch.no_grad()
    def torch(self, obs: torch.Tensor) -> torch.Tensor:
        """Base actions of a float32 tensor of observations [N, obs_dim] -> [N, action_dim] (no gradient)."""
        return self.module(obs)

    def __call__(self, obs) -> np.ndarray:
        o, single = nets.as_obs_tensor(obs, self.obs_dim, self.device)
        a = self.torch(o).cpu().numpy().astype(np.float32, copy=False)
        return a[0] if single else a

    def digest(self) -> str:
        """SHA-256 over every parameter and buffer: equal digests = bit-identical weights."""
        h = hashlib.sha256()
        for k, v in sorted(self.module.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def describe(self) -> str:
        n = sum(int(v.numel()) for v in self.module.state_dict().values())
        return (f"frozen {self.kind} base policy from {self.source}: obs [N, {self.obs_dim}] -> action "
                f"[N, {self.action_dim}], {n:,} parameters")

    def __repr__(self) -> str:
        return f"BasePolicy({self.describe()})"


def _eval_mode(module: nn.Module) -> nn.Module:
    """``module.eval()``; exported programs (torch.export) refuse train/eval switches and are left as they are."""
    try:
        return module.eval()
    except (NotImplementedError, RuntimeError):
        return module


# -- loading ----------------------------------------------------------------------------------------------------
def load_base_policy(path: str | Path, spec, device: str | torch.device = "cpu", *,
                     trusted: bool = False) -> BasePolicy:
    """The frozen base policy stored at ``path`` (see the module docstring for the formats), checked against
    ``spec`` (a ``relive.envs.EnvSpec``): observation size, the action shape of one call, finite weights
    and a finite action. ``trusted``: also read formats that can run code when loaded (TorchScript,
    ``torch.export``); without it such a file is refused (:class:`UntrustedCodeError`) before it is opened."""
    if getattr(spec, "discrete", False):
        raise ValueError(f"a base policy needs a continuous action space; {spec.id} is discrete")
    obs_dim = nets.vector_obs_dim(spec, "a base policy")
    if not isinstance(path, str | os.PathLike):
        raise ValueError(f"a base policy path must be a str or a path, got {type(path).__name__}")
    device = _check_device(device)
    p = Path(path)
    if not p.exists():
        raise ValueError(f"base policy {p} does not exist")
    if p.is_dir():
        module, kind = _load_directory(p)
    elif p.suffix == ".safetensors":
        module, kind = _load_safetensors(p), "MLP (safetensors)"
    elif p.suffix == ".json" and p.with_suffix(".safetensors").is_file():
        module, kind = _load_safetensors(p.with_suffix(".safetensors")), "MLP (safetensors)"
    elif p.suffix in CODE_FORMATS:
        if trusted is not True:  # (checked before anything reads the file: refusing must not run it)
            raise UntrustedCodeError(p, "base policy")
        module, kind = _load_code(p)
    else:
        raise ValueError(f"base policy {p}: not a run / agent / `relive bc` directory, a .safetensors MLP, a "
                         f"TorchScript file ({', '.join(TORCHSCRIPT_SUFFIXES)}) or a torch.export .pt2 (these two "
                         f"with {TRUST_HINT.split(',')[0]} only)")
    _check_finite(module, p)
    module_obs_dim = getattr(module, "obs_dim", None)
    if module_obs_dim is not None and int(module_obs_dim) != obs_dim:
        raise ValueError(f"base policy {p} takes observations of shape ({module_obs_dim},), the environment "
                         f"{spec.id} gives {tuple(spec.obs_shape)}")
    probe = torch.zeros(1, obs_dim)
    try:
        with torch.no_grad():
            out = _eval_mode(module)(probe)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"base policy {p} cannot act on observations of shape (N, {obs_dim}) of {spec.id}: "
                         f"{first}") from None
    expected = (1, *spec.action_shape)
    if not torch.is_tensor(out) or tuple(out.shape) != expected:
        got = tuple(out.shape) if torch.is_tensor(out) else type(out).__name__
        raise ValueError(f"base policy {p} returns actions of shape {got} for one observation; {spec.id} "
                         f"expects {expected} (action shape {tuple(spec.action_shape)})")
    if not out.is_floating_point() or not torch.isfinite(out).all():
        raise ValueError(f"base policy {p} returns {out.dtype} action {out.tolist()} for a zero observation; a base "
                         "policy must return finite floating-point actions")
    return BasePolicy(module, obs_dim, int(np.prod(spec.action_shape)), kind, str(p), device)


def _check_device(device) -> torch.device:
    """A torch device that exists here (a ValueError naming it, not a torch RuntimeError / AssertionError)."""
    try:
        dev = torch.device(device)
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"base policy device {device!r} is not usable here: {first}") from None
    return dev


def _load_code(p: Path) -> tuple[nn.Module, str]:
    """A TorchScript module or a torch.export program: formats that can run code (the caller said to trust it)."""
    if p.suffix == EXPORT_SUFFIX:
        try:
            # trusted-code: reached only through load_base_policy's `trusted is True` gate (--trust-code); a crafted
            # .pt2 whose payload writes a file is refused without it (test_a_malicious_export_archive_...)
            return torch.export.load(str(p)).module(), "torch.export program"  # trusted-code: --trust-code only
        except (RuntimeError, ValueError, KeyError, AssertionError, OSError) as e:
            raise ValueError(f"base policy {p} is not a torch.export program (torch.export.save): {e}") from None
    try:
        # trusted-code: reached only through load_base_policy's `trusted is True` gate (--trust-code); refused
        # without it before the file is opened (test_torchscript_module_is_refused_without_trust_and_loads_with_it)
        return torch.jit.load(str(p), map_location="cpu"), "TorchScript"  # trusted-code: --trust-code only
    except (RuntimeError, ValueError, OSError) as e:
        raise ValueError(f"base policy {p} is not a TorchScript module (torch.jit.save): {e}") from None


def _check_finite(module: nn.Module, p: Path) -> None:
    """Every weight and buffer of a base policy is finite (a NaN weight would make every action NaN)."""
    for name, value in module.state_dict().items():
        if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
            raise ValueError(f"base policy {p}: tensor {name} holds NaN or inf values")


def _manifest_kind(p: Path) -> str | None:
    m = p / "MANIFEST.json"
    if not m.is_file():
        return None
    try:
        manifest = json.loads(m.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return manifest.get("kind") if isinstance(manifest, dict) else None


def _load_directory(p: Path) -> tuple[nn.Module, str]:
    if _manifest_kind(p) == bc.KIND or _manifest_kind(p / bc.POLICY_DIR) == bc.KIND:
        return bc.load_bc_policy(p), "behaviour-cloning MLP"
    if _manifest_kind(p) == "agent":
        return _load_agent(p)
    if (p / "agent_final").is_dir():
        return _load_agent(p / "agent_final")
    if (p / "config.json").is_file():
        raise ValueError(f"base policy {p}: a run directory without agent_final/ (the run has not finished)")
    for f in ("policy.safetensors", "model.safetensors"):
        if (p / f).is_file():
            return _load_safetensors(p / f), "MLP (safetensors)"
    raise ValueError(f"base policy {p}: not a run directory (agent_final/), an agent checkpoint, a `relive bc` "
                     "directory or a directory with policy.safetensors + policy.json")


def _run_config(agent_dir: Path):
    """The config.json of the run an agent directory belongs to (agent_final/ or snapshots/agent_N/), or None."""
    for run in (agent_dir.parent, agent_dir.parent.parent):
        if (run / CONFIG_FILE).is_file():  # (read as every command reads a run directory: nothing to trust in it)
            return open_run_dir(run, where=f"base policy {agent_dir}: the run {run}").config
    return None


def _load_agent(agent_dir: Path) -> tuple[nn.Module, str]:
    """The deterministic action of a saved agent's actor: a SAC-family ``TanhGaussianActor`` (weights
    ``trunk__*``: center + scale * tanh(mu(s))) or DDPG's ``DeterministicActor`` (weights ``net__*``)."""
    try:
        state = load_tree(agent_dir, kind="agent")
    except CheckpointError as e:
        raise ValueError(f"base policy: {e}") from None
    if "actor" not in state:
        raise ValueError(f"base policy {agent_dir}: the agent has no actor (a DDQN run cannot be a base policy)")
    actor_state = state["actor"]
    if not isinstance(actor_state, dict):
        raise ValueError(f"base policy {agent_dir}: unknown actor layout (the actor entry is not a set of tensors)")
    prefix = "trunk" if any(k.startswith("trunk__") for k in actor_state) else "net"
    weights = [k for k in actor_state if k.startswith(f"{prefix}__") and k.endswith("__weight")]
    if (not weights or "scale" not in actor_state or "center" not in actor_state
            or not all(k.split("__")[1].isdigit() for k in weights)
            or not all(np.ndim(actor_state[k]) == 2 for k in weights)):
        raise ValueError(f"base policy {agent_dir}: unknown actor layout (keys {sorted(actor_state)[:6]}...)")
    weights.sort(key=lambda k: int(k.split("__")[1]))
    shapes = [np.asarray(actor_state[k]).shape for k in weights]  # [out, in] per linear layer
    obs_dim, out_dim = shapes[0][1], shapes[-1][0]
    hidden = tuple(s[0] for s in shapes[:-1])
    cfg = _run_config(agent_dir)
    cfg_hidden = getattr(getattr(cfg, "agent", None), "hidden", None)
    if cfg_hidden is not None and tuple(cfg_hidden) != hidden:
        raise ValueError(f"base policy {agent_dir}: config.json says hidden={tuple(cfg_hidden)}, the saved actor "
                         f"has {hidden}")
    low = np.asarray(actor_state["center"]) - np.asarray(actor_state["scale"])
    high = np.asarray(actor_state["center"]) + np.asarray(actor_state["scale"])
    actor: nn.Module
    module: nn.Module
    with nets.private_rng():
        if prefix == "trunk":
            actor = nets.TanhGaussianActor(obs_dim, out_dim // 2, hidden, low, high)
            module, kind = _ActorMean(actor), "SAC actor (deterministic mean)"
        else:
            actor = module = DeterministicActor(obs_dim, out_dim, hidden, low, high)
            kind = "DDPG actor"
    try:
        nets.load_module_state(actor, actor_state)
    except ValueError as e:
        raise ValueError(f"base policy {agent_dir}: {e}") from None
    module.obs_dim = obs_dim
    return module, kind


# -- the safetensors MLP format -------------------------------------------------------------------------------------
def save_mlp_safetensors(policy, path: str | Path) -> Path:
    """Write a ``relive.agents.bc.SquashedMLP`` as ``<path>.safetensors`` (its state dict: ``net.<i>.weight`` /
    ``net.<i>.bias`` of Linear -> ReLU -> ... -> Linear, ``obs_mean``, ``obs_std``, ``scale``, ``center``) and
    ``<path>.json`` (``{"format": "relive-mlp", "obs_dim", "action_dim", "hidden", "action_low",
    "action_high"}``). Any MLP with that layout loads: ``obs_mean`` / ``obs_std`` may be left out (0 / 1)."""
    from safetensors.torch import save_file  # (optional: the safetensors package)

    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps({"format": "relive-mlp"} | policy.architecture(), indent=1))
    return path


def _load_safetensors(path: Path) -> nn.Module:
    """The MLP of ``path`` (safetensors) + its JSON description: the description is checked against the tensor
    shapes in the file's header before the module is allocated (a description cannot make relive allocate more
    than the file holds)."""
    desc = path.with_suffix(".json")
    if not desc.is_file():
        raise ValueError(f"base policy {path}: the JSON description {desc.name} (obs_dim, action_dim, hidden, "
                         "action_low, action_high) is missing beside it")
    try:
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file
    except ImportError:
        raise ValueError(f"base policy {path}: reading .safetensors needs the safetensors package "
                         "(pip install safetensors)") from None
    try:
        arch = json.loads(desc.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"base policy {path}: {desc.name} is not valid JSON ({e})") from None
    if not isinstance(arch, dict):
        raise ValueError(f"base policy {path}: {desc.name} must hold a JSON object (obs_dim, action_dim, hidden, "
                         f"action_low, action_high), got {type(arch).__name__}")
    try:
        with torch.device("meta"):  # shapes only: nothing allocated before they match the file
            shapes = {k: tuple(v.shape) for k, v in SquashedMLP.from_architecture(arch).state_dict().items()}
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"base policy {path}: {desc.name} does not describe an MLP ({e})") from None
    try:
        with safe_open(str(path), framework="pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"base policy {path}: not a safetensors file ({e})") from None
    missing = [k for k in shapes if k not in stored and k not in ("obs_mean", "obs_std")]
    unexpected = [k for k in stored if k not in shapes]
    if missing or unexpected:
        raise ValueError(f"base policy {path}: tensors do not match the MLP of {desc.name} "
                         f"(missing {missing}, unexpected {unexpected})")
    for k, shape in stored.items():
        if shape != shapes[k]:
            raise ValueError(f"base policy {path}: tensor {k} has shape {shape}, the MLP of {desc.name} "
                             f"needs {shapes[k]}")
    module = SquashedMLP.from_architecture(arch)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"base policy {path}: not a safetensors file ({e})") from None
    bad = [k for k, v in tensors.items() if not v.is_floating_point()]
    if bad:
        raise ValueError(f"base policy {path}: tensors {bad} are not floating point")
    module.load_state_dict(module.state_dict() | {k: v.to(torch.float32) for k, v in tensors.items()})
    return module
