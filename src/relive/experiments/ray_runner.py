"""Run a grid on a Ray cluster (``relive bench run GRID --ray-address auto|HOST:PORT``).

Each job of the local runner (one run, or a seed batch: several new seeds of one variant and task in one
``relive train --seeds`` process) becomes one Ray task that asks for ``threads_per_run`` CPUs (and
``gpus_per_run`` GPUs); Ray places the tasks on the nodes and starts the next as resources free up. The task runs
the same ``relive train`` subprocess as the local runner, so a run directory is the same wherever it ran.

**The head is the lock table.** The head (the process running ``relive bench run``) claims every run it dispatches
with the local runner's claim (``running.lock`` under ``--root``, an ``flock`` on the head's file system) and holds
it until the run's task has returned: two heads on one root never dispatch one run twice, and a worker node holds
no claim, so a dead node leaves none behind. A dead head drops all its claims (the kernel releases them), and a
rerun of the grid resumes its runs. On the node, the training takes its run directory's own lock
(``.relive.lock``) as always; with shared storage that lock also keeps out a training started by hand elsewhere.

**Where run directories are written** (``storage``):

- ``"shared"`` (the default): ``--root`` is a path every node sees (NFS, a cluster file system, one machine):
  tasks write their run directories there directly, so checkpoints land where the head and every other node
  read them. Each task first checks that it sees the root (a marker file the head writes) and fails with a
  clear message otherwise.
- ``"gather"``: no shared storage. The head packs a started run's directory (its checkpoint) into the task, the
  task runs it in a node-local scratch directory and returns the whole directory, which the head unpacks under
  ``--root``. A run whose node dies restarts from the state the head last gathered (for a new run: from the
  beginning); whole directories (checkpoints and replay included) travel through Ray's object store.

**A killed node**: Ray retries its tasks elsewhere (``max_retries``); a retried run resumes from its last
checkpoint (shared storage) like any interrupted run, and a retried seed batch whose runs had started resumes them
one after another. Ray kills a dead worker's child processes, and the training is also started with Linux's
``PR_SET_PDEATHSIG`` (killed when the worker dies) for clusters where that clean-up is off, so a dead worker leaves
no training running on alone. A task that fails on every try is recorded as crashed
(``crash.json`` on the head, with Ray's error).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import uuid
import zlib
from pathlib import Path

from relive.experiments.grid import Grid, RunSpec
from relive.experiments.runner import (
    CRASHED,
    FINISHED,
    LOCK,
    LOG,
    RUN_LOCK,
    RunOutcome,
    claim_runs,
    execute_job,
    progress_bar,
    run_dir_of,
    seed_batches,
    status_line,
)

STORAGES = ("shared", "gather")
BUSY_WAIT = 120.0  # seconds a task waits for a run's training lock to go (a dead try's training; an NFS lease)
MARKER = ".relive-ray-root"  # the head writes MARKER-<token> under root/grid; a task on shared storage must see it


def run_grid_ray(grid: Grid, root: str | Path, address: str = "auto", storage: str = "shared",
                 threads_per_run: int = 1, gpus_per_run: float = 0.0, timeout: float | None = None,
                 progress: bool = True, seed_batch: int = 1, max_retries: int = 3) -> list[RunOutcome]:
    """Every unfinished run of ``grid`` as Ray tasks on the cluster at ``address`` (see the module docstring);
    the outcomes as the local runner's, each with the node that ran it."""
    import ray  # (optional heavy dependency: pip install 'relive[ray]')

    if storage not in STORAGES:
        raise ValueError(f"--storage must be one of {list(STORAGES)}, got {storage!r}")
    root = Path(root).resolve()
    specs = grid.runs()
    todo = [s for s in specs if not (run_dir_of(root, s) / FINISHED).is_file()]
    outcomes = [RunOutcome(s, "skipped", 0.0, run_dir_of(root, s)) for s in specs if s not in todo]
    if not todo:
        return outcomes
    jobs = seed_batches(todo, root, seed_batch)
    started_ray = not ray.is_initialized()
    if started_ray:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise OSError(f"--ray-address {address}: no Ray cluster there ({e}); start one with `ray start --head` "
                          "and `ray start --address HEAD:6379` on each node") from None
    marker = None
    if storage == "shared":
        (root / grid.name).mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex  # one marker per head: two heads on one root do not overwrite each other's
        marker = root / grid.name / f"{MARKER}-{token}"
        marker.write_text(token)
    task = ray.remote(_remote_job).options(num_cpus=threads_per_run, num_gpus=gpus_per_run,
                                           max_retries=max_retries)
    pending: dict = {}  # ref -> (held specs, their claims)
    held_claims = []
    try:
        for job in jobs:
            held, claims, early = claim_runs(job, root)
            outcomes += early
            held_claims += claims
            if not held:
                continue
            archives = None if storage == "shared" else {s.key: _pack(run_dir_of(root, s)) for s in held}
            ref = task.remote(held, str(root), storage, archives, marker.read_text() if marker else None,
                              threads_per_run, timeout, len(job) > 1)
            pending[ref] = (held, claims)
        bar = progress_bar(progress)
        with bar:
            line = bar.add_task(f"{grid.name} on Ray: {sum(len(h) for h, _ in pending.values())} runs "
                                f"({len(specs) - len(todo)} already done)",
                                total=sum(len(h) for h, _ in pending.values()))
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                ref = ready[0]
                held, claims = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except Exception as e:  # every try failed (node deaths past max_retries, a worker crash, ...)
                    results = [_failed(s, root, e) for s in held]
                for out in results:
                    if isinstance(out, tuple):  # gather: (outcome on the node, the run directory packed)
                        out = _gathered(root, *out)
                    outcomes.append(out)
                    bar.console.print(status_line(out), markup=False)
                    bar.advance(line)
                for claim in claims:
                    claim.release()
    finally:
        for ref in pending:  # interrupted (Ctrl-C, an error): no task runs on without the claim it was sent under
            ray.cancel(ref, force=True)
        for claim in held_claims:
            claim.release()
        if marker is not None:
            marker.unlink(missing_ok=True)
        if started_ray:
            ray.shutdown()
    return outcomes


