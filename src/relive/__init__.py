"""relive: experience replay for off-policy and offline-to-online reinforcement learning.

Training from Python: ``import relive.train``, then ``relive.train(cfg, callbacks=[...])`` (the package is callable:
``relive.train.trainer.train``), with ``relive.train.Callback`` / ``relive.train.StopTraining`` and
``relive.train.get_preset`` for ``cfg``. (This module holds the version only: it imports nothing of relive, so the
floors stay as drawn -- no import from the package's ground up to its training floor.)"""

from importlib.metadata import PackageNotFoundError, version

try:
    # one source of truth: pyproject.toml's [project] version, as installed (`relive --version` prints the same)
    __version__ = version("relive")
except PackageNotFoundError:  # a source tree on sys.path that was never installed (no metadata to read)
    __version__ = "0+unknown"

del PackageNotFoundError, version
