"""A run directory people can watch: metrics.jsonl, eval.csv, summary.json, the loggers of ``run.loggers``
(``--logger``: TensorBoard events in tb/, a Weights & Biases run, an MLflow run; :class:`Scalars`), and progress:
on a terminal a bar with env steps/s, gradient steps/s and the latest evaluation; elsewhere (a log file, a pipe,
the per-run logs of `relive bench run`) a plain line every ``$RELIVE_PROGRESS_SECONDS`` (default 30) with the
same figures and an ETA.

Every logger gets the same numbers: the finite numbers of each metrics.jsonl line (offline-phase lines under
``offline/`` against gradient steps, online lines against env steps) and the ``eval/`` numbers of each eval.csv row.
W&B runs offline (``$WANDB_MODE``, default offline: nothing leaves the machine; ``wandb sync
RUN_DIR/wandb/offline-run-*`` uploads later) in RUN_DIR/wandb, each row with its ``env_step`` and ``grad_step``;
MLflow logs into ``$MLFLOW_TRACKING_URI`` or else a file store in RUN_DIR/mlruns (experiment "relive", a run named
after the run directory, resumed by a resumed run), the step of each value as TensorBoard's."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from relive.extras import require
from relive.files import write_text_atomic


class Scalars:
    """A logger beside the run's files: ``scalars(values, env_step, grad_step, offline)`` (finite numbers; an
    ``offline`` row's keys start with ``offline/`` and its step is ``grad_step``), ``close()`` at the end."""

    def scalars(self, values: dict[str, float], env_step: int, grad_step: int, offline: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoard(Scalars):
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # (tensorboard: optional, the files carry the same numbers)

        self.writer = SummaryWriter(str(run_dir / "tb"))

    def scalars(self, values: dict[str, float], env_step: int, grad_step: int, offline: bool) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, grad_step if offline else env_step)

    def close(self) -> None:
        self.writer.close()


class WandB(Scalars):
    """A W&B run in ``run_dir/wandb``, offline unless ``$WANDB_MODE`` says otherwise; every row also carries
    ``env_step`` and ``grad_step`` (choose either as the x-axis)."""

    def __init__(self, run_dir: Path, config: dict | None):
        wandb = require("wandb", "--logger wandb")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "relive"), dir=str(run_dir),
                              mode=os.environ.get("WANDB_MODE", "offline"), name=run_dir.name, config=config,
                              settings=wandb.Settings(console="off", silent=True, save_code=False),
                              reinit="create_new")

    def scalars(self, values: dict[str, float], env_step: int, grad_step: int, offline: bool) -> None:
        self.run.log({**values, "env_step": env_step, "grad_step": grad_step})

    def close(self) -> None:
        self.run.finish()


class MLflow(Scalars):
    """An MLflow run in experiment "relive" of ``$MLFLOW_TRACKING_URI``, or of a file store in ``run_dir/mlruns``
    (MLflow 3 keeps its file store in maintenance mode and asks for an opt-in, given here for that store only);
    a resumed run logs on into the run of its run directory (tag ``relive.run_dir``)."""

    def __init__(self, run_dir: Path, config: dict | None):
        require("mlflow", "--logger mlflow")
        from mlflow.tracking import MlflowClient  # (mlflow-skinny: optional, imported only with --logger mlflow)

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        with _file_store_allowed(uri):  # (MLflow caches the store per URI: later calls need no opt-in)
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name("relive")
            experiment = found.experiment_id if found is not None else self.client.create_experiment("relive")
            tag = str(run_dir.resolve())
            runs = self.client.search_runs([experiment], filter_string=f"tags.`relive.run_dir` = '{tag}'")
            self.run_id = runs[0].info.run_id if runs else self.client.create_run(
                experiment, run_name=run_dir.name, tags={"relive.run_dir": tag}).info.run_id
        if config and not runs:
            from mlflow.entities import Param

            params = [Param(k, str(v)[:500]) for k, v in _flat(config)]
            for i in range(0, len(params), 100):  # (MLflow takes at most 100 params per batch)
                self.client.log_batch(self.run_id, params=params[i:i + 100])

    def scalars(self, values: dict[str, float], env_step: int, grad_step: int, offline: bool) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), grad_step if offline else env_step
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    old = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    if uri.startswith("file:"):
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = old


