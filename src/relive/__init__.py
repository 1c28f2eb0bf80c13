"""relive: experience replay for off-policy and offline-to-online reinforcement learning."""

from importlib.metadata import PackageNotFoundError, version

try:
    # one source of truth: pyproject.toml's [project] version, as installed (`relive --version` prints the same)
    __version__ = version("relive")
except PackageNotFoundError:  # a source tree on sys.path that was never installed (no metadata to read)
    __version__ = "0+unknown"

del PackageNotFoundError, version
