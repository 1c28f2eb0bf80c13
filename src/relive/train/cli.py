"""`relive train`, `relive presets`, `relive demo`."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import textwrap

from relive.cli import build_parser, non_negative_int, positive_int
from relive.config import LOGGERS, MAX_NUM_ENVS, ReplayConfig, check_env_kwargs, describe, override
from relive.presets import PRESETS, get_preset
from relive.registry import AGENTS, ALIASES, REPLAYS, load_builtins, replay_names
from relive.train.seed_batch import train_seeds


def add_parsers(subparsers) -> None:
    """The ``train``, ``presets`` and ``demo`` commands."""
    _add_train_parser(subparsers)
    _add_presets_parser(subparsers)
    _add_demo_parser(subparsers)


def _add_train_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train an agent: offline pre-training on a dataset, then online fine-tuning",
        description="Train PRESET on ENV. Options left out keep the preset's values (see `relive presets`). "
                    "The run directory receives config.json, metrics.jsonl, eval.csv, summary.json, TensorBoard "
                    "events and checkpoints; `relive train --resume RUN_DIR` continues a stopped run.")
    p.add_argument("preset", nargs="?", help=f"one of {sorted(PRESETS)}")
    p.add_argument("--env", help="Gymnasium environment id, e.g. Pendulum-v1, Hopper-v5, CartPole-v1")
    p.add_argument("--env-kwargs", type=_env_kwargs, metavar="JSON", help="keyword arguments of gymnasium.make for "
                   "every env of the run, a JSON object, e.g. '{\"g\": 9.81}' (env.kwargs); a custom env: register it "
                   "in a file you name with --plugin")
    p.add_argument("--dataset", help="offline dataset: a local Minari dataset id or directory (see `relive data "
                   "list`), a LeRobot dataset directory (meta/info.json + parquet), a D4RL-format .hdf5 file, or a "
                   "relive .npz")
    load_builtins()
    replays = "; ".join([f"{n}: {e.doc}" for n, e in sorted(REPLAYS.items())]
                        + [f"{n}: {a.doc} (= {a.target} with {', '.join(a.sets) or 'its defaults'})"
                           for n, a in sorted(ALIASES.items())])
    p.add_argument("--replay", choices=replay_names(), metavar="NAME", help=f"replay strategy ({replays}); its "
                   "options: --set replay.NAME.OPTION=VALUE, listed by `relive presets --show NAME`; a mixture's "
                   "parts: --set replay.mixture.online.name=per, replay.mixture.online.per.OPTION=VALUE")
    p.add_argument("--base-policy", metavar="PATH", help="frozen base policy of a residual agent (residual_sac): "
                   "same as --set agent.base_policy=PATH")
    p.add_argument("--trust-code", action="store_true", default=None, help="let --base-policy be a file that can "
                   "run code when loaded (TorchScript, torch.export .pt2): only for files you trust; for this process "
                   "only (config.json records it false: a resume, eval, export say it again; docs/guarantees.md)")
    _add_collection_arguments(p)
    _add_schedule_arguments(p)
    p.add_argument("--console", action="store_true", help="a person in the loop from a browser: the env's live "
                   "frames, hold a key (or a gamepad's button) to take over, pause / resume (intervention.kind = "
                   "console; needs pip install 'relive[console]'; docs/hil.md)")
    p.add_argument("--console-host", help="address the console listens on (default 127.0.0.1: this machine only; "
                   "another address prints a URL with a token, required by every request)")
    p.add_argument("--console-port", type=_port, help="the console's port (default 8765; 0: any free port)")
    p.add_argument("--threads", type=positive_int, help="torch threads (default 1)")
    p.add_argument("--device", help="torch device of the agent: cpu (default), cuda[:N], mps")
    p.add_argument("--replay-device", help="keep the replay columns on this torch device and sample / update "
                   "priorities there (uniform, per, symmetric, symmetric_per; e.g. cuda with --device cuda); "
                   "default (or none): NumPy on the host")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="any other setting, e.g. --set agent.num_qs=10 --set agent.hidden=[64,64] (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    p.add_argument("--logger", type=_loggers, metavar="NAMES", help="where metrics go besides metrics.jsonl and "
                   f"eval.csv: a comma list of {', '.join(LOGGERS)}, or none (default tensorboard; wandb: an offline "
                   "run in RUN_DIR/wandb, pip install wandb; mlflow: a file store RUN_DIR/mlruns or "
                   "$MLFLOW_TRACKING_URI, pip install mlflow-skinny)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint, as it "
                   "was configured; --device, --replay-device, --threads and --no-progress may change where it runs "
                   "(e.g. a GPU run on a CPU machine: --device cpu --replay-device none)")
    p.add_argument("--allow-other-base", action="store_true", help="residual_sac: load a checkpoint (--resume) or "
                   "--init-from agent trained on a base policy whose digest differs from the base given now "
                   "(refused otherwise: a residual corrects the base it was trained on)")
    p.set_defaults(func=run_train)


def _add_collection_arguments(p) -> None:
    """`relive train`: how the envs are stepped, the seed and where the run goes."""
    p.add_argument("--num-envs", type=_num_envs, help="environments stepped together (a Gymnasium vector env, one "
                   "policy call per step for all), each its own replay stream; env steps count every env's (default 1, "
                   f"at most {MAX_NUM_ENVS} and at most --capacity)")
    p.add_argument("--vector-mode", choices=("sync", "async"), help="with --num-envs > 1: sync (one process, "
                   "default) or async (a subprocess per env)")
    p.add_argument("--collectors", type=positive_int, help="parallel collector processes on Ray feeding this "
                   "learner's buffer (each steps --num-envs envs with a CPU copy of the policy); starts a local Ray "
                   "unless --ray-address is given (needs pip install 'relive[ray]'; docs/scaling.md)")
    p.add_argument("--replay-shards", type=positive_int, help="with --collectors: the replay as a service of this many "
                   "Ray shard actors, drawn exactly as one buffer over their union, each checkpointed under "
                   "<run-dir>/replay and restarted from there if it dies (relive.replay.remote; docs/scaling.md)")
    p.add_argument("--ray-address", help="with --collectors: join this Ray cluster (e.g. auto, HOST:6379, "
                   "ray://HOST:10001) instead of starting a local Ray")
    p.add_argument("--seed", type=int, help="run seed (agent, buffer, env, warm-up); default 0")
    p.add_argument("--run-dir", help="run directory: a new or empty one (default: runs/<preset>-<env>-seed<N>-<time>); "
                   "one process runs it at a time")
    p.add_argument("--seeds", help="several seeds of this configuration trained in one process, their networks "
                   "batched (DDQN only; e.g. 0,1,2): --run-dir must contain {seed}, each seed's own run directory "
                   "(relive.train.seed_batch)")


def _add_schedule_arguments(p) -> None:
    """`relive train`: the schedule: phases, update ratio, warm-up, batches, evaluation, logs, checkpoints."""
    p.add_argument("--offline-steps", type=non_negative_int, help="gradient steps on the dataset before going online")
    p.add_argument("--online-steps", type=non_negative_int, help="online environment steps executed (a budget of "
                   "interactions: unstored probing steps count)")
    p.add_argument("--utd", type=positive_int, help="gradient steps per stored environment step "
                   "(update-to-data ratio)")
    p.add_argument("--chunk", type=positive_int, help="env steps collected before each burst of chunk x utd updates")
    p.add_argument("--grad-steps-per-chunk", type=non_negative_int, help="gradient steps after each chunk instead of "
                   "chunk x utd (RL Zoo's gradient_steps with train_freq = --chunk); the UTD ratio must then be 1 "
                   "(--utd 1 with a preset such as rlpd)")
    p.add_argument("--stop-at-return", type=float, help="stop the online phase at the first evaluation whose mean "
                   "return reaches this (the ReaPER protocol: train until the reward threshold)")
    p.add_argument("--init-from", metavar="RUN_DIR", help="start from the agent a finished run saved (its "
                   "agent_final/): e.g. one offline pre-training shared by several fine-tuning runs")
    p.add_argument("--warmup", type=non_negative_int, help="env steps stored before the first online update "
                   "(random actions unless --warmup-policy agent)")
    p.add_argument("--warmup-policy", choices=("random", "agent"), help="who acts during the warm-up: uniform "
                   "random actions, or the (pre-trained) agent's exploration policy")
    p.add_argument("--batch-size", type=positive_int, help="rows per gradient step")
    p.add_argument("--capacity", type=positive_int, help="replay capacity in rows (offline + online)")
    p.add_argument("--offline-fraction", type=float, help="offline share of each batch (symmetric replay)")
    p.add_argument("--eval-every", type=positive_int, help="env steps between evaluations")
    p.add_argument("--eval-episodes", type=positive_int, help="episodes per evaluation")
    p.add_argument("--log-every", type=positive_int, help="env steps between metrics.jsonl / TensorBoard lines")
    p.add_argument("--checkpoint-every", type=positive_int, help="env steps between checkpoints (each lands on the "
                   "next episode boundary)")
    p.add_argument("--offline-checkpoint-every", type=positive_int, help="offline gradient steps between checkpoints "
                   "(one is always written at the end of the offline phase)")


def _add_presets_parser(subparsers) -> None:
    ps = subparsers.add_parser("presets", help="list the training presets and their settings")
    ps.add_argument("name", nargs="?", help="show one preset's settings (same as --show NAME)")
    ps.add_argument("--show", metavar="NAME", help="a preset's settings with their docs, or the options of a replay "
                    "strategy or an agent; `replays` / `agents` list them")
    ps.add_argument("--json", action="store_true", help="a preset's configuration as config.json holds it")
    ps.set_defaults(func=run_presets)


def _add_demo_parser(subparsers) -> None:
    d = subparsers.add_parser("demo", help="the README's main job: a short offline-to-online experiment with a plot",
                              description="Generates a small Pendulum-v1 dataset, pre-trains Cal-QL offline, then "
                                          "fine-tunes online with three replay strategies and plots return and the "
                                          "online share of sampled batches; the three runs go in parallel, "
                                          "one process each (README: measured time).")
    d.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    d.add_argument("--seed", type=int, default=0, help="seed of the dataset and of every run (default 0)")
    d.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    d.add_argument("--workers", type=positive_int, help="parallel runs (default: one per variant, at most the "
                   "number of CPU cores)")
    d.set_defaults(func=run_demo)


def _env_kwargs(text: str) -> dict:
    """argparse ``type`` of ``--env-kwargs``: a JSON object of keyword arguments (``config.check_env_kwargs``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): give an object, e.g. '{{\"g\": 9.81}}'") from None
    try:
        check_env_kwargs(value, "--env-kwargs")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _loggers(text: str) -> list[str]:
    """argparse ``type`` of ``--logger``: a comma list of :data:`relive.config.LOGGERS` (or ``none``)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return []
    bad = [n for n in names if n not in LOGGERS]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected a comma list of distinct names out of {', '.join(LOGGERS)} (or "
                                         f"none), got {text!r}")
    return names


def _port(text: str) -> int:
    """argparse ``type`` of ``--console-port``: 0 to 65535."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {value}")
    return value


