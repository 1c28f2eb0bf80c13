"""A command that needs an optional package says in one line which install adds it (issue 47, item 2): never a
traceback from inside the command."""

from __future__ import annotations

import builtins
import importlib

import pytest

from relive.cli import main
from relive.extras import EXTRA_OF, MissingExtra, require


@pytest.fixture
def without(monkeypatch):
    """Make ``import NAME`` (and its submodules) fail as if the package were not installed."""
    def hide(*names):
        def missing(real):
            def fake(name, *args, **kwargs):
                if name.split(".")[0] in names:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
                return real(name, *args, **kwargs)
            return fake

        monkeypatch.setattr(builtins, "__import__", missing(builtins.__import__))
        monkeypatch.setattr(importlib, "import_module", missing(importlib.import_module))
    return hide


def test_require_names_the_package_what_needs_it_and_the_install_line(without):
    without("onnx")
    with pytest.raises(MissingExtra, match=r"--format onnx needs onnx, which is not installed: pip install -c "
                                           r"constraints.txt -e \"\.\[export\]\"") as e:
        require("onnx", "--format onnx")
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    assert require("json", "a test").dumps([1]) == "[1]"
    assert set(EXTRA_OF.values()) <= {"export", "video", "data", "ray", "sb3", "torchrl", "maze", "envs", "wandb",
                                      "mlflow", "jax"}


def test_export_and_eval_video_without_their_extras_are_one_line(tmp_path, capsys, without):
    from tests.train.test_run_cli import TINY

    run = tmp_path / "run"
    assert main(["train", "sac", "--env", "Pendulum-v1", "--run-dir", str(run), *TINY]) == 0
    without("onnx", "safetensors", "av")
    for argv in (["export", str(run), "--format", "onnx", "--out", str(tmp_path / "p.onnx")],
                 ["export", str(run), "--format", "safetensors", "--out", str(tmp_path / "p.st")],
                 ["eval", str(run), "--episodes", "1", "--video", str(tmp_path / "v")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "pip install" in err and "Traceback" not in err, err
    assert not (tmp_path / "v").exists() and not (tmp_path / "p.onnx").exists()
