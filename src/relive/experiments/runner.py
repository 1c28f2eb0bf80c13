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
LOCK = "running.lock"  # PIDs of the runner executing the run and of its training: a second runner skips the run
# while either lives (a runner killed alone leaves its training running; the training's PID keeps the run held)


@dataclass(frozen=True)
class RunOutcome:
    spec: RunSpec
    status: str  # "finished" (now), "skipped" (earlier), "busy" (another runner has it), "crashed"
    seconds: float
    run_dir: Path


def run_dir_of(root: Path, spec: RunSpec) -> Path:
    return Path(root) / spec.grid / spec.key


def train_command(spec: RunSpec, run_dir: Path) -> list[str]:
    """The `relive train` invocation of one run; resumes when the directory holds a started run (``config.json``:
    from its last checkpoint, or from the beginning when it stopped before the first one)."""
    base = [sys.executable, "-m", "relive.cli", "--debug", "train"]  # --debug: the crash log keeps the traceback
    if (run_dir / "config.json").exists():  # (a resume does not inherit --trust-code: the grid file says it again)
        return [*base, "--resume", str(run_dir), *(["--trust-code"] if "--trust-code" in spec.args else [])]
    return [*base, spec.preset, "--env", spec.task, "--seed", str(spec.seed), "--run-dir", str(run_dir),
            "--no-progress", *spec.args]


def default_workers(threads_per_run: int = 1) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, threads_per_run))


