"""The examples in examples/ run as is (as subprocesses, the way a reader runs them), at tiny budgets."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["--env-steps", "260", "--offline-rows", "150", "--warmup", "60", "--refresh-every", "50",
        "--batch-size", "32"]


@pytest.mark.parametrize("name", ["own_loop.py", "relive_agents.py"])
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_example_runs_as_is(name, tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *TINY], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # 260 steps of 200-step episodes: one episode; 200 gradient steps (after 60 warm-up steps); 4 ARB refreshes
    assert out.stdout.startswith("1 episodes") and "200 gradient steps" in out.stdout, out.stdout
