"""examples/jax_sac.py runs as is (a subprocess, as tests/test_examples.py runs the other examples), at a tiny budget;
skipped without the extra "jax"."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flax", reason="flax is not installed (the extra \"jax\": pip install -c constraints.txt "
                                   "-e \".[jax]\")")
pytest.importorskip("optax", reason="optax is not installed (the extra \"jax\")")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow  # the jit alone takes several seconds on 2 cores
def test_jax_sac_example_runs_as_is(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / "jax_sac.py"), "--env-steps", "260", "--offline-rows",
                          "150", "--warmup", "60", "--batch-size", "32"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # 260 steps of 200-step episodes: one episode; 200 gradient steps after 60 warm-up steps; a finite critic loss
    assert out.stdout.startswith("1 episodes, 200 gradient steps") and "q_loss nan" not in out.stdout, out.stdout
