"""One version, from pyproject.toml: ``relive --version`` and ``relive.__version__`` print what pyproject declares."""

import re
from pathlib import Path

import pytest

import relive
from relive.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
    # a regex, not tomllib: requires-python is 3.10, tomllib is 3.11+
    match = re.search(r'^\[project\][^\[]*?^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    assert match, "pyproject.toml has no [project] version"
    return match.group(1)


def test_cli_version_prints_pyproject_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"relive {_pyproject_version()}"


def test_module_version_is_pyproject_version():
    assert relive.__version__ == _pyproject_version()


def test_changelog_has_an_entry_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert f"## [{_pyproject_version()}]" in changelog
