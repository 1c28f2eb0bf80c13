"""A run directory, read the one way every command reads it: ``relive train --resume``, ``relive eval``,
``relive export``, ``relive plot``, ``relive pld distill``, a run given as a base policy or as a data source.

A run directory is outside input like a dataset or a checkpoint (someone else's run, or an edited one), so what it
may decide is limited (docs/guarantees.md, "What a run directory, a grid file and a checkpoint may decide"):

- **Trust, never.** A setting that lets a file that can run code be loaded (``agent.trust_code``, any config field
  named in :data:`TRUST_FIELDS`) is the current call's alone: ``open_run_dir(path, trusted=...)`` sets it from its
  argument (a command line's ``--trust-code``), whatever config.json says. A run never writes it as true either
  (:func:`without_trust`, applied by the trainer to what it saves).
- **Where anything is written, never.** Every command works in :attr:`RunDirectory.path`, the directory it was
  given; ``run.run_dir`` stays as config.json recorded it (where the run was created: a resume compares it with
  the checkpoint's record to tell another run's checkpoint) and is never used as a location.
- The inputs it was made from (``data.dataset``, ``agent.base_policy``, ``run.init_from``) are read as the
  command line's would be: data-only formats unless the call trusts code, every check of their loaders, and on a
  resume the checkpoint's hashes (the dataset's rows, the base policy's digest).

The files of the layout live here too: ``config.json``, ``agent_final/`` (the finished agent) and ``checkpoint/``
(the last checkpoint, read by ``relive.train.checkpoint``), all inside the directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from relive.config import ExperimentConfig, load_config
from relive.replay.checkpoint import CheckpointError, load_tree

CONFIG_FILE = "config.json"
AGENT_FINAL = "agent_final"
CHECKPOINT = "checkpoint"  # (its reader: relive.train.checkpoint)
#: config fields that switch on code loading: set only by the current call (``--trust-code``), never by a file
TRUST_FIELDS = ("trust_code",)
#: the command-line flag that says it
TRUST_FLAG = "--trust-code"


@dataclass(frozen=True)
class RunDirectory:
    """A run directory as read by :func:`open_run_dir`: its ``path`` (where the run is, whatever its config says),
    its ``config`` (trust from the call) and ``notes``: what config.json said that was not taken (one line each)."""

    path: Path
    config: ExperimentConfig
    notes: tuple[str, ...] = ()

    @property
    def agent_final(self) -> Path:
        return self.path / AGENT_FINAL

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    def final_agent_state(self) -> dict:
        """The state of ``agent_final/`` (hash-checked, data only); a ValueError naming the run when it has none."""
        if not self.agent_final.is_dir():
            raise ValueError(f"{self.path} has no {AGENT_FINAL}/ (the run has not finished)")
        try:
            return load_tree(self.agent_final, kind="agent")
        except CheckpointError as e:
            raise ValueError(f"{self.path}: {e}") from None


def open_run_dir(path: str | Path, *, trusted: bool = False, where: str | None = None) -> RunDirectory:
    """Read the run directory ``path``: its config.json (migrated from earlier versions, its env id checked never to
    import a module), with every :data:`TRUST_FIELDS` setting set to ``trusted`` -- the caller's opt-in, never the
    file's. ``where`` prefixes the errors (default: the path), e.g. ``"cannot resume RUN"``. ``trusted=True`` for
    an agent that loads no code is refused (nothing to trust)."""
    path = Path(path)
    where = where or str(path)
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        raise ValueError(f"{where}: no {CONFIG_FILE} (not a relive run directory)")
    try:
        cfg = load_config(cfg_path)
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError, RecursionError) as e:
        # (json.JSONDecodeError is a ValueError; JSON of the wrong shape raises the others)
        raise ValueError(f"{where}: its {CONFIG_FILE} is not a relive configuration "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
    except OSError as e:
        raise ValueError(f"{where}: its {CONFIG_FILE} cannot be read ({e.strerror or e})") from None
    if cfg.env.id:
        from relive.envs import check_env_id  # (gymnasium, optional: only once a run is read)

        check_env_id(cfg.env.id)  # (an env id from a file never imports a module)
    cfg, dropped = without_trust(cfg)
    notes = tuple(f"{cfg_path}: {key} = true is ignored: trust comes only from the command that runs "
                  f"({TRUST_FLAG} on its command line, trusted=True in Python), never from a file" for key in dropped)
    return RunDirectory(path, with_trust(cfg, trusted, where), notes)


def trust_keys(cfg: ExperimentConfig) -> list[str]:
    """The dotted keys of every trust field the configuration has (``["agent.trust_code"]`` for residual SAC)."""
    keys = []
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        if dataclasses.is_dataclass(value):
            keys += [f"{section.name}.{f.name}" for f in dataclasses.fields(value) if f.name in TRUST_FIELDS]
    return keys


def _set(cfg: ExperimentConfig, key: str, value: bool) -> ExperimentConfig:
    section, name = key.split(".")
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})


def without_trust(cfg: ExperimentConfig) -> tuple[ExperimentConfig, list[str]]:
    """``cfg`` with every trust field false, and the keys that were true. What a run saves (config.json, its
    checkpoints' record) goes through it: trust is the command's, not a property of the run."""
    dropped = [k for k in trust_keys(cfg) if _get(cfg, k) is not False]
    for key in dropped:
        cfg = _set(cfg, key, False)
    return cfg, dropped


def with_trust(cfg: ExperimentConfig, trusted: bool, where: str = "") -> ExperimentConfig:
    """``cfg`` with its trust fields set to the call's ``trusted``; ``trusted=True`` where the agent has none is a
    ValueError (an opt-in that would do nothing is refused, not ignored)."""
    keys = trust_keys(cfg)
    if trusted is True and not keys:
        raise ValueError(f"{TRUST_FLAG}: {where + ': ' if where else ''}agent {cfg.agent_kind!r} loads no file that "
                         "can run code (only a residual agent's base policy can be one); nothing to trust")
    for key in keys:
        cfg = _set(cfg, key, trusted is True)
    return cfg


def _get(cfg: ExperimentConfig, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)

