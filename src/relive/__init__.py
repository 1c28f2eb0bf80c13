"""relive: experience replay for off-policy and offline-to-online reinforcement learning.

Training from Python: ``relive.train(cfg, callbacks=[...])`` (``relive.train.trainer.train``), with
``relive.Callback`` / ``relive.StopTraining`` (``relive.train.callbacks``) and ``relive.get_preset`` for ``cfg``."""

from importlib.metadata import PackageNotFoundError, version

try:
    # one source of truth: pyproject.toml's [project] version, as installed (`relive --version` prints the same)
    __version__ = version("relive")
except PackageNotFoundError:  # a source tree on sys.path that was never installed (no metadata to read)
    __version__ = "0+unknown"

del PackageNotFoundError, version

#: the training API on the package, imported on first use (``import relive`` stays light: no torch)
_LAZY = {"Callback": "relive.train.callbacks", "StopTraining": "relive.train.callbacks",
         "get_preset": "relive.presets", "ExperimentConfig": "relive.config"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "train":  # (the subpackage, callable: relive.train(cfg, ...))
        import importlib

        return importlib.import_module("relive.train")
    raise AttributeError(f"module 'relive' has no attribute {name!r}")
