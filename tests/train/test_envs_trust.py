"""Environment ids never import code (issue 27, audit of loaders): Gymnasium reads ``module:Env-v0`` as "import
module", and ids reach relive from files (a run's config.json, a dataset's env_id) as well as from flags."""

import sys

import pytest

from relive.envs import make_env


def test_an_env_id_naming_a_module_is_refused_and_the_module_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_env_module.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="names a module to import .'evil_env_module'."):
        make_env("evil_env_module:Pendulum-v1")
    assert not marker.exists() and "evil_env_module" not in sys.modules


def test_a_resume_whose_config_names_a_module_env_is_refused_before_importing(tmp_path, monkeypatch, capsys):
    import json

    from relive.cli import main

    run = tmp_path / "run"
    assert main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "40", "--warmup", "20", "--batch-size",
                 "8", "--eval-every", "40", "--eval-episodes", "1", "--checkpoint-every", "20", "--run-dir", str(run),
                 "--no-progress"]) == 0
    (run / "summary.json").unlink()  # as if killed after its checkpoint
    marker = tmp_path / "imported"
    (tmp_path / "evil_env_module2.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = json.loads((run / "config.json").read_text())
    cfg["env"]["id"] = "evil_env_module2:Pendulum-v1"  # someone else's run directory
    (run / "config.json").write_text(json.dumps(cfg))
    assert main(["train", "--resume", str(run)]) != 0
    assert not marker.exists()
    assert "names a module to import" in capsys.readouterr().err


def test_plain_ids_still_make_their_env():
    env = make_env("Pendulum-v1", max_episode_steps=7)
    assert env.spec.max_episode_steps == 7
    env.close()