def _num_envs(text: str) -> int:
    """argparse ``type`` of ``--num-envs``: 1 to MAX_NUM_ENVS."""
    value = positive_int(text)
    if value > MAX_NUM_ENVS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_NUM_ENVS} environments, got {value}")
    return value


FLAG_TO_SETTING = {
    "env": "env.id", "dataset": "data.dataset", "base_policy": "agent.base_policy", "replay": "replay.name",
    "env_kwargs": "env.kwargs", "logger": "run.loggers",
    "seed": "run.seed", "run_dir": "run.run_dir", "num_envs": "env.num_envs", "vector_mode": "env.vector_mode",
    "collectors": "collectors.num", "ray_address": "collectors.ray_address",
    "replay_shards": "replay.shards",
    "offline_steps": "schedule.num_offline_grad_steps", "online_steps": "schedule.num_online_env_steps",
    "chunk": "schedule.env_steps_per_chunk", "grad_steps_per_chunk": "schedule.grad_steps_per_chunk",
    "stop_at_return": "run.stop_at_return", "init_from": "run.init_from", "warmup": "schedule.num_warmup_env_steps",
    "warmup_policy": "schedule.warmup_policy",
    "batch_size": "schedule.batch_size", "capacity": "replay.capacity",
    "eval_every": "run.eval_every_env_steps", "eval_episodes": "run.eval_episodes",
    "log_every": "run.log_every_env_steps",
    "checkpoint_every": "run.checkpoint_every_env_steps",
    "offline_checkpoint_every": "run.checkpoint_every_offline_grad_steps", "threads": "run.num_threads",
    "device": "run.device", "replay_device": "replay.device", "trust_code": "agent.trust_code",
    "console_host": "intervention.console_host", "console_port": "intervention.console_port",
}