def _remote_job(specs: list[RunSpec], root: str, storage: str, archives: dict | None, marker: str | None,
                threads_per_run: int, timeout: float | None, batched: bool):
    """One Ray task: the job's runs trained on this node (the head holds their claims)."""
    import ray  # (runs inside a Ray worker)

    node = ray.get_runtime_context().get_node_id()
    if storage == "shared":
        seen = Path(root) / specs[0].grid / f"{MARKER}-{marker}"
        if not seen.is_file() or seen.read_text() != marker:
            raise OSError(f"--root {root} is not the head's directory on node {node}: with --storage shared every "
                          "node must see --root at the same path (a shared file system); use --storage gather "
                          "otherwise")
        work = Path(root)
    else:
        assert archives is not None  # gather: the head sends each run's directory packed
        work = Path(tempfile.mkdtemp(prefix="relive-ray-"))
        for s in specs:
            _unpack(archives[s.key], run_dir_of(work, s))
    try:
        for s in specs:
            d = run_dir_of(work, s)
            d.mkdir(parents=True, exist_ok=True)
            with open(d / LOG, "a") as log:
                log.write(f"# ray node {node}\n")
        results = [RunOutcome(o.spec, o.status, o.seconds, o.run_dir, node)
                   for o in execute_job(specs, work, threads_per_run, timeout, batched, claimed=True,
                                     die_with_parent=True, busy_wait=BUSY_WAIT)]
        if storage == "shared":
            return results
        return [(o, _pack(run_dir_of(work, o.spec))) for o in results]
    finally:
        if storage != "shared":
            shutil.rmtree(work, ignore_errors=True)


def _failed(spec: RunSpec, root: Path, error: Exception) -> RunOutcome:
    """A run whose task failed on every try: crash.json on the head names Ray's error."""
    d = run_dir_of(root, spec)
    d.mkdir(parents=True, exist_ok=True)
    text = str(error).strip().splitlines()
    (d / CRASHED).write_text(json.dumps({"returncode": None, "ray_error": type(error).__name__,
                                         "log_tail": text[-30:], "seconds": 0.0}, indent=1))
    return RunOutcome(spec, "crashed", 0.0, d)


def _pack(run_dir: Path) -> bytes | None:
    """A run directory as a gzipped tar (the locks left out); None when there is nothing in it yet."""
    if not run_dir.is_dir() or not any(p.name not in (LOCK, RUN_LOCK) for p in run_dir.iterdir()):
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in sorted(run_dir.iterdir()):
            if p.name not in (LOCK, RUN_LOCK):
                tar.add(p, arcname=p.name)
    return buf.getvalue()


def _gathered(root: Path, out: RunOutcome, archive: bytes | None) -> RunOutcome:
    """A gather task's outcome on the head: its run directory unpacked under ``root``. A refused archive makes the
    run crashed (``crash.json`` names the archive and why; the run directory is left as it was); the others go on."""
    d = run_dir_of(root, out.spec)
    try:
        _unpack(archive, d)
    except ValueError as e:
        return _failed(out.spec, root, e)
    return RunOutcome(out.spec, out.status, out.seconds, d, out.node)


def _plain_entries(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's "data" filter (nothing absolute, nothing outside the destination), and plain files and
    directories only: a run directory holds no links or devices."""
    if member.name.startswith(("/", "\\")):  # (the "data" filter would strip the slash and extract it)
        raise tarfile.AbsolutePathError(member)
    member = tarfile.data_filter(member, path)
    if not (member.isfile() or member.isdir()):
        raise tarfile.FilterError(f"member {member.name!r} is not a plain file or directory")
    return member


def _unpack(archive: bytes | None, run_dir: Path) -> None:
    """Replace ``run_dir``'s contents (its lock files kept: the head holds the claim) with the archive's: each
    entry moved into place, ``summary.json`` last, so the run looks finished only once it is complete. Only plain
    files and directories under ``run_dir`` are extracted; an archive that is not a gzipped tar, or holds anything
    else (an absolute path, a ``..``, a link, a device), is one ``ValueError`` naming it, with nothing changed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if archive is None:
        return
    staged = Path(tempfile.mkdtemp(prefix=".gather-", dir=run_dir.parent))
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                tar.extractall(staged, filter=_plain_entries)
        except (tarfile.TarError, EOFError, zlib.error) as e:  # (FilterError, ReadError, a cut gzip stream)
            raise ValueError(f"gather archive of run {run_dir}: refused, the run directory is left as it was "
                             f"({type(e).__name__}: {' '.join(str(e).split())})") from None
        entries = sorted(staged.iterdir(), key=lambda p: p.name == FINISHED)
        if not (staged / CRASHED).exists():
            (run_dir / CRASHED).unlink(missing_ok=True)  # (an earlier try's, cleared on the node)
        for p in entries:
            if p.name in (LOCK, RUN_LOCK):
                continue
            target = run_dir / p.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(p, target)
    finally:
        shutil.rmtree(staged, ignore_errors=True)

