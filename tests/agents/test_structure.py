"""Structure of the agent package, read from the source (ast): what agents share is public, and every optional
capability the loop reads from an agent by name is documented in ``relive.agents.contract``."""

import ast
import re
from pathlib import Path

import relive
from relive.agents import contract

SRC = Path(relive.__file__).parent
AGENTS_DIR = SRC / "agents"


def private_imports(files) -> list[str]:
    """``from relive.agents.X import _name`` (or ``X._name`` on an imported agents module) in a file other than
    X itself: one agent reaching into another's private functions."""
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        here = "relive.agents." + path.stem
        aliases = {}  # local name -> the relive.agents module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("relive.agents"):
                for a in node.names:
                    if node.module == "relive.agents":  # from relive.agents import sac (as x)
                        aliases[a.asname or a.name] = f"relive.agents.{a.name}"
                    elif a.name.startswith("_") and node.module != here:
                        found.append(f"{path.name}:{node.lineno}: from {node.module} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("relive.agents.") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != here):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return found


def test_no_agent_imports_another_modules_private_names():
    """What two agents share is a public, documented function (e.g. ``networks.optimize``), not another file's
    ``_helper``."""
    assert private_imports(sorted(AGENTS_DIR.glob("*.py"))) == []


def test_the_private_import_check_finds_both_forms(tmp_path):
    """(The check can fail: a scratch module with both forms is caught, its own private names are not.)"""
    bad = tmp_path / "bad.py"
    bad.write_text("from relive.agents.sac import SAC, _step\nfrom relive.agents import networks as nets\n"
                   "from relive.agents.bad import _mine\nx = nets._private(1) + nets.public(2)\n")
    assert private_imports([bad]) == ["bad.py:1: from relive.agents.sac import _step",
                                      "bad.py:4: nets._private (relive.agents.networks)"]


# -- every optional capability read by name is documented ---------------------------------------------------------
_CONFIG_OWNERS = {"cfg", "config", "args"}  # cfg.agent is the agent's *config*, not the agent


def _is_agent(expr: ast.expr) -> bool:
    """An expression that holds an agent (or its class): ``agent``, ``run.agent``, ``ctx.agent``, ``self._agent``,
    ``agent_cls``, ``agent_entry(...).target``."""
    text = ast.unparse(expr)
    if re.fullmatch(r"agent_entry\(.*\)\.target", text):
        return True
    parts = text.split(".")
    return parts[-1] in {"agent", "_agent", "agent_cls"} and (len(parts) == 1 or parts[-2] not in _CONFIG_OWNERS)


def names_read_from_agents(files) -> dict[str, list[str]]:
    """Every name read from an agent in ``files``: ``getattr`` / ``hasattr`` / ``setattr`` with a constant name, and
    plain attribute access (``run.agent.update``): name -> where."""
    out: dict[str, list[str]] = {}
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            name = None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in {"getattr", "hasattr", "setattr"} and len(node.args) >= 2
                    and _is_agent(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
            elif isinstance(node, ast.Attribute) and _is_agent(node.value):
                name = node.attr
            if name is not None:
                where = path.relative_to(SRC) if SRC in path.parents else path.name
                out.setdefault(name, []).append(f"{where}:{node.lineno}")
    return out


def loop_files():
    """Every module outside ``relive/agents`` (the loop, collectors, samplers' hooks, data, experiments, CLIs), but
    ``presets.py``, which builds configs (its ``agent`` variables are agent *configs*)."""
    return sorted(p for p in SRC.rglob("*.py") if AGENTS_DIR not in p.parents and p != SRC / "presets.py")


def test_every_capability_the_loop_reads_by_name_is_documented_in_the_agent_protocol():
    read = names_read_from_agents(loop_files())
    # the scan sees the capabilities known to be read (a scan that found nothing would pass anything)
    assert {"act", "update", "stored_columns", "sequence_spec", "acting_modules", "acting_clock",
            "remote_acting_problem", "random_warmup_problem", "allow_other_base", "score_fn"} <= set(read), read
    documented = set(contract.REQUIRED) | set(contract.OPTIONAL_CAPABILITIES)
    undocumented = {name: where for name, where in read.items() if name not in documented}
    assert not undocumented, (f"read from agents by name but not listed in relive.agents.contract."
                              f"OPTIONAL_CAPABILITIES (add it there, with what reads it and what it means): "
                              f"{undocumented}")


def test_the_capability_scan_catches_an_undocumented_name(tmp_path):
    """(The check can fail: a new ``getattr(run.agent, "...")`` or ``agent.something`` is found; config reads
    ``cfg.agent.x`` are not.)"""
    f = tmp_path / "loop.py"
    f.write_text("def f(run, agent, cfg):\n    g = getattr(run.agent, 'brand_new', None)\n"
                 "    return agent.other_new, getattr(cfg.agent, 'n_step', 1), cfg.agent.gamma\n")
    assert set(names_read_from_agents([f])) == {"brand_new", "other_new"}


def test_documented_capabilities_are_ones_some_agent_or_the_loop_uses():
    """The list does not go stale either: every documented optional name is defined by a built-in agent or read
    by the loop."""
    from relive.registry import AGENTS, load_builtins

    load_builtins()
    read = set(names_read_from_agents(loop_files()))
    defined = {name for e in AGENTS.values() for name in dir(e.target)}
    assert set(contract.OPTIONAL_CAPABILITIES) - read - defined == set()