HOST_WORDS = ("none", "null", "host")  # --replay-device none: NumPy on the host (the default)


def _flag_setting(flag: str, value) -> str:
    if flag == "replay_device" and str(value).lower() in HOST_WORDS:
        return "replay.device=null"
    return f"{FLAG_TO_SETTING[flag]}={_json(value)}"


def resume_settings(args: argparse.Namespace) -> list[str]:
    """``--resume RUN_DIR`` with where / how the run goes on (--device, --replay-device, --threads, --no-progress,
    or ``--set`` of those settings); any other option is refused by name instead of being ignored."""
    # (gymnasium, optional: `relive --help` imports this module)
    from relive.train.trainer import RESUME_SETTINGS

    defaults = vars(build_parser().parse_args(["train", "--resume", "RUN_DIR"]))
    allowed = {"device", "replay_device", "threads", "no_progress", "trust_code", "set", "resume", "func", "command",
               "debug", "plugin", "allow_other_base", "console_host", "console_port"}  # (--plugin: imports the
    # code, changes nothing; the console's address: where it runs)
    given = sorted(k for k, v in vars(args).items() if k not in allowed and v != defaults.get(k))
    if given:
        names = ", ".join("--" + k.replace("_", "-") if k != "preset" else f"PRESET ({args.preset})" for k in given)
        raise ValueError(f"--resume continues a run as it was configured: {names} cannot change it (only --device, "
                         "--replay-device, --threads, --no-progress, --trust-code and --set of "
                         + ", ".join(RESUME_SETTINGS)
                         + "); start a new run for other settings")
    sets = [_flag_setting(f, getattr(args, f)) for f in ("device", "replay_device", "threads", "trust_code",
                                                          "console_host", "console_port")
            if getattr(args, f, None) is not None]
    return sets + (["run.progress=false"] if args.no_progress else []) + list(args.set)