def _flat(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def check_loggers(loggers: Sequence[str]) -> None:
    """The packages ``loggers`` need, before a run starts: a MissingExtra (one line with the install command)."""
    for name, module in (("wandb", "wandb"), ("mlflow", "mlflow")):
        if name in loggers:
            require(module, f"--logger {name}")


def open_loggers(run_dir: Path, loggers: Sequence[str], config: dict | None = None) -> list[Scalars]:
    out: list[Scalars] = []
    for name in loggers:
        if name == "tensorboard":
            try:
                out.append(TensorBoard(run_dir))
            except ImportError:  # tensorboard is optional: the JSONL/CSV files carry the same numbers
                pass
        elif name == "wandb":
            out.append(WandB(run_dir, config))
        elif name == "mlflow":
            out.append(MLflow(run_dir, config))
        else:
            raise ValueError(f"run.loggers: unknown logger {name!r}")
    return out


class RunLogger:
    def __init__(self, run_dir: Path, total_env_steps: int, total_grad_steps_offline: int, progress: bool,
                 loggers: Sequence[str] = ("tensorboard",), config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.start = time.perf_counter()
        self._loggers = open_loggers(self.run_dir, loggers, config)
        self._eval_fields: list[str] | None = None
        self._bar = None
        self._plain = bool(progress) and not sys.stdout.isatty()  # progress as plain lines (not a terminal)
        self._totals = {"offline": total_grad_steps_offline, "online": total_env_steps}
        self._plain_every = _seconds_from_env("RELIVE_PROGRESS_SECONDS", 30.0)
        self._last_plain = -math.inf
        self._phase_start: dict[str, tuple[float, int]] = {}
        self._phases_done: set[str] = set()  # phases whose last line was printed (never again: Ray collectors call on)
        if progress and not self._plain:
            # (only when a progress bar is shown)
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
            self._bar.start()
            self._offline = self._bar.add_task("offline", total=max(total_grad_steps_offline, 1), info="",
                                               visible=total_grad_steps_offline > 0)
            self._online = self._bar.add_task("online ", total=max(total_env_steps, 1), info="")
        self.latest_eval = ""

    def progress(self, phase: str, done: int, info: str = "") -> None:
        if self._bar is not None:
            task = self._offline if phase == "offline" else self._online
            self._bar.update(task, completed=done, info=f"{info} {self.latest_eval}")
        elif self._plain:
            self._plain_line(phase, done, info)

    def _plain_line(self, phase: str, done: int, info: str) -> None:
        """At most one line per ``_plain_every`` seconds (and the phase's last step, once): steps done of the phase's
        total, the rates, an ETA from the phase's rate so far, the latest evaluation."""
        now = time.perf_counter()
        t0, done0 = self._phase_start.setdefault(phase, (now, done))
        total = self._totals.get(phase, 0)
        if phase in self._phases_done or (now - self._last_plain < self._plain_every and done < total):
            return
        if done >= total:
            self._phases_done.add(phase)
        self._last_plain = now
        rate = (done - done0) / max(now - t0, 1e-9)
        eta = _duration((total - done) / rate) if rate > 0 and done < total else "-"
        unit = "grad steps" if phase == "offline" else "env steps"
        print(f"{phase}: {done:,}/{total:,} {unit} ({100 * done / max(total, 1):.0f}%) {info} | ETA {eta} "
              f"{self.latest_eval}".rstrip(), flush=True)

    def metrics(self, step: int, values: dict) -> None:
        """One metrics.jsonl line (numbers as floats, ``grad_step`` an integer, strings such as ``phase`` kept) and
        the finite numbers to TensorBoard, against ``env_step`` (``grad_step`` is a field of the line)."""
        clean = {k: v if isinstance(v, str) else (float(v) if v is not None else math.nan) for k, v in values.items()}
        if "grad_step" in values:  # a count: an integer in the file
            clean["grad_step"] = int(values["grad_step"])
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"env_step": step, **clean}, allow_nan=True) + "\n")
        if self._loggers:  # offline-phase lines: under offline/ against gradient steps (env_step is 0)
            offline, grad_step = clean.get("phase") == "offline", int(clean.get("grad_step", 0))
            numbers = {f"offline/{k}" if offline else k: v for k, v in clean.items()
                       if not isinstance(v, str) and math.isfinite(v) and k != "grad_step"}
            for sink in self._loggers:
                sink.scalars(numbers, step, grad_step, offline)

    def evaluation(self, row: dict) -> None:
        path = self.run_dir / "eval.csv"
        if self._eval_fields is None:
            if path.is_file() and path.stat().st_size:
                with open(path) as f:
                    self._eval_fields = next(csv.reader(f))
            else:
                self._eval_fields = list(row)
                with open(path, "w", newline="") as f:
                    csv.writer(f).writerow(self._eval_fields)
        with open(path, "a", newline="") as f:
            csv.DictWriter(f, self._eval_fields, extrasaction="ignore").writerow(row)
        score = row.get("eval/normalized_score")
        has_score = score is not None and math.isfinite(score)
        shown = f"score {score:.1f}" if has_score else f"return {row['eval/return_mean']:.1f}"
        self.latest_eval = f"| eval @{row['env_step']}: {shown}"
        numbers = {k: v for k, v in row.items() if k.startswith("eval/") and isinstance(v, float) and math.isfinite(v)}
        for sink in self._loggers:
            sink.scalars(numbers, row["env_step"], int(row.get("grad_step", 0)), False)

    def print(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.console.print(msg)
        else:
            print(msg, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        for sink in self._loggers:
            sink.close()

    def truncate_after(self, env_step: int, grad_step: int) -> None:
        """On resume, drop log lines written after the checkpoint so files hold each step once."""
        path = self.run_dir / "metrics.jsonl"
        if path.is_file():  # offline lines share env_step 0: order by (env_step, grad_step)
            lines = [(ln, _json_line(path, i, ln, last=i == n - 1))
                     for i, ln, n in _numbered(path.read_text().splitlines())]
            keep = [ln for ln, d in lines
                    if d is not None and (d["env_step"], d.get("grad_step", 0)) <= (env_step, grad_step)]
            write_text_atomic(path, "".join(ln + "\n" for ln in keep))  # (a kill here keeps the old file)
        path = self.run_dir / "eval.csv"
        if path.is_file():
            header, rows = _eval_rows(path, max_env_step=self._totals["online"])
            if header:
                out = io.StringIO(newline="")
                w = csv.writer(out)
                w.writerow(header)
                w.writerows(r for step, r in rows if step <= (env_step, grad_step))
                write_text_atomic(path, out.getvalue())


def _numbered(lines: list[str]):
    """(index, line, count) of the non-blank lines."""
    kept = [ln for ln in lines if ln.strip()]
    return [(i, ln, len(kept)) for i, ln in enumerate(kept)]


def _json_line(path: Path, i: int, line: str, *, last: bool) -> dict | None:
    """A metrics.jsonl line; None for a partial last line (a kill during the write: it is dropped)."""
    try:
        d = json.loads(line)
        if not isinstance(d, dict) or "env_step" not in d:
            problem = "has no env_step"
        elif not all(_is_count(d.get(k, 0)) for k in ("env_step", "grad_step")):
            problem = f"has an env_step / grad_step that is not a count ({d.get('env_step')!r}, {d.get('grad_step')!r})"
        else:
            return d
    except json.JSONDecodeError as e:
        problem = f"is not valid JSON ({e})"
    if last:
        return None
    raise ValueError(f"{path}: line {i + 1} {problem}; the log is corrupted (not a partial last line)")


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _eval_rows(path: Path,
               max_env_step: int | None = None) -> tuple[list[str], list[tuple[tuple[int, int], list[str]]]]:
    """eval.csv's header and its rows with their (env_step, grad_step). A row is whole when it has one number per
    header column; a partial last row (a kill during the write) is dropped, any other bad row is refused, naming
    the file and line (as metrics.jsonl's). The run appends rows in order of (env_step, grad_step), so a row after
    a later one is refused too, and so is (``max_env_step``: the run's budget of online env steps) a row no
    evaluation of the run could have written: a row from the future is refused, never dropped on resume."""
    with open(path, newline="") as f:
        try:
            records = [(n, row) for n, row in _csv_lines(f) if row]
        except csv.Error as e:
            raise ValueError(f"{path}: {e}; the log is corrupted") from None
    if not records:
        return [], []
    (_, header), body = records[0], records[1:]
    if header[:2] != ["env_step", "grad_step"] or len(set(header)) != len(header):
        raise ValueError(f"{path}: line 1 is not eval.csv's header (env_step, grad_step, ...): {header[:4]}; the log "
                         "is corrupted")
    rows, last = [], None
    for i, (line, row) in enumerate(body):
        problem = _eval_problem(row, len(header))
        if problem is None:
            step = (int(row[0]), int(row[1]))
            if max_env_step is not None and step[0] > max_env_step:
                raise ValueError(f"{path}: line {line} has env_step {step[0]}, beyond the run's {max_env_step} online "
                                 "env steps (no evaluation of this run wrote it); the log is corrupted")
            if last is not None and step < last[1]:
                raise ValueError(f"{path}: line {last[0]} (env_step {last[1][0]}, grad_step {last[1][1]}) comes "
                                 f"before line {line} (env_step {step[0]}, grad_step {step[1]}), out of the order "
                                 "the run writes; the log is corrupted")
            rows.append((step, row))
            last = (line, step)
        elif i < len(body) - 1:
            raise ValueError(f"{path}: line {line} {problem}; the log is corrupted (not a partial last line)")
    return header, rows


def _csv_lines(f):
    """(line number, row) of a CSV file."""
    reader = csv.reader(f)
    for row in reader:
        yield reader.line_num, row


def _eval_problem(row: list[str], width: int) -> str | None:
    if len(row) != width:
        return f"has {len(row)} fields, the header {width}"
    try:
        steps = int(row[0]), int(row[1])
        [float(x) for x in row[2:] if x != ""]  # (a column a row did not have is written empty)
    except ValueError:
        return f"holds a field that is not a number ({','.join(row)[:80]!r})"
    if min(steps) < 0:
        return "has a negative env_step or grad_step"
    return None


def _seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"${name} must be a number of seconds >= 0, got {text!r}")
    return value


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
