"""Writes ``per_checkpoint_binary_tree/`` (+ ``_expected.json``): a PER buffer saved by the binary sum tree's code
(commit c5cbe73, before the 8-ary tree), with its probabilities and the next draws after the save. Kept so that
``test_sum_tree_layout.py`` can check that checkpoints written before the layout change still load and sample
the same. Do not regenerate with newer code (that would defeat the test)."""

import json
from pathlib import Path

import numpy as np

from relive.replay import PrioritizedSampler, ReplayBuffer
from relive.testing import random_transitions

out = Path(__file__).parent / "per_checkpoint_binary_tree"
buf = ReplayBuffer(37, (2,), (1,), sampler=PrioritizedSampler(0.6, 0.4), seed=3)
buf.add_offline(random_transitions(5, (2,), (1,), rng=1))
buf.extend(random_transitions(45, (2,), (1,), rng=2))  # wraps the 32-row ring
rng = np.random.default_rng(4)
for _ in range(6):
    b = buf.sample(16)
    buf.update(b.info, td_error=rng.standard_normal(16) * 3)
buf.save(out)
expected = {"probabilities": buf.sampler.probabilities().tolist(),
            "next_draws": [buf.sample(16).info.indices.tolist() for _ in range(5)]}
Path(f"{out}_expected.json").write_text(json.dumps(expected))
