"""Issue 44: on resume, eval.csv rows written after the checkpoint are dropped (the run writes them again), but a
row no evaluation of the run could have written -- an env_step beyond the run's budget, or a row out of the order
the run appends in -- is refused, naming the file and line, and the file is left as it was (it used to be dropped
silently, as if it were the run's own future)."""

from __future__ import annotations

import pytest

from relive.train.logging import RunLogger


def _logger(tmp_path, budget=100):
    log = RunLogger(tmp_path, budget, 0, progress=False)
    log._tb = None  # files only
    return log


def _evals(log, steps):
    for step in steps:
        log.evaluation({"env_step": step, "grad_step": step, "eval/return_mean": 1.0})


@pytest.mark.parametrize("where", ["middle", "end"])
def test_an_eval_row_beyond_the_run_s_budget_is_refused_naming_file_and_line(tmp_path, where):
    log = _logger(tmp_path, budget=100)
    _evals(log, (10, 20))
    with open(tmp_path / "eval.csv", "a") as f:
        f.write("5000,5000,9.0\n")
    if where == "middle":
        _evals(log, (30,))
    before = (tmp_path / "eval.csv").read_text()
    with pytest.raises(ValueError, match=r"eval.csv: line 4 has env_step 5000, beyond the run's 100 online env "
                                         r"steps"):
        log.truncate_after(20, 20)
    assert (tmp_path / "eval.csv").read_text() == before


def test_an_eval_row_out_of_order_is_refused_naming_both_lines(tmp_path):
    log = _logger(tmp_path, budget=100)
    _evals(log, (10, 60, 20, 30))  # 60 among rows before the checkpoint at 30: not a row the run wrote there
    before = (tmp_path / "eval.csv").read_text()
    with pytest.raises(ValueError, match=r"eval.csv: line 3 \(env_step 60, grad_step 60\) comes before line 4 "
                                         r"\(env_step 20, grad_step 20\), out of the order"):
        log.truncate_after(30, 30)
    assert (tmp_path / "eval.csv").read_text() == before


def test_rows_after_the_checkpoint_within_the_budget_are_still_dropped(tmp_path):
    log = _logger(tmp_path, budget=100)
    _evals(log, (0, 10, 20, 30, 100))
    log.truncate_after(20, 20)
    assert [ln.split(",")[0] for ln in (tmp_path / "eval.csv").read_text().splitlines()[1:]] == ["0", "10", "20"]


@pytest.mark.slow  # (a short training run: ~10 s)
def test_relive_train_resume_refuses_a_future_eval_row_in_one_line(tmp_path, capsys):
    from relive.cli import main

    run = tmp_path / "run"
    assert main(["train", "sac", "--env", "Pendulum-v1", "--run-dir", str(run), "--online-steps", "240", "--warmup",
                 "100", "--eval-every", "120", "--eval-episodes", "1", "--checkpoint-every", "120", "--batch-size",
                 "16", "--set", "agent.hidden=[8,8]", "--no-progress"]) == 0
    (run / "summary.json").unlink()  # (a run stopped after its last checkpoint)
    lines = (run / "eval.csv").read_text().splitlines()
    future = ",".join(["1000000", *lines[-1].split(",")[1:]])
    (run / "eval.csv").write_text("\n".join([*lines[:2], future, *lines[2:]]) + "\n")
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run / 'eval.csv'}: line 3 has env_step 1000000, beyond the run's 240" in err[0]
