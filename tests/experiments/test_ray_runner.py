"""`relive bench run --ray-address` on a local multi-node Ray cluster (ray.cluster_utils.Cluster): a head with no
CPUs and worker nodes of one CPU each, so that two runs must go to two nodes. One cluster per module (Ray starts
slowly)."""

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from relive.experiments.grid import parse_grid
from relive.experiments.runner import run_dir_of, run_grid
from relive.testing import local_ray_cluster

ray = pytest.importorskip("ray")

from relive.experiments.ray_runner import run_grid_ray  # noqa: E402

TINY = ["--online-steps", "200", "--warmup", "100", "--eval-every", "100", "--eval-episodes", "1",
        "--batch-size", "16", "--set", "agent.hidden=[8,8]"]


@pytest.fixture(scope="module")
def cluster():
    with local_ray_cluster() as (c, workers):
        yield c, workers


def tiny_grid(name="tiny-ray", seeds=2, args=TINY):
    return parse_grid({"name": name, "seeds": seeds, "tasks": ["Pendulum-v1"],
                       "variant": [{"label": "sac", "preset": "sac", "args": list(args)}]})


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock keys (time/...): what a seeded run computes."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_runs_spread_over_nodes_and_equal_the_local_runs(cluster, tmp_path):
    """Two seeds on two one-CPU nodes (shared storage): one run per node, each finished; seed 1's metrics.jsonl
    equal to the same seeded run by the local runner (one seed: each local run costs seconds); a rerun skips them."""
    g = tiny_grid()
    on_ray = run_grid_ray(g, tmp_path / "ray", progress=False)
    assert sorted(o.status for o in on_ray) == ["finished", "finished"]
    assert len({o.node for o in on_ray}) == 2 and all(o.node for o in on_ray)
    for spec in g.runs():
        ray_dir = run_dir_of(tmp_path / "ray", spec)
        assert (ray_dir / "summary.json").is_file() and not (ray_dir / "crash.json").exists()
    local = run_grid(replace(g, seeds=(1,)), tmp_path / "local", workers=1, progress=False)
    assert [o.status for o in local] == ["finished"]
    spec = local[0].spec
    assert metrics(run_dir_of(tmp_path / "ray", spec)) == metrics(run_dir_of(tmp_path / "local", spec)) != []
    assert [o.status for o in run_grid_ray(g, tmp_path / "ray", progress=False)] == ["skipped", "skipped"]


@pytest.mark.slow
def test_gather_mode_brings_node_local_run_directories_to_the_root_and_records_crashes(cluster, tmp_path):
    """--storage gather: runs write scratch directories on their nodes; the head unpacks them under --root. A run
    whose training fails gets crash.json there; the head's claims are released at the end."""
    g = parse_grid({"name": "tiny-gather", "seeds": 1, "tasks": ["Pendulum-v1"],
                    "variant": [{"label": "sac", "preset": "sac", "args": TINY},
                                {"label": "broken", "preset": "sac", "args": [*TINY, "--set", "agent.num_qs=0"]}]})
    outs = {o.spec.label: o for o in run_grid_ray(g, tmp_path, storage="gather", progress=False)}
    assert outs["sac"].status == "finished" and outs["broken"].status == "crashed"
    ok = run_dir_of(tmp_path, outs["sac"].spec)
    assert (ok / "summary.json").is_file() and (ok / "metrics.jsonl").is_file() and "# ray node" in (
        ok / "stdout.log").read_text()
    crash = json.loads((run_dir_of(tmp_path, outs["broken"].spec) / "crash.json").read_text())
    assert any("num_qs" in line for line in crash["log_tail"])
    from relive.experiments.runner import claim_runs

    held, claims, _ = claim_runs([outs["broken"].spec], tmp_path)  # the head let go of its claim
    assert held and [c.release() for c in claims]


def test_shared_mode_refuses_a_root_the_nodes_do_not_see(cluster, tmp_path, monkeypatch):
    """A task that does not find the head's marker under --root (storage not shared) fails with a message that
    says so, recorded in crash.json on the head, and is not retried as a node failure would be."""
    import relive.experiments.ray_runner as rr

    monkeypatch.setattr(rr, "MARKER", ".relive-ray-root-head-only")  # the head writes a marker tasks won't look for
    g = tiny_grid("tiny-unshared", seeds=1)
    [out] = run_grid_ray(g, tmp_path, progress=False)
    assert out.status == "crashed"
    crash = (out.run_dir / "crash.json").read_text()
    assert "--storage gather" in crash and "not the head's directory" in crash


