#!/usr/bin/env bash
# The package as a user gets it (issue 33, item 3): build a wheel and an sdist, install the wheel into a new,
# clean venv (not the repository's), and use it from outside the checkout: the CLI, the typed public API, a tiny
# training run, a buffer checkpoint round trip. Fails on any setuptools deprecation warning in the build.
# Usage: .ci/package_smoke.sh [PYTHON]   (default: .venv/bin/python, which needs the `build` package)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf dist
"$PY" -m build --outdir dist . > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
if grep -i "deprecat" "$work/build.log"; then echo "package: the build printed a deprecation warning (above)"; exit 1; fi
wheel=$(ls dist/relive-*.whl)
ls dist/relive-*.tar.gz > /dev/null
python3 -m venv "$work/venv"
pip="$work/venv/bin/pip -q --disable-pip-version-check"
$pip install -c constraints.txt "$wheel" "gymnasium>=1.0"
cd "$work"   # away from the checkout: only the installed wheel can be imported
"$work/venv/bin/relive" --help > /dev/null
"$work/venv/bin/python" - <<'PY'
import importlib.resources
import pathlib

import numpy as np

import relive
from relive.replay import ReplayBuffer

assert "site-packages" in relive.__file__, relive.__file__
assert importlib.resources.files("relive").joinpath("py.typed").is_file(), "py.typed missing from the wheel"
assert list(importlib.resources.files("relive.experiments").joinpath("grids").iterdir()), "grids missing"
buf = ReplayBuffer(capacity=64, obs_shape=(3,), action_shape=(1,), seed=0)
n = 40
buf.extend(dict(obs=np.zeros((n, 3), np.float32), action=np.zeros((n, 1), np.float32),
                reward=np.arange(n, dtype=np.float32), next_obs=np.ones((n, 3), np.float32),
                terminated=np.zeros(n, bool), truncated=np.arange(n) % 10 == 9))
buf.save("ckpt")
again = ReplayBuffer.load("ckpt")
assert len(again) == n
assert np.array_equal(buf.sample(8).info.indices, again.sample(8).info.indices)
print("package: import, py.typed, grids, buffer save/load ok")
PY
"$work/venv/bin/relive" train sac --env Pendulum-v1 --online-steps 300 --warmup 200 --batch-size 32 \
    --eval-every 300 --eval-episodes 1 --run-dir run --no-progress > train.log 2>&1 || { cat train.log; exit 1; }
test -f run/summary.json && test -f run/config.json
echo "package: wheel $(basename "$wheel") built, installed clean and used (CLI, API, a training run)"
