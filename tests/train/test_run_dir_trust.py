"""Trust comes only from the current command line (issue 44, item 1): a run directory whose config.json was edited
to name a code-carrying base policy and to say ``agent.trust_code = true`` runs nothing, whichever command reads
it, until that command itself says ``--trust-code``. Every command reads a run directory through one loader
(``relive.agents.run_dir.open_run_dir``)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from relive.cli import build_parser, main
from relive.replay.checkpoint import load_tree
from tests.agents.test_base_policy import _malicious_pt2

pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
RUN_ARGS = ["--offline-steps", "0", "--online-steps", "40", "--eval-every", "1000", "--eval-episodes", "1",
            "--batch-size", "16", "--checkpoint-every", "20", "--no-progress", "--set", "env.max_episode_steps=20",
            "--set", "agent.hidden=[8,8]", "--set", "agent.warmup=10", "--set", "agent.probe_max_steps=2",
            "--set", "agent.otf_candidates=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished residual_sac run on a data-only base (a `relive bc` directory), trained with --trust-code."""
    from relive.agents.bc import BCConfig, new_policy, save_bc_policy

    root = tmp_path_factory.mktemp("trust")
    base = save_bc_policy(root / "base", new_policy(3, 1, [-2.0], [2.0], BCConfig(hidden=(8,)), seed=0), {})
    assert main(["train", "residual_sac", "--env", "Pendulum-v1", "--base-policy", str(base), "--trust-code",
                 *RUN_ARGS, "--run-dir", str(root / "run")]) == 0
    return root / "run"


def _poisoned(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run whose config.json names an archive that creates a marker file when loaded, and says
    trust_code = true; returns (run, marker)."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    marker = tmp_path / "payload_ran"
    (tmp_path / "evil").mkdir()
    evil = _malicious_pt2(tmp_path / "evil", marker)  # (its payload runs while it loads, before any shape check)
    cfg = json.loads((run / "config.json").read_text())
    cfg["agent"]["base_policy"], cfg["agent"]["trust_code"] = str(evil), True
    (run / "config.json").write_text(json.dumps(cfg))
    return run, marker


def _unstarted(run: Path) -> Path:
    """The run as if stopped before its first checkpoint: a resume starts it over from its config.json."""
    for p in list(run.iterdir()):
        if p.name != "config.json":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return run


#: every command that builds an agent (or loads a base policy) from a run directory: (name, argv(run, tmp))
COMMANDS = {
    "eval": lambda run, tmp: ["eval", str(run), "--episodes", "1"],
    "eval --checkpoint": lambda run, tmp: ["eval", str(run), "--episodes", "1", "--checkpoint"],
    "export": lambda run, tmp: ["export", str(run), "--format", "safetensors", "--out", str(tmp / "p.safetensors")],
    "export --checkpoint": lambda run, tmp: ["export", str(run), "--format", "onnx", "--checkpoint", "--out",
                                             str(tmp / "p.onnx")],
    "train --resume": lambda run, tmp: ["train", "--resume", str(_unstarted(run)), "--no-progress"],
    "pld distill": lambda run, tmp: ["pld", "distill", "--run", str(run), "--episodes", "1", "--out",
                                     str(tmp / "distilled"), "--success-return=-1e9", "--steps", "1",
                                     "--eval-episodes", "0"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_run_directory_never_switches_on_code_loading(command, finished, tmp_path, capsys):
    """Without --trust-code: one line naming the file and --trust-code, and the payload never runs (config.json's
    trust_code = true is ignored, with a note); with --trust-code on the command line the file is loaded (the
    archive is a real exploit: its payload runs, then it fails as a program)."""
    run, marker = _poisoned(finished, tmp_path)
    argv = COMMANDS[command](run, tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("relive: error")]
    assert len(lines) == 1 and "evil.pt2 is a torch.export program file" in lines[0] and "--trust-code" in lines[0]
    assert not marker.exists()
    assert main([*argv, "--trust-code"]) == 2  # (then: "not a torch.export program")
    assert marker.exists()


def test_every_command_is_classified_by_what_it_reads():
    """A new command must say whether it reads a run directory (and then go through open_run_dir, tested above)."""
    builds_agent = {"eval", "export", "train", "pld distill"}  # (train: --resume)
    reads_run_without_agent = {"plot", "data export-lerobot", "bench report"}  # (bench report: logs, no config)
    reads_no_run = {"presets", "demo", "data make", "data list", "data info", "data report", "bench run",
                    "bench list", "bc", "pld collect"}  # (bench run starts `relive train` processes)
    parser = build_parser()
    names = set()
    for action in parser._subparsers._group_actions:  # (argparse keeps the sub-commands here)
        for name, sub in action.choices.items():
            inner = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
            names |= {f"{name} {n}" for a in inner for n in a.choices} if inner else {name}
    assert names == builds_agent | reads_run_without_agent | reads_no_run


def test_config_json_is_read_by_the_one_loader_only():
    """No module but relive.agents.run_dir parses a run's config.json (``load_config`` is called nowhere else), so
    no command can take trust or a location from it by another road."""
    callers = []
    for path in sorted((ROOT / "src" / "relive").rglob("*.py")):
        text = path.read_text()
        if re.search(r"\bload_config\(", text) and path.name not in ("run_dir.py", "config.py"):
            callers.append(str(path.relative_to(ROOT)))
    assert callers == []


def test_a_run_never_records_trust(finished, tmp_path):
    """Trained with --trust-code, the run's config.json and its checkpoint's record say trust_code = false (trust is
    the command's, not the run's); read back, trust is what the reader says."""
    from relive.agents.run_dir import open_run_dir
    from relive.train.checkpoint import load_checkpoint, recorded_config

    assert json.loads((finished / "config.json").read_text())["agent"]["trust_code"] is False
    assert recorded_config(load_checkpoint(finished))["agent"]["trust_code"] is False
    read = open_run_dir(finished)
    assert read.notes == () and read.config.agent.trust_code is False
    assert open_run_dir(finished, trusted=True).config.agent.trust_code is True
    assert load_tree(read.agent_final, kind="agent") is not None


def test_a_resume_writes_only_into_the_directory_it_was_given(finished, tmp_path):
    """config.json's run.run_dir names another place: the resumed run (started over: no checkpoint yet) is written
    where `--resume` points, nothing there."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _unstarted(run)
    elsewhere = tmp_path / "elsewhere"
    cfg = json.loads((run / "config.json").read_text())
    cfg["run"]["run_dir"] = str(elsewhere)
    (run / "config.json").write_text(json.dumps(cfg))
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert (run / "summary.json").is_file() and not elsewhere.exists()


def test_trust_code_where_nothing_can_be_trusted_is_refused(tmp_path, capsys):
    from relive.agents.run_dir import open_run_dir
    from relive.config import save_config
    from relive.presets import get_preset

    save_config(get_preset("sac"), tmp_path / "config.json")
    with pytest.raises(ValueError, match="--trust-code: .*agent 'sac' loads no file that can run code"):
        open_run_dir(tmp_path, trusted=True)
    assert main(["eval", str(tmp_path), "--trust-code"]) == 2
    assert "nothing to trust" in capsys.readouterr().err
