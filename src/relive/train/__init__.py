"""Training: rollouts (one env, vector envs, Ray collectors), the offline -> online trainer, evaluation, run logging,
checkpoints, seed batching, D4RL-style dataset generation, the train / data command lines (envs: ``relive.envs``).

The package is also the trainer's entry point: ``relive.train(cfg, callbacks=[...])`` calls
:func:`relive.train.trainer.train` (a package's name on ``relive`` is its module once imported, so the module is what
is called)."""

import sys
import types

#: the training API beside the call, imported on first use (``import relive.train.X`` stays free of torch and envs)
_LAZY = {"Callback": "relive.train.callbacks", "StopTraining": "relive.train.callbacks", "get_preset": "relive.presets"}
__all__ = list(_LAZY)


class _TrainModule(types.ModuleType):
    def __call__(self, cfg=None, **kwargs):
        """``relive.train(cfg, callbacks=[...], resume_dir=...)``: :func:`relive.train.trainer.train`."""
        from relive.train.trainer import train  # (on call: `import relive.train.X` stays free of torch and envs)

        return train(cfg, **kwargs)

    def __getattr__(self, name: str) -> object:
        if name in _LAZY:
            import importlib

            return getattr(importlib.import_module(_LAZY[name]), name)
        raise AttributeError(f"module 'relive.train' has no attribute {name!r}")


sys.modules[__name__].__class__ = _TrainModule
