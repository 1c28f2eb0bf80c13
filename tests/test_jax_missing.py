"""Without the extra "jax", ``Batch.to_jax`` says in one line which install adds it (runs with or without jax)."""

from __future__ import annotations

import builtins
import importlib

import numpy as np
import pytest

from relive.extras import MissingExtra
from relive.types import Batch, SampleInfo


def test_to_jax_without_jax_names_the_extra(monkeypatch):
    def missing(real):
        def fake(name, *args, **kwargs):
            if name.split(".")[0] == "jax":
                raise ModuleNotFoundError(f"No module named {name!r}", name="jax")
            return real(name, *args, **kwargs)
        return fake

    monkeypatch.setattr(builtins, "__import__", missing(builtins.__import__))
    monkeypatch.setattr(importlib, "import_module", missing(importlib.import_module))
    z = np.zeros(2, np.float32)
    info = SampleInfo(np.arange(2), np.zeros(2, np.int64), np.full(2, 0.5), np.ones(2, np.float32), np.ones(2, np.int8))
    batch = Batch(z, z, z, z, np.zeros(2, bool), np.zeros(2, bool), info)
    with pytest.raises(MissingExtra, match=r"Batch.to_jax needs jax, which is not installed: pip install -c "
                                           r"constraints.txt -e \"\.\[jax\]\"") as e:
        batch.to_jax()
    assert "\n" not in str(e.value)
