"""Optional dependencies: what a command needs beyond relive's core, and the one line that installs it.

A command that needs an optional package asks for it with :func:`require` before doing any work; a missing one is a
:class:`MissingExtra` (a ``ValueError``: the CLI prints one line, never a traceback) naming the package, what needs
it and the install command -- for a clone (``pip install -c constraints.txt -e ".[EXTRA]"``, the pins CI tests) and
for an installed wheel (``pip install "relive[EXTRA]"``)."""

from __future__ import annotations

import importlib
from types import ModuleType

#: module -> the extra of pyproject.toml that installs it
EXTRA_OF = {"onnx": "export", "onnxruntime": "export", "safetensors": "export", "av": "video", "pyarrow": "data",
            "minari": "data", "ray": "ray", "stable_baselines3": "sb3", "torchrl": "torchrl", "tensordict": "torchrl",
            "gymnasium_robotics": "maze", "gymnasium": "envs", "ale_py": "envs", "wandb": "wandb", "mlflow": "mlflow",
            "jax": "jax", "flax": "jax", "optax": "jax", "sbx": "jax", "flashbax": "jax"}


class MissingExtra(ValueError):
    """An optional package a command needs is not installed."""


def install_hint(module: str) -> str:
    extra = EXTRA_OF.get(module.split(".")[0])
    if extra is None:
        return f"pip install {module.split('.')[0]}"
    return f'pip install -c constraints.txt -e ".[{extra}]" in a clone of relive (pip install "relive[{extra}]")'


def require(module: str, what: str) -> ModuleType:
    """``module`` imported, or a :class:`MissingExtra` saying that ``what`` needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and not module.startswith(e.name):  # (the package is there; something it needs is not)
            raise
        raise MissingExtra(f"{what} needs {module.split('.')[0]}, which is not installed: {install_hint(module)}") \
            from None
