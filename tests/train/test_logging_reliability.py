"""Regression test of issue 14: resuming after a kill during a log write."""

from __future__ import annotations

import json

import pytest

from relive.train.logging import RunLogger


def _logger(tmp_path):
    log = RunLogger(tmp_path, 100, 0, progress=False)
    log._tb = None  # files only
    return log


def test_truncate_after_drops_a_partial_last_metrics_line_and_eval_row(tmp_path):
    log = _logger(tmp_path)
    for step in (10, 20, 30):
        log.metrics(step, {"grad_step": step, "train/loss": 1.0})
        log.evaluation({"env_step": step, "grad_step": step, "eval/return_mean": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"env_step": 40, "grad_st')  # killed mid-write
    with open(tmp_path / "eval.csv", "a") as f:
        f.write("40,")
    log.truncate_after(20, 20)
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [d["env_step"] for d in lines] == [10, 20]
    assert (tmp_path / "eval.csv").read_text().splitlines()[1:] == ["10,10,1.0", "20,20,1.0"]


def test_a_corrupted_line_in_the_middle_is_named(tmp_path):
    log = _logger(tmp_path)
    log.metrics(10, {"grad_step": 10})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("garbage\n")
    log.metrics(20, {"grad_step": 20})
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        log.truncate_after(20, 20)