def config_from_args(args: argparse.Namespace):
    cfg = get_preset(args.preset)
    if getattr(args, "trust_code", None) and not hasattr(cfg.agent, "trust_code"):
        raise ValueError(f"--trust-code: preset {args.preset!r} ({cfg.agent_kind}) loads no base policy; only a "
                         "residual agent's --base-policy may be a file that runs code")
    sets = []
    for flag in FLAG_TO_SETTING:
        value = getattr(args, flag, None)
        if value is not None:
            sets.append(_flag_setting(flag, value))
    if getattr(args, "utd", None) is not None:  # one setting (RLPD's once-per-env-step actor is a rule of the agent)
        sets.append(f"schedule.utd_ratio={args.utd}")
    if getattr(args, "no_progress", False):
        sets.append("run.progress=false")
    if getattr(args, "console", False):
        sets.append('intervention.kind="console"')
    cfg = override(cfg, sets)
    if getattr(args, "offline_fraction", None) is not None:  # an option of the chosen (symmetric) replay
        if not hasattr(cfg.replay.options, "offline_fraction"):
            raise ValueError(f"--offline-fraction: replay {cfg.replay.name!r} has no offline/online split (use a "
                             f"mixture: --replay mixture, or its shorthands symmetric, symmetric_per)")
        cfg = override(cfg, [f"replay.{cfg.replay.name}.offline_fraction={args.offline_fraction}"])
    cfg = override(cfg, list(args.set))
    if getattr(args, "env", None) is None and cfg.data.dataset and not cfg.schedule.num_online_env_steps \
            and not any(s.startswith("env.id=") for s in args.set):  # offline only, without an environment
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, id=""))
    return cfg


def _json(value) -> str:
    return json.dumps(value)


def run_train(args: argparse.Namespace) -> int:
    # (gymnasium, optional: `relive --help` imports this module)
    from relive.train.trainer import train

    if getattr(args, "seeds", None):
        return _train_seeds(args)
    if args.resume:
        summary = train(resume_dir=args.resume, resume_settings=resume_settings(args),
                        allow_other_base=args.allow_other_base)
    else:
        if not args.preset:
            raise SystemExit("relive train: give a PRESET (see `relive presets`) or --resume RUN_DIR")
        summary = train(config_from_args(args), allow_other_base=args.allow_other_base)
    start = "after the offline phase" if summary.num_offline_grad_steps else "at the start"
    first = f"{start}: {summary.offline_return:.1f}, " if math.isfinite(summary.offline_return) else ""
    print(f"done: {summary.run_dir} | final return {summary.final_return:.1f} ({first}best: "
          f"{summary.best_return:.1f}) | {summary.seconds:.0f} s")
    return 0


