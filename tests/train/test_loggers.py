"""--logger tensorboard,wandb,mlflow: W&B offline and MLflow's file store under the run directory (no network), read
back with the real libraries; every logged number equals the run's metrics.jsonl / eval.csv."""

import csv
import json
import math
import struct

import pytest

from relive.cli import build_parser, main
from relive.extras import MissingExtra
from relive.train.cli import config_from_args
from relive.train.logging import RunLogger
from relive.train.trainer import train

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "16", "--eval-episodes", "1", "--no-progress"]


def tiny_run(run_dir, loggers, *args):
    return train(config_from_args(build_parser().parse_args(
        ["train", "ddqn", "--env", "CartPole-v1", "--warmup", "20", "--online-steps", "120", "--eval-every", "60",
         "--log-every", "40", "--run-dir", str(run_dir), "--logger", loggers, *TINY, *args])))


def expected_rows(run_dir):
    """(env_step, {key: value}) of the finite numbers the run wrote to metrics.jsonl and eval.csv's eval/ columns."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        assert d["phase"] in ("online", "final")
        out.append((d["env_step"], {k: v for k, v in d.items() if k not in ("env_step", "grad_step", "phase")
                                    and not isinstance(v, str) and math.isfinite(v)}))
    with open(run_dir / "eval.csv") as f:
        for r in csv.DictReader(f):
            out.append((int(r["env_step"]), {k: float(v) for k, v in r.items() if k.startswith("eval/") and v != ""
                                              and math.isfinite(float(v))}))
    return out


def wandb_history(run_dir):
    """The history rows of the offline W&B run in ``run_dir/wandb``, read from its .wandb file (a LevelDB-style log of
    W&B's protobuf ``Record``s: 32 KiB blocks, 7-byte record headers <crc32, length, type>, after a 7-byte file
    header) with wandb's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, block, pos, chunks, part = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:  # (padding to the block's end)
            pos += left
            continue
        part += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST
            chunks.append(part)
            part = b""
    rows = []
    for chunk in chunks:
        record = pb.Record()
        record.ParseFromString(chunk)
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
    return rows


@pytest.mark.slow
def test_wandb_and_mlflow_runs_hold_the_runs_numbers(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    for var in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    run_dir = tmp_path / "r"
    tiny_run(run_dir, "tensorboard,wandb,mlflow")
    expected = expected_rows(run_dir)
    assert len(expected) >= 5 and any("eval/return_mean" in d for _, d in expected)

    # W&B: one history row per line / evaluation, in order, the same numbers with their env step
    history = wandb_history(run_dir)
    evals = [r for r in history if any(k.startswith("eval/") for k in r)]  # (eval.csv's rows, in their order)
    assert len(history) == len(expected)
    for (step, values), row in zip(expected, [r for r in history if r not in evals] + evals, strict=True):
        assert row["env_step"] == step
        assert {k: row[k] for k in values} == pytest.approx(values, rel=1e-12)

    # MLflow: the run of this run directory in the file store RUN_DIR/mlruns; each key's history = the run's values
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # (MLflow 3's opt-in for reading a file store)
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("relive").experiment_id])
    assert run.info.run_name == "r" and run.info.status == "FINISHED"
    assert run.data.params["schedule.num_online_env_steps"] == "120" and run.data.params["agent_kind"] == "ddqn"
    for key in ("eval/return_mean", "train/loss", "replay/online_fraction"):
        want = [(s, d[key]) for s, d in expected if key in d]
        got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert want and sorted(got) == sorted(want), key


@pytest.mark.slow  # (importing mlflow: ~6 s here)
def test_mlflow_resumed_run_logs_into_the_same_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for part in range(2):  # a run, then its resume: one MLflow run with both parts' values
        log = RunLogger(tmp_path, 100, 0, progress=False, loggers=["mlflow"], config={"run": {"seed": 3}})
        log.metrics(10 * (part + 1), {"train/loss": 0.5 + part, "grad_step": part, "phase": "online"})
        log.close()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("relive").experiment_id])
    assert run.data.params == {"run.seed": "3"}
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")) == [
        (10, 0.5), (20, 1.5)]


def test_offline_lines_go_under_offline_against_gradient_steps(tmp_path):
    class Spy:
        def __init__(self):
            self.calls = []

        def scalars(self, values, env_step, grad_step, offline):
            self.calls.append((values, env_step, grad_step, offline))

        def close(self):
            pass

    log = RunLogger(tmp_path, 100, 10, progress=False, loggers=[])
    log._loggers = [spy := Spy()]
    log.metrics(0, {"train/loss": 2.0, "grad_step": 7, "phase": "offline", "x": math.nan})
    log.evaluation({"env_step": 30, "grad_step": 9, "eval/return_mean": 1.5, "eval/normalized_score": math.nan})
    assert spy.calls == [({"offline/train/loss": 2.0}, 0, 7, True), ({"eval/return_mean": 1.5}, 30, 9, False)]


def test_logger_flag_and_missing_packages(tmp_path, monkeypatch, capsys):
    parse = build_parser().parse_args
    cfg = config_from_args(parse(["train", "sac", "--env", "Pendulum-v1", "--logger", "wandb, mlflow"]))
    assert cfg.run.loggers == ("wandb", "mlflow")
    assert config_from_args(parse(["train", "sac", "--logger", "none"])).run.loggers == ()
    assert config_from_args(parse(["train", "sac"])).run.loggers == ("tensorboard",)  # the default, as before
    for bad in ("tb", "wandb,wandb", ""):
        with pytest.raises(SystemExit):
            parse(["train", "sac", "--logger", bad])
        assert "--logger" in capsys.readouterr().err
    import builtins
    import importlib
    import sys

    def missing(real):
        def fake(name, *args, **kwargs):
            if name.split(".")[0] == "wandb":
                raise ModuleNotFoundError(f"No module named {name!r}", name="wandb")
            return real(name, *args, **kwargs)
        return fake

    monkeypatch.setattr(builtins, "__import__", missing(builtins.__import__))
    monkeypatch.setattr(importlib, "import_module", missing(importlib.import_module))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    with pytest.raises(MissingExtra, match=r"--logger wandb needs wandb.*pip install .*relive\[wandb\]"):
        tiny_run(tmp_path / "r", "wandb")
    assert not (tmp_path / "r").exists()  # refused before the run directory is written
    assert main(["train", "ddqn", "--env", "CartPole-v1", "--logger", "wandb", "--run-dir", str(tmp_path / "s")]) != 0
    assert "pip install" in capsys.readouterr().err
