"""Run every run of a grid, each in its own subprocess, in a pool sized to the machine.

A run is finished when its directory holds ``summary.json`` (written last by the trainer); a rerun of the
grid skips finished runs and resumes interrupted ones from their last checkpoint (``relive train
--resume``), so a sweep survives being stopped and restarted. A run that exits non-zero is recorded in
``crash.json`` (exit code, last lines of its log) and the others go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from relive.experiments.grid import Grid, RunSpec

FINISHED = "summary.json"
CRASHED = "crash.json"
LOG = "stdout.log"
LOCK = "running.lock"  # holds the PID of the runner executing the run: a second runner on the same root skips it


@dataclass(frozen=True)
class RunOutcome:
    spec: RunSpec
    status: str  # "finished" (now), "skipped" (earlier), "busy" (another runner has it), "crashed"
    seconds: float
    run_dir: Path


def run_dir_of(root: Path, spec: RunSpec) -> Path:
    return Path(root) / spec.grid / spec.key


def train_command(spec: RunSpec, run_dir: Path) -> list[str]:
    """The `relive train` invocation of one run; resumes when the directory already holds a run (config.json: from
    its last checkpoint, or from the start when it was stopped before its first one -- a fresh `relive train`
    would refuse the directory)."""
    base = [sys.executable, "-m", "relive.cli", "--debug", "train"]  # --debug: the crash log keeps the traceback
    if (run_dir / "config.json").exists():
        return [*base, "--resume", str(run_dir)]
    return [*base, spec.preset, "--env", spec.task, "--seed", str(spec.seed), "--run-dir", str(run_dir),
            "--no-progress", *spec.args]


def default_workers(threads_per_run: int = 1) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, threads_per_run))


def _take_lock(run_dir: Path) -> bool:
    """Claim a run for this process; False when a live process holds it (a stale lock is taken over)."""
    lock = run_dir / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
                os.kill(pid, 0)  # raises when no such process
                return pid == os.getpid()
            except (ValueError, ProcessLookupError, FileNotFoundError):
                lock.unlink(missing_ok=True)  # its runner died: take the run over
                continue
            except PermissionError:
                return False  # a live process of another user
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def execute(spec: RunSpec, root: Path, threads_per_run: int = 1, timeout: float | None = None) -> RunOutcome:
    run_dir = run_dir_of(root, spec)
    if (run_dir / FINISHED).is_file():
        return RunOutcome(spec, "skipped", 0.0, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not _take_lock(run_dir):
        return RunOutcome(spec, "busy", 0.0, run_dir)
    try:
        return _execute_locked(spec, run_dir, threads_per_run, timeout)
    finally:
        (run_dir / LOCK).unlink(missing_ok=True)


def _execute_locked(spec: RunSpec, run_dir: Path, threads_per_run: int, timeout: float | None) -> RunOutcome:
    (run_dir / CRASHED).unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_run), MKL_NUM_THREADS=str(threads_per_run),
               RELIVE_NUM_THREADS=str(threads_per_run))
    cmd = train_command(spec, run_dir)
    start = time.perf_counter()
    with open(run_dir / LOG, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                  check=False)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -9
    seconds = time.perf_counter() - start
    if code == 0 and (run_dir / FINISHED).is_file():
        return RunOutcome(spec, "finished", seconds, run_dir)
    tail = (run_dir / LOG).read_text(errors="replace").splitlines()[-30:]
    (run_dir / CRASHED).write_text(json.dumps({"returncode": code, "command": cmd, "seconds": seconds,
                                               "log_tail": tail}, indent=1))
    return RunOutcome(spec, "crashed", seconds, run_dir)


def run_grid(grid: Grid, root: str | Path, workers: int | None = None, threads_per_run: int = 1,
             timeout: float | None = None, progress: bool = True) -> list[RunOutcome]:
    root = Path(root)
    specs = grid.runs()
    workers = workers or default_workers(threads_per_run)
    outcomes: list[RunOutcome] = []
    todo = [s for s in specs if not (run_dir_of(root, s) / FINISHED).is_file()]
    outcomes += [RunOutcome(s, "skipped", 0.0, run_dir_of(root, s)) for s in specs if s not in todo]
    if not todo:
        return outcomes
    bar = _progress(progress)
    with bar:
        task = bar.add_task(f"{grid.name}: {len(todo)} runs ({len(specs) - len(todo)} already done)",
                            total=len(todo))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(execute, s, root, threads_per_run, timeout): s for s in todo}
            for fut in as_completed(futures):
                out = fut.result()
                outcomes.append(out)
                bar.console.print(status_line(out), markup=False)
                bar.advance(task)
    return outcomes


def status_line(out: RunOutcome) -> str:
    """One line per run as the sweep goes: ok, busy (another runner has it), done by another runner (finished
    while this runner waited), or CRASHED with where to look."""
    mark = {"finished": "ok", "busy": "busy: another runner has it",
            "skipped": "done by another runner", "crashed": "CRASHED"}[out.status]
    tail = f" -> see {out.run_dir / CRASHED}" if out.status == "crashed" else ""
    return f"[{mark}] {out.spec.key} ({out.seconds:.0f} s){tail}"


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled)