@pytest.mark.slow
def test_a_killed_node_s_run_is_rescheduled_resumed_and_finishes_once(cluster, tmp_path):
    """A run killed with its node after its first checkpoint is retried on the other node, resumes from that
    checkpoint (its log shows `--resume`) and finishes once: every logged step once, in order."""
    c, workers = cluster
    g = tiny_grid("tiny-kill", seeds=1, args=["--online-steps", "1200", "--warmup", "100", "--eval-every", "200",
                                               "--eval-episodes", "1", "--batch-size", "16", "--checkpoint-every",
                                               "200", "--set", "agent.hidden=[8,8]"])
    [spec] = g.runs()
    run_dir = run_dir_of(tmp_path, spec)
    result = {}
    thread = threading.Thread(target=lambda: result.update(outs=run_grid_ray(g, tmp_path, progress=False)))
    thread.start()
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoint").is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run_dir / "checkpoint").is_dir(), "no checkpoint within 120 s"
    node_id = (run_dir / "stdout.log").read_text().split("# ray node ")[1].split()[0]
    [victim] = [n for n in workers if n.node_id == node_id]
    c.remove_node(victim, allow_graceful=False)
    workers.remove(victim)
    workers.append(c.add_node(num_cpus=1))  # (the module's cluster keeps two worker nodes)
    thread.join(timeout=300)
    assert not thread.is_alive()
    [out] = result["outs"]
    log = (run_dir / "stdout.log").read_text()
    assert out.status == "finished" and out.node != node_id
    assert "--resume" in log and log.count("# ray node ") == 2
    steps = [r["env_step"] for r in metrics(run_dir) if "env_step" in r]
    assert steps == sorted(set(steps)) and steps[-1] >= 1100


def test_bench_run_refuses_ray_flags_without_ray_and_workers_with_it(tmp_path, capsys):
    """The Ray-only flags need --ray-address; --workers does not apply on a cluster (its resources decide); each
    refusal is one line, before any run or any Ray start. `bench list` shows the plans."""
    from relive.cli import main

    root = tmp_path / "runs"
    for extra, message in ((["--gpus-per-run", "1"], "--gpus-per-run goes with --ray-address"),
                           (["--storage", "gather"], "--storage goes with --ray-address"),
                           (["--ray-address", "auto", "--workers", "2"], "--workers: with --ray-address")):
        assert main(["bench", "run", "plans/rlpd-paper", "--root", str(root), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not root.exists()
    assert main(["bench", "list"]) == 0
    assert "plans/rlpd-paper" in capsys.readouterr().out


@pytest.mark.slow
def test_a_seed_batch_is_one_ray_task(cluster, tmp_path):
    """--seed-batch 2 on a DDQN grid: the two seeds train in one `relive train --seeds` process on one node."""
    g = parse_grid({"name": "tiny-batch", "seeds": 2, "tasks": ["CartPole-v1"],
                    "variant": [{"label": "ddqn", "preset": "ddqn",
                                 "args": ["--online-steps", "300", "--warmup", "100", "--eval-every", "150",
                                          "--eval-episodes", "1", "--batch-size", "16"]}]})
    outs = run_grid_ray(g, tmp_path, seed_batch=2, progress=False)
    assert [o.status for o in outs] == ["finished", "finished"] and len({o.node for o in outs}) == 1
    first, second = (run_dir_of(tmp_path, s) for s in g.runs())
    assert "--seeds 0,1" in (first / "stdout.log").read_text()
    assert "seeds batched in one process" in (second / "stdout.log").read_text()


def test_an_interrupted_head_cancels_its_tasks_and_lets_go_of_its_claims(cluster, tmp_path, monkeypatch):
    """Ctrl-C on the head (here: ray.wait raising) cancels every dispatched task, so none trains on after the head
    released the claim it was sent under (a rerun could dispatch the run again), and the claims are free."""
    from relive.experiments.runner import claim_runs

    cancelled, real_cancel = [], ray.cancel

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "wait", interrupted)
    monkeypatch.setattr(ray, "cancel", lambda ref, force=False: (cancelled.append(ref), real_cancel(ref, force=force)))
    g = tiny_grid("tiny-interrupted", seeds=1)
    with pytest.raises(KeyboardInterrupt):
        run_grid_ray(g, tmp_path, progress=False)
    assert len(cancelled) == 1
    with pytest.raises(ray.exceptions.RayError):
        ray.get(cancelled[0], timeout=120)
    held, claims, _ = claim_runs(g.runs(), tmp_path)
    assert held and [c.release() for c in claims]


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_retried_task_waits_for_the_dead_try_s_training_to_let_go_of_the_run(tmp_path):
    """A task retried after its node died can reach the run before the dead try's training is gone (its
    .relive.lock still held for a moment; on NFS until the lease expires): with the head's claim held, the node
    waits for the lock instead of calling the run busy -- here a training that fails at once is then started and
    recorded as crashed, not left as busy."""
    from relive.experiments.runner import RUN_LOCK, execute_job
    from relive.files import DirectoryLock

    g = parse_grid({"name": "tiny-retry", "seeds": 1, "tasks": ["Pendulum-v1"],
                    "variant": [{"label": "broken", "preset": "sac", "args": [*TINY, "--set", "agent.num_qs=0"]}]})
    [spec] = g.runs()
    run_dir = run_dir_of(tmp_path, spec)
    run_dir.mkdir(parents=True)
    dying = DirectoryLock(run_dir, RUN_LOCK, what="run")  # the dead try's training, about to go
    threading.Timer(1.0, dying.release).start()
    [out] = execute_job([spec], tmp_path, 1, None, False, claimed=True, busy_wait=30)
    assert out.status == "crashed" and (run_dir / "crash.json").is_file()
