"""bench/gpu.py: without CUDA it says so and exits 0; on CPU tensors (--device cpu) every section runs and the JSON
holds every figure (the script itself is tested here, its figures come from a GPU machine)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would measure it")
def test_without_a_gpu_it_says_so_and_exits_0(capsys):
    assert load().main([]) == 0
    assert "no GPU" in capsys.readouterr().out


def test_every_section_runs_on_cpu_tensors(tmp_path):
    out = tmp_path / "gpu.json"
    assert load().main(["--device", "cpu", "--rows", "3000", "--rounds", "1", "--seconds", "0.05", "--env",
                        "Pendulum-v1", "--env-steps", "2", "--utd", "2", "--offline-rows", "300",
                        "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and "bench/gpu.py" in res["command"]
    for key in ("device uniform", "host uniform", "device per", "device per, tree layout", "host per",
                "ratio per (device / host)", "ratio per (scan / tree layout)"):
        assert res["replay"][key] > 0
    for label in ("replay on device", "replay in host memory"):
        assert res["rlpd"][label]["updates_per_s"] > 0


def test_update_script_runs_on_cpu_tensors(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu_update", SCRIPT.with_name("gpu_update.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "u.json"
    assert module.main(["--device", "cpu", "--updates", "2", "--rounds", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["us_per_update"]) == {"member loop", "plain"} and min(res["us_per_update"].values()) > 0
    assert res["kernels_per_update"] == 0  # no CUDA kernels on CPU tensors
