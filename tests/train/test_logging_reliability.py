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


@pytest.mark.parametrize("bad_row, problem", [
    ("garbage", r"has 1 fields, the header 3"),  # was dropped silently
    ("30,30,1.0,extra", r"has 4 fields, the header 3"),  # was kept, its extra field hidden
    ("x,30,1.0", r"holds a field that is not a number"),  # was dropped
    ("30,30,oops", r"holds a field that is not a number"),  # was kept
])
def test_a_corrupted_eval_row_in_the_middle_is_named_like_a_metrics_line(tmp_path, bad_row, problem):
    """Issue 27 item 12: docs/guarantees.md promises a refusal naming file and line for eval.csv too; the file is
    left as it was."""
    log = _logger(tmp_path)
    log.evaluation({"env_step": 10, "grad_step": 10, "eval/return_mean": 1.0})
    with open(tmp_path / "eval.csv", "a") as f:
        f.write(bad_row + "\n")
    log.evaluation({"env_step": 20, "grad_step": 20, "eval/return_mean": 2.0})
    before = (tmp_path / "eval.csv").read_text()
    with pytest.raises(ValueError, match=rf"eval.csv: line 3 {problem}.*not a partial last line"):
        log.truncate_after(20, 20)
    assert (tmp_path / "eval.csv").read_text() == before


def test_a_corrupted_eval_header_and_a_metrics_step_that_is_not_a_count_are_named(tmp_path):
    log = _logger(tmp_path)
    (tmp_path / "eval.csv").write_text("what,is,this\n1,2,3\n")
    with pytest.raises(ValueError, match=r"eval.csv: line 1 is not eval.csv's header"):
        log.truncate_after(20, 20)
    (tmp_path / "eval.csv").unlink()
    (tmp_path / "metrics.jsonl").write_text('{"env_step": "ten", "grad_step": 1}\n{"env_step": 20}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 1 has an env_step / grad_step that is not a count"):
        log.truncate_after(20, 20)  # was a TypeError comparing a string with a number
