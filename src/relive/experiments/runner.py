"""Run every run of a grid, each in its own subprocess, in a pool sized to the machine.

A run is finished when its directory holds ``summary.json`` (written last by the trainer); a rerun of the
grid skips finished runs and resumes interrupted ones from their last checkpoint (``relive train
--resume``), so a sweep survives being stopped and restarted. A run that exits non-zero is recorded in
``crash.json`` (exit code, last lines of its log) and the others go on.

Who runs a run: two locks of one mechanism (``relive.files.DirectoryLock``: an ``flock`` the kernel drops when its
holder dies, however it dies). The training process holds the run directory's own lock (``.relive.lock``) for the
whole run -- the same lock a `relive train` started by hand takes, so a runner and a person never both run it. A
runner first claims the run (``running.lock``, held until its training has exited, so that two runners do not
both start one), then checks that no training holds the run (one started by a runner that was killed alone keeps
running and keeps its lock: the run is "busy"), then starts the training. The runner does not hand its lock down:
the training takes its own, so a training started by hand and one started by a runner are held the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from relive.experiments.grid import Grid, RunSpec
from relive.files import DirectoryLock, LockedError
from relive.train.seed_batch import batchable_agents

FINISHED = "summary.json"
CRASHED = "crash.json"
LOG = "stdout.log"
LOCK = "running.lock"  # a runner's claim on the run (a DirectoryLock held while it executes the run)
RUN_LOCK = ".relive.lock"  # the training's own lock of its run directory (relive.train.trainer.RUN_LOCK)


@dataclass(frozen=True)
class RunOutcome:
    spec: RunSpec
    status: str  # "finished" (now), "skipped" (earlier), "busy" (another runner or training has it), "crashed"
    seconds: float
    run_dir: Path
    node: str = ""  # the Ray node that executed it (`relive bench run --ray-address`); "" when local


def run_dir_of(root: Path, spec: RunSpec) -> Path:
    """``root/grid/label/task/seed_N``: plain names only (``RunSpec.key`` checks them), so never outside root."""
    return Path(root) / spec.grid / spec.key


def train_command(spec: RunSpec, run_dir: Path) -> list[str]:
    """The `relive train` invocation of one run; resumes when the directory holds a started run (``config.json``:
    from its last checkpoint, or from the beginning when it stopped before the first one)."""
    base = [sys.executable, "-m", "relive.cli", "--debug", "train"]  # --debug: the crash log keeps the traceback
    if (run_dir / "config.json").exists():  # (a resume does not inherit --trust-code: the runner says it again when
        # the run was given it -- by `relive bench run --trust-code` (Grid.trust_code) or a RunSpec made in Python;
        # a grid file's args cannot hold it)
        return [*base, "--resume", str(run_dir), *(["--trust-code"] if "--trust-code" in spec.args else [])]
    # (progress on: its output is the run's log file, not a terminal, so the run prints a plain progress line with
    # an ETA every $RELIVE_PROGRESS_SECONDS, default 30 -- `tail -f` a run's log to follow it)
    return [*base, spec.preset, "--env", spec.task, "--seed", str(spec.seed), "--run-dir", str(run_dir),
            *spec.args]


def default_workers(threads_per_run: int = 1) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, threads_per_run))


def _run_in_use(run_dir: Path) -> bool:
    """True when a training process holds the run (its DirectoryLock), e.g. one whose runner was killed alone."""
    try:
        DirectoryLock(run_dir, RUN_LOCK, what="run").release()
    except LockedError:
        return True
    return False


def _take_lock(run_dir: Path) -> DirectoryLock | None:
    """Claim a run for this runner: its lock, or None when another runner has claimed it or a training process
    (started by a runner killed since, or by hand) still runs it. A claim or run lock whose holder died is free."""
    try:
        claim = DirectoryLock(run_dir, LOCK, what="run")
    except LockedError:
        return None
    if _run_in_use(run_dir):
        claim.release()
        return None
    return claim


def execute(spec: RunSpec, root: Path, threads_per_run: int = 1, timeout: float | None = None) -> RunOutcome:
    return execute_job([spec], root, threads_per_run, timeout, batched=False)[0]


def claim_runs(specs: list[RunSpec], root: Path) -> tuple[list[RunSpec], list[DirectoryLock], list[RunOutcome]]:
    """Lock the run directories that still need their run: (the held specs, their claims, outcomes of the
    finished and busy)."""
    held, claims, outcomes = [], [], []
    for spec in specs:
        run_dir = run_dir_of(root, spec)
        if (run_dir / FINISHED).is_file():
            outcomes.append(RunOutcome(spec, "skipped", 0.0, run_dir))
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        claim = _take_lock(run_dir)
        if claim is None:
            outcomes.append(RunOutcome(spec, "busy", 0.0, run_dir))
            continue
        if (run_dir / FINISHED).is_file():  # finished by the runner that held it until now
            claim.release()
            outcomes.append(RunOutcome(spec, "skipped", 0.0, run_dir))
            continue
        held.append(spec)
        claims.append(claim)
    return held, claims, outcomes


def execute_job(specs: list[RunSpec], root: Path, threads_per_run: int, timeout: float | None,
             batched: bool, claimed: bool = False, die_with_parent: bool = False,
             busy_wait: float = 0.0) -> list[RunOutcome]:
    """One training process for the specs it can lock: ``relive train`` of one run, or (``batched``) of several
    new seeds of one (variant, task) with ``--seeds``, whose output goes to the first run's log (the others' logs
    say so). A run is finished when its directory holds the summary (and, alone, the process exited 0); a run that
    a training started by hand took in between is "busy"; every other held run gets a ``crash.json`` with the exit
    code and the log's last lines. The claims are released at the end.

    ``claimed``: the caller (the Ray runner's head) already holds every run's claim; only a training that runs one
    (``.relive.lock``) makes it busy -- after waiting up to ``busy_wait`` seconds for that training to let go (a
    task retried after its node died can arrive before the dead try's training is gone, or before a network file
    system releases its lock). ``die_with_parent``: the training is killed when this process dies (Linux),
    so that a Ray worker killed with its node leaves no training running on alone."""
    held: list[RunSpec]
    claims: list[DirectoryLock]
    outcomes: list[RunOutcome]
    if claimed:
        held, claims, outcomes = [], [], []
        for spec in specs:
            d = run_dir_of(root, spec)
            d.mkdir(parents=True, exist_ok=True)
            if (d / FINISHED).is_file():
                outcomes.append(RunOutcome(spec, "skipped", 0.0, d))
            elif _run_in_use(d) and not _freed(d, busy_wait):
                outcomes.append(RunOutcome(spec, "busy", 0.0, d))
            else:
                held.append(spec)
        if batched and any((run_dir_of(root, s) / "config.json").exists() for s in held):
            # a batch started before (its task retried after its node died): each run resumed on its own
            return outcomes + [o for s in held for o in execute_job([s], root, threads_per_run, timeout, False,
                                                                    True, die_with_parent, busy_wait)]
    else:
        held, claims, outcomes = claim_runs(specs, root)
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
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,  # (takes each run's lock)
                                    preexec_fn=_die_with_parent if die_with_parent else None)
            code = _wait(proc, timeout)
        seconds = time.perf_counter() - start
        tail = None
        for spec, d in zip(held, dirs, strict=True):
            if (d / FINISHED).is_file() and (batched or code == 0):
                outcomes.append(RunOutcome(spec, "finished", seconds, d))
                continue
            if code != 0 and _run_in_use(d):  # a `relive train` started by hand took the run first: it has it
                outcomes.append(RunOutcome(spec, "busy", seconds, d))
                continue
            if tail is None:
                tail = (dirs[0] / LOG).read_text(errors="replace").splitlines()[-30:]
            (d / CRASHED).write_text(json.dumps({"returncode": code, "command": cmd, "seconds": seconds,
                                                 "log_tail": tail}, indent=1))
            outcomes.append(RunOutcome(spec, "crashed", seconds, d))
    finally:
        for claim in claims:
            claim.release()  # (the lock file stays: unlinking it could let two runners hold two files)
    return outcomes


def _freed(run_dir: Path, seconds: float, every: float = 0.5) -> bool:
    """True once no training holds the run, polled for up to ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(every)
        if not _run_in_use(run_dir):
            return True
    return False


def _die_with_parent() -> None:
    """In the training's process before it starts (Linux): SIGKILL when the process that started it dies."""
    import ctypes  # (Linux prctl; nothing elsewhere)

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


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
    jobs = seed_batches(todo, root, seed_batch)
    bar = progress_bar(progress)
    with bar:
        task = bar.add_task(f"{grid.name}: {len(todo)} runs ({len(specs) - len(todo)} already done)",
                            total=len(todo))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures: list[Future[RunOutcome | list[RunOutcome]]] = [
                pool.submit(execute, job[0], root, threads_per_run, timeout) if len(job) == 1 else
                pool.submit(execute_batch, job, root, threads_per_run, timeout) for job in jobs]
            for fut in as_completed(futures):
                result = fut.result()
                for out in result if isinstance(result, list) else [result]:
                    outcomes.append(out)
                    bar.console.print(status_line(out), markup=False)
                    bar.advance(task)
    return outcomes


def seed_batches(todo: list[RunSpec], root: Path, seed_batch: int) -> list[list[RunSpec]]:
    """Jobs: single runs, or groups of up to ``seed_batch`` new runs of one (variant, task)."""
    if seed_batch < 1:
        raise ValueError(f"--seed-batch must be >= 1, got {seed_batch}")
    if seed_batch == 1:
        return [[s] for s in todo]
    batchable = batchable_agents()
    presets = sorted({s.preset for s in todo} - set(batchable))
    if presets:
        raise ValueError(f"--seed-batch {seed_batch}: seeds batched in one process support the presets "
                         f"{batchable}; this grid's unfinished runs use {presets} (run it without --seed-batch)")
    jobs: list[list[RunSpec]] = []
    groups: dict[tuple, list[RunSpec]] = {}
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
    """Several new seeds of one (variant, task) in one ``relive train --seeds`` process (see ``execute_job``)."""
    return execute_job(specs, root, threads_per_run, timeout, batched=True)


def status_line(out: RunOutcome) -> str:
    """One line per run as the sweep goes: ok, busy (another runner, or a training started by hand, runs it), done
    by another runner (finished while this runner waited), or CRASHED with where to look."""
    mark = {"finished": "ok", "busy": "busy: another process runs it",
            "skipped": "done by another runner", "crashed": "CRASHED"}[out.status]
    tail = f" -> see {out.run_dir / CRASHED}" if out.status == "crashed" else ""
    where = f" on node {out.node[:8]}" if out.node else ""
    return f"[{mark}] {out.spec.key} ({out.seconds:.0f} s{where}){tail}"


def progress_bar(enabled: bool):
    # (only when a progress bar is shown)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled)


_seed_batches = seed_batches  # (the earlier name, kept for callers of it)