def _lock_pids(lock: Path) -> list[int]:
    return [int(x) for x in lock.read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # raises when no such process
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a live process of another user
    return True


def _take_lock(run_dir: Path) -> bool:
    """Claim a run for this process; False when a live process holds it (the runner that wrote the lock or the
    training it started). A stale lock -- every PID in it gone -- is taken over."""
    lock = run_dir / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pids = _lock_pids(lock)
            except (ValueError, FileNotFoundError):
                pids = []
            live = [pid for pid in pids if pid > 0 and _alive(pid)]
            if live:
                return pids[0] == os.getpid()
            lock.unlink(missing_ok=True)  # its runner and its training died: take the run over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def execute(spec: RunSpec, root: Path, threads_per_run: int = 1, timeout: float | None = None) -> RunOutcome:
    return _execute([spec], root, threads_per_run, timeout, batched=False)[0]


def _claim(specs: list[RunSpec], root: Path) -> tuple[list[RunSpec], list[RunOutcome]]:
    """Lock the run directories that still need their run: (the held specs, outcomes of the finished and busy)."""
    held, outcomes = [], []
    for spec in specs:
        run_dir = run_dir_of(root, spec)
        if (run_dir / FINISHED).is_file():
            outcomes.append(RunOutcome(spec, "skipped", 0.0, run_dir))
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        if not _take_lock(run_dir):
            outcomes.append(RunOutcome(spec, "busy", 0.0, run_dir))
            continue
        held.append(spec)
    return held, outcomes


def _execute(specs: list[RunSpec], root: Path, threads_per_run: int, timeout: float | None,
             batched: bool) -> list[RunOutcome]:
    """One training process for the specs it can lock: ``relive train`` of one run, or (``batched``) of several
    new seeds of one (variant, task) with ``--seeds``, whose output goes to the first run's log (the others' logs
    say so). A run is finished when its directory holds the summary (and, alone, the process exited 0); every other
    held run gets a ``crash.json`` with the exit code and the log's last lines. The locks are released at the end."""
    held, outcomes = _claim(specs, root)
    if not held:
        return outcomes
    dirs = [run_dir_of(root, s) for s in held]
    try:
        for d in dirs:
            (d / CRASHED).unlink(missing_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_run), MKL_NUM_THREADS=str(threads_per_run),
                   RELIVE_NUM_THREADS=str(threads_per_run))
        first = held[0]
        if batched:
            template = str(dirs[0].parent / "seed_{seed}")  # (RunSpec.key: label/task/seed_N)
            cmd = [sys.executable, "-m", "relive.cli", "--debug", "train", first.preset, "--env", first.task,
                   "--seeds", ",".join(str(s.seed) for s in held), "--run-dir", template, "--no-progress",
                   *first.args]
        else:
            cmd = train_command(first, dirs[0])
        start = time.perf_counter()
        for d in dirs[1:]:
            with open(d / LOG, "a") as log:
                log.write(f"$ {' '.join(cmd)}\n(seeds batched in one process: output in {dirs[0] / LOG})\n")
        with open(dirs[0] / LOG, "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            for d in dirs:  # the training holds its runs even if this runner dies
                (d / LOCK).write_text(f"{os.getpid()} {proc.pid}")
            code = _wait(proc, timeout)
        seconds = time.perf_counter() - start
        tail = None
        for spec, d in zip(held, dirs, strict=True):
            if (d / FINISHED).is_file() and (batched or code == 0):
                outcomes.append(RunOutcome(spec, "finished", seconds, d))
                continue
            if tail is None:
                tail = (dirs[0] / LOG).read_text(errors="replace").splitlines()[-30:]
            (d / CRASHED).write_text(json.dumps({"returncode": code, "command": cmd, "seconds": seconds,
                                                 "log_tail": tail}, indent=1))
            outcomes.append(RunOutcome(spec, "crashed", seconds, d))
    finally:
        for d in dirs:
            (d / LOCK).unlink(missing_ok=True)
    return outcomes


def _wait(proc: subprocess.Popen, timeout: float | None) -> int:
    """The training's exit code; -9 when it ran past ``timeout`` (killed). Interrupted (Ctrl-C): the training is
    terminated too, not left running on its own."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9
    except BaseException:
        proc.terminate()
        proc.wait()
        raise


def run_grid(grid: Grid, root: str | Path, workers: int | None = None, threads_per_run: int = 1,
             timeout: float | None = None, progress: bool = True, seed_batch: int = 1) -> list[RunOutcome]:
    """``seed_batch`` > 1: up to that many new seeds of one (variant, task) train in one process, their networks
    batched (``relive train --seeds``; DDQN only). A started run (``config.json``) is resumed on its own, as without
    batching; a batch that crashes leaves each of its unfinished runs a ``crash.json``."""
    root = Path(root)
    specs = grid.runs()
    workers = workers or default_workers(threads_per_run)
    outcomes: list[RunOutcome] = []
    todo = [s for s in specs if not (run_dir_of(root, s) / FINISHED).is_file()]
    outcomes += [RunOutcome(s, "skipped", 0.0, run_dir_of(root, s)) for s in specs if s not in todo]
    if not todo:
        return outcomes
    jobs = _seed_batches(todo, root, seed_batch)
    bar = _progress(progress)
    with bar:
        task = bar.add_task(f"{grid.name}: {len(todo)} runs ({len(specs) - len(todo)} already done)",
                            total=len(todo))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(execute, job[0], root, threads_per_run, timeout) if len(job) == 1 else
                       pool.submit(execute_batch, job, root, threads_per_run, timeout) for job in jobs]
            for fut in as_completed(futures):
                result = fut.result()
                for out in result if isinstance(result, list) else [result]:
                    outcomes.append(out)
                    bar.console.print(status_line(out), markup=False)
                    bar.advance(task)
    return outcomes


def _seed_batches(todo: list[RunSpec], root: Path, seed_batch: int) -> list[list[RunSpec]]:
    """Jobs: single runs, or groups of up to ``seed_batch`` new runs of one (variant, task)."""
    if seed_batch < 1:
        raise ValueError(f"--seed-batch must be >= 1, got {seed_batch}")
    if seed_batch == 1:
        return [[s] for s in todo]
    from relive.train.seed_batch import SUPPORTED

    presets = sorted({s.preset for s in todo} - set(SUPPORTED))
    if presets:
        raise ValueError(f"--seed-batch {seed_batch}: seeds batched in one process support the presets "
                         f"{list(SUPPORTED)}; this grid's unfinished runs use {presets} (run it without --seed-batch)")
    jobs, groups = [], {}
    for s in todo:
        if (run_dir_of(root, s) / "config.json").exists():
            jobs.append([s])  # started: resumed on its own from its checkpoint
        else:
            groups.setdefault((s.label, s.task, tuple(s.args), s.preset), []).append(s)
    for group in groups.values():
        jobs += [group[i:i + seed_batch] for i in range(0, len(group), seed_batch)]
    return jobs


def execute_batch(specs: list[RunSpec], root: Path, threads_per_run: int = 1,
                  timeout: float | None = None) -> list[RunOutcome]:
    """Several new seeds of one (variant, task) in one ``relive train --seeds`` process (see ``_execute``)."""
    return _execute(specs, root, threads_per_run, timeout, batched=True)


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