def _train_seeds(args: argparse.Namespace) -> int:
    """``--seeds 0,1,2``: the seeds in one process (relive.train.seed_batch); exit 1 if any of them failed."""
    if args.resume or args.seed is not None:
        raise ValueError("--seeds trains new runs of the listed seeds: it does not combine with --resume or --seed")
    if getattr(args, "allow_other_base", False):  # (seed batching loads no state of another base)
        raise ValueError("--allow-other-base does not combine with --seeds: train each seed on its own")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers (e.g. 0,1,2), got {args.seeds!r}") from None
    if not args.preset or not args.run_dir or "{seed}" not in args.run_dir:
        raise ValueError("--seeds needs a PRESET and a --run-dir containing {seed} (e.g. runs/x/seed_{seed})")
    cfgs = []
    for seed in seeds:
        one = copy.copy(args)
        one.seed, one.run_dir, one.seeds = seed, args.run_dir.format(seed=seed), None
        cfgs.append(config_from_args(one))
    failed = 0
    for seed, out in zip(seeds, train_seeds(cfgs), strict=True):
        if isinstance(out, BaseException):
            failed += 1
            print(f"seed {seed}: FAILED: {type(out).__name__}: {out}")
        else:
            print(f"done: {out.run_dir} | final return {out.final_return:.1f} (best: {out.best_return:.1f}) | "
                  f"{out.seconds:.0f} s")
    return 1 if failed else 0


def run_presets(args: argparse.Namespace) -> int:
    name = args.show or args.name
    if name:
        return show(name, as_json=args.json)

    width = max(map(len, PRESETS)) + 2
    for name, fn in PRESETS.items():
        cfg, doc = fn(), " ".join((fn.__doc__ or "").split())
        s = cfg.schedule
        settings = (f"[{cfg.agent_kind}, replay {cfg.replay.label}, utd {s.utd_ratio}, chunk {s.env_steps_per_chunk}, "
                    f"offline {s.num_offline_grad_steps:,} grad steps, online {s.num_online_env_steps:,} env steps]")
        print(textwrap.fill(f"{doc} {settings}", 110, initial_indent=f"{name:{width}s}", subsequent_indent=" " * width))
    print("\n`relive presets --show NAME` shows a preset's settings (or a replay's / an agent's options, or "
          "`replays` / `agents`); `relive train --help` the options.")
    return 0


def show(name: str, as_json: bool = False) -> int:
    """Print a preset's full configuration, or a registered replay's / agent's options, each with its doc."""
    load_builtins()
    if name in ("replays", "agents"):
        table = REPLAYS if name == "replays" else AGENTS
        for n, e in sorted(table.items()):
            print(f"{n:18s} {e.doc}")
        if table is REPLAYS:
            for n, a in sorted(ALIASES.items()):
                print(f"{n:18s} {a.doc} (shorthand: {a.target} with {', '.join(a.sets) or 'its defaults'})")
        return 0
    if name in PRESETS:
        cfg = get_preset(name)
        if as_json:
            print(json.dumps(cfg.to_dict(), indent=1))
            return 0
        print(f"{name}: {' '.join((PRESETS[name].__doc__ or '').split())}\n")
        groups = [("agent", cfg.agent, f"agent_kind = {cfg.agent_kind}"),
                  (f"replay.{cfg.replay.name}", cfg.replay.options,
                   f"replay.name = {cfg.replay.name}, replay.capacity = {cfg.replay.capacity}"),
                  ("schedule", cfg.schedule, ""), ("run", cfg.run, ""), ("env", cfg.env, ""), ("data", cfg.data, ""),
                  ("collectors", cfg.collectors, ""), ("intervention", cfg.intervention, "")]
    elif name in ALIASES:
        a, replay = ALIASES[name], ReplayConfig(name)
        groups = [(f"replay.{replay.name}", replay.options,
                   f"--replay {name}: {a.doc}; a shorthand of replay.name = {a.target} with "
                   f"{', '.join(a.sets) or 'its defaults'}")]
    elif name in REPLAYS or name in AGENTS:
        groups = []
        if name in REPLAYS:
            groups.append((f"replay.{name}", REPLAYS[name].config_cls(), f"--replay {name}: {REPLAYS[name].doc}"))
        if name in AGENTS:
            groups.append(("agent", AGENTS[name].config_cls(), f"agent {name}: {AGENTS[name].doc}"))
    else:
        raise ValueError(f"nothing named {name!r}: presets {sorted(PRESETS)}, replays {replay_names()}, agents "
                         f"{sorted(AGENTS)}")
    for prefix, obj, title in groups:
        if title:
            print(f"# {title}")
        for field, value, doc in describe(obj):
            line = f"{prefix}.{field} = {json.dumps(value)}"
            print(f"{line:52s} # {doc}" if doc else line)
        print()
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from relive.train.demo import demo  # (gymnasium, optional: `relive --help` imports this module)

    demo(args.out, seed=args.seed, quick=args.quick, workers=args.workers)
    return 0
