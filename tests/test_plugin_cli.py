"""Plug-ins from a shell (issue 31, item 3): a sampler registered in a user's own file runs with `relive train`,
resumes, and reaches the runs `relive bench run` starts (``$RELIVE_PLUGINS``); nothing is imported that the user did
not name: a run's config.json names the replay, and resuming it without ``--plugin`` says what to pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relive import cli
from relive.registry import REPLAYS
from relive.replay.samplers.base import SAMPLERS

PLUGIN = '''
from dataclasses import dataclass

from relive.registry import register_replay
from relive.replay import UniformSampler, register_sampler

MARKER = __file__


@register_sampler
class ShellUniformSampler(UniformSampler):
    """uniform, registered from a user's file"""


@dataclass(frozen=True)
class ShellUniformConfig:
    pass


@register_replay("shell_uniform", ShellUniformConfig)
def build(options, ctx):
    return ShellUniformSampler()
'''
TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress",
        "--online-steps", "240", "--warmup", "100", "--eval-every", "120", "--log-every", "120",
        "--checkpoint-every", "120"]


@pytest.fixture
def plugin_file(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.PLUGIN_ENV, raising=False)  # (restored after the test)
    path = tmp_path / "my_samplers.py"
    path.write_text(PLUGIN)
    yield path
    REPLAYS.pop("shell_uniform", None)
    SAMPLERS.pop("ShellUniformSampler", None)
    for name in [m for m in sys.modules if m.startswith("relive_plugin_my_samplers")]:
        sys.modules.pop(name)


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_plugin_file_runs_with_relive_train_and_resumes(plugin_file, tmp_path):
    run = tmp_path / "run"
    assert cli.main(["--plugin", str(plugin_file), "train", "sac", "--env", "Pendulum-v1", "--replay",
                     "shell_uniform", "--run-dir", str(run), *TINY]) == 0
    assert json.loads((run / "config.json").read_text())["replay"]["name"] == "shell_uniform"
    assert (run / "summary.json").is_file()
    assert os.environ[cli.PLUGIN_ENV] == str(plugin_file.resolve())  # passed on to the processes it starts
    # a fresh process resuming it: without --plugin it is refused, naming the option; with it, it loads
    env = {k: v for k, v in os.environ.items() if k != cli.PLUGIN_ENV}
    (run / "summary.json").unlink()  # (so that the resume has something to check: it must load the replay)
    out = subprocess.run([sys.executable, "-m", "relive.cli", "train", "--resume", str(run)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "unknown replay 'shell_uniform'" in out.stderr and "--plugin" in out.stderr
    out = subprocess.run([sys.executable, "-m", "relive.cli", "--plugin", str(plugin_file), "train", "--resume",
                          str(run)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_without_the_plugin_the_replay_is_not_a_choice(plugin_file, capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "sac", "--env", "Pendulum-v1", "--replay", "shell_uniform"])
    assert "invalid choice: 'shell_uniform'" in capsys.readouterr().err
    assert "shell_uniform" not in REPLAYS  # nothing was imported behind the user's back


def test_plugins_named_in_the_environment_are_loaded(plugin_file, monkeypatch):
    monkeypatch.setenv(cli.PLUGIN_ENV, str(plugin_file))
    assert cli.load_plugins() == [str(plugin_file.resolve())]
    assert "shell_uniform" in REPLAYS


def test_a_missing_plugin_is_one_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cli.PLUGIN_ENV, raising=False)
    assert cli.main(["--plugin", str(tmp_path / "nope.py"), "presets"]) == 2
    err = capsys.readouterr().err
    assert "--plugin" in err and "no such file" in err
    assert cli.main(["--plugin", "relive_no_such_module_xyz", "presets"]) == 2
    assert "no module named 'relive_no_such_module_xyz'" in capsys.readouterr().err


def test_only_options_before_the_command_name_plugins():
    assert cli._plugin_args(["--debug", "--plugin", "a", "--plugin=b.py", "train", "--plugin", "c"]) == ["a", "b.py"]
    assert cli._plugin_args(["train", "--set", "x=1"]) == []
    assert Path(cli.__file__).name == "cli.py"


def test_two_plugin_files_with_the_same_name_are_both_loaded(tmp_path, monkeypatch):
    """Issue 44: ``a/samplers.py`` and ``b/samplers.py`` were one module name: the second was silently skipped (its
    replay unknown). Each file is its own module; the same file named twice is imported once."""
    monkeypatch.delenv(cli.PLUGIN_ENV, raising=False)
    paths = []
    for d, name in (("a", "same_stem_a"), ("b", "same_stem_b")):
        (tmp_path / d).mkdir()
        path = tmp_path / d / "same_stem.py"
        path.write_text(PLUGIN.replace("ShellUniform", f"Shell{d.upper()}").replace('"shell_uniform"', repr(name)))
        paths.append(path)
    try:
        assert cli.load_plugins([str(paths[0]), str(paths[1]), str(paths[0])]) == [str(p.resolve()) for p in paths]
        assert "same_stem_a" in REPLAYS and "same_stem_b" in REPLAYS
        assert len([m for m in sys.modules if m.startswith("relive_plugin_same_stem")]) == 2
    finally:
        for name in ("same_stem_a", "same_stem_b"):
            REPLAYS.pop(name, None)
        for name in ("ShellASampler", "ShellBSampler"):
            SAMPLERS.pop(name, None)
        for name in [m for m in sys.modules if m.startswith("relive_plugin_same_stem")]:
            sys.modules.pop(name)
