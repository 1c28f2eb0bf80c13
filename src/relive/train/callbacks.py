"""Callbacks: your code at the loop's events, and an early stop (``relive.train(cfg, callbacks=[...])``).

A :class:`Callback` overrides any of ``on_step`` (after every gradient step and every collected chunk of env steps),
``on_evaluation`` (after every evaluation, with its row: the numbers eval.csv gets) and ``on_checkpoint`` (after every
checkpoint is written). Any of them stops the run by returning ``False`` or raising :class:`StopTraining`; the run then
ends as a finished run does -- a checkpoint (where the collection allows one: one env between episodes), the final
evaluation, ``agent_final/`` and summary.json (``status = "stopped"``) -- at the end of the step it was asked in.
Any other exception propagates (the run stops where it stands, resumable from its last checkpoint).
The hooks the trainer calls and that the loop dispatches (:func:`dispatch`) are these three; they mirror
Stable-Baselines3's ``BaseCallback._on_step`` (return False to stop) and Keras' ``model.stop_training``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path


class StopTraining(Exception):  # noqa: N818 (a request, not an error: Keras and fastai name theirs alike)
    """Raised from a callback: stop the run cleanly at the end of this step (as returning ``False`` does)."""


class Callback:
    """Override what you need; a method that returns ``False`` (or raises :class:`StopTraining`) stops the run.

    ``on_step(env_steps, grad_steps)``: after every gradient step and every collected chunk (the counts so far).
    ``on_evaluation(row)``: after every evaluation; ``row`` holds ``env_step``, ``grad_step``, ``eval/return_mean``,
    ``eval/return_std``, ``eval/normalized_score``, ... (the eval.csv row).
    ``on_checkpoint(run_dir, env_steps, grad_steps)``: after a checkpoint was written into ``run_dir``.
    """

    def on_step(self, env_steps: int, grad_steps: int) -> bool | None:
        return None

    def on_evaluation(self, row: Mapping[str, float]) -> bool | None:
        return None

    def on_checkpoint(self, run_dir: Path, env_steps: int, grad_steps: int) -> bool | None:
        return None


class StepFunction(Callback):
    """``train(on_step=fn)``: ``fn(env_steps, grad_steps)`` as a callback (its return value is ignored; tests raise
    from it to simulate a run killed at an arbitrary point)."""

    def __init__(self, fn: Callable[[int, int], object]):
        self.fn = fn

    def on_step(self, env_steps: int, grad_steps: int) -> bool | None:
        self.fn(env_steps, grad_steps)
        return None


def as_callbacks(callbacks: Iterable[Callback] | None, on_step: Callable[[int, int], object] | None = None
                 ) -> list[Callback]:
    """The run's callbacks: ``callbacks`` (each a :class:`Callback`, else a ValueError naming it), then ``on_step``."""
    out = list(callbacks or ())
    for cb in out:
        if not isinstance(cb, Callback):
            raise ValueError(f"callbacks: {cb!r} is not a relive.train.Callback (subclass it and override on_step, "
                             "on_evaluation or on_checkpoint)")
    return out + ([StepFunction(on_step)] if on_step is not None else [])


def dispatch(callbacks: Iterable[Callback], event: str, *args: object) -> str | None:
    """Call ``event`` on every callback (all of them, in order, even after one asked to stop); the reason to stop
    (which callback asked, and how) when one returned ``False`` or raised :class:`StopTraining`, else None."""
    reason = None
    for cb in callbacks:
        try:
            answer = getattr(cb, event)(*args)
        except StopTraining as e:
            answer, why = False, f"raised StopTraining({e})" if str(e) else "raised StopTraining"
        else:
            why = "returned False"
        if answer is False and reason is None:
            reason = f"{type(cb).__name__}.{event} {why}"
    return reason
