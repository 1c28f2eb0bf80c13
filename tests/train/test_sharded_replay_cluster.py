"""The trainer with --replay-shards on a local multi-node Ray cluster (issue 49): its own module, so that no other
module's local Ray is running when the cluster starts (one Ray per process)."""

import json
from pathlib import Path

import pytest

from tests.train.test_sharded_replay import ARGS, check_shards
from tests.train.test_trainer import cfg_for


@pytest.mark.slow  # (a local three-node Ray cluster starts: ~40 s on 2 cores)
def test_on_a_multi_node_cluster_the_collectors_run_on_the_worker_nodes(tmp_path):
    """--ray-address: a head without CPUs and two one-CPU worker nodes (processes of this machine); the two collectors
    must run on the worker nodes, the shards anywhere; the run ends with exactly 600 env steps, every row once."""
    pytest.importorskip("ray")
    from relive.testing import local_ray_cluster
    from relive.train.trainer import train

    with local_ray_cluster(paths=[str(Path(__file__).resolve().parents[2])]) as (c, _):
        summary = train(cfg_for([*ARGS, "--ray-address", c.address], tmp_path / "r"))
    assert summary.num_online_env_steps == 600
    chunks = [json.loads(x) for x in (tmp_path / "r" / "chunks.jsonl").read_text().splitlines()]
    assert len({x["pid"] for x in chunks if "pid" in x}) == 2
    check_shards(tmp_path / "r", 600)
