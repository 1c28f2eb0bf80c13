"""A results row says the settings it ran with, and they are its grid cell's (issue 46 item 5).

Every results table with a "variant" column in the checked sections of docs/results.md is followed by a
machine-readable block, an HTML comment (invisible on the site) holding TOML::

    <!-- results-settings
    grid = "pld-pendulum"                        # the grid whose cells the rows are
    task = "Pendulum-v1"                         # optional: the task of the cells (default: the grid's first)
    key_columns = 1                              # optional: how many leading cells name a row (e.g. task | variant)
    [rows."base alone (beta = 0)"]               # one entry per table row, by its leading cell(s)
    variant = "base"                             # the grid cell
    same = { "agent.beta" = 0.0 }                # settings the row ran with that ARE the cell's
    differs = { "agent.hidden" = [128, 128] }    # settings the row ran with that are NOT the cell's
    -->

The check builds each cell's configuration as ``relive bench run`` does (``relive train PRESET --env TASK ARGS``) and
fails when a ``same`` value is not the cell's, when a ``differs`` value is the cell's (a stale note), when a row
with a ``differs`` entry does not say "rerun pending", or when a table row has no entry (or an entry no row).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from relive.cli import build_parser
from relive.experiments.grid import load_grid
from relive.train.cli import config_from_args

if sys.version_info >= (3, 11):
    import tomllib
else:  # (Python 3.10: the same parser as a package, as relive.experiments.grid)
    import tomli as tomllib

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results.md"
# the sections whose tables carry a block (extend as others do)
CHECKED_SECTIONS = ("## PLD", "## WSRL", "## HER", "## HIL")
BLOCK = re.compile(r"<!-- results-settings\n(.*?)-->", re.S)


def _sections(text: str) -> list[tuple[int, str]]:
    """(offset, text) of the checked ``## `` sections."""
    parts = [(m.start(), m.group(0)) for m in re.finditer(r"^## [^\n]*\n(?:(?!^## ).*\n?)*", text, re.M)]
    return [(at, s) for at, s in parts if s.startswith(CHECKED_SECTIONS)]


def _tables(section: str) -> list[tuple[int, list[list[str]]]]:
    """(end offset, rows as cell lists without the header) of every markdown table with a "variant" column."""
    out = []
    for m in re.finditer(r"(?:^\|.*\|[ \t]*\n)+", section, re.M):
        lines = m.group(0).strip("\n").splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        if "variant" in header and len(lines) > 2:
            rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]
            out.append((m.end(), rows))
    return out


def _cell_settings(grid: str, variant: str, task: str | None) -> dict:
    """The configuration ``relive bench run GRID`` gives the cell (seed 0) as JSON data."""
    runs = [r for r in load_grid(grid).runs() if r.label == variant and r.seed == 0 and (task is None or
                                                                                          r.task == task)]
    if not runs:
        raise LookupError(f"grid {grid!r} has no cell {variant!r}" + (f" on task {task!r}" if task else ""))
    r = runs[0]
    cfg = config_from_args(build_parser().parse_args(["train", r.preset, "--env", r.task, *r.args]))
    return json.loads(json.dumps(cfg.to_dict(), default=list))


def _get(settings: dict, key: str):
    value = settings
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def check_results(text: str) -> list[str]:
    """Every problem of the checked sections' tables and blocks, one line each (empty: all rows say what ran)."""
    problems = []
    for at, section in _sections(text):
        blocks = [(m.start(), m.group(1)) for m in BLOCK.finditer(section)]
        for end, rows in _tables(section):
            after = [(start, body) for start, body in blocks if start >= end and not section[end:start].strip()]
            where = f"{section.splitlines()[0]} (table ending at offset {at + end})"
            if not after:
                problems.append(f"{where}: no results-settings block right after the table")
                continue
            problems += _check_block(tomllib.loads(after[0][1]), rows, where)
    return problems


def _check_block(block: dict, rows: list[list[str]], where: str) -> list[str]:
    problems = []
    n = int(block.get("key_columns", 1))
    table = {" | ".join(r[:n]): " | ".join(r) for r in rows}
    entries = block.get("rows", {})
    problems += [f"{where}: row {k!r} has no entry in the block" for k in table if k not in entries]
    problems += [f"{where}: the block's entry {k!r} is no row of the table" for k in entries if k not in table]
    for key, entry in entries.items():
        if key not in table:
            continue
        try:
            cell = _cell_settings(block["grid"], entry["variant"], entry.get("task", block.get("task")))
        except LookupError as e:
            problems.append(f"{where}: row {key!r}: {e}")
            continue
        for name, value in entry.get("same", {}).items():
            got = _get(cell, name)
            if got != value:
                problems.append(f"{where}: row {key!r} ran with {name} = {value!r}, cell "
                                f"{block['grid']}:{entry['variant']} has {got!r}")
        for name, value in entry.get("differs", {}).items():
            got = _get(cell, name)
            if got == value:
                problems.append(f"{where}: row {key!r} says {name} = {value!r} differs from cell "
                                f"{block['grid']}:{entry['variant']}, which has that value (a stale note)")
        if entry.get("differs") and "rerun pending" not in table[key]:
            problems.append(f"{where}: row {key!r} ran at settings its cell no longer has and does not say "
                            "'rerun pending'")
    return problems


def test_every_results_row_says_what_ran_and_its_grid_cell_agrees():
    problems = check_results(RESULTS.read_text())
    assert not problems, "\n".join(problems)
    assert _sections(RESULTS.read_text()), "the checked sections are gone from docs/results.md"


DOC = """## PLD: a made-up section

| variant | n | final success |
|---|---:|---|
| base alone | 5 | 0.28 |
| **PLD**{label} | 5 | 0.35 |

<!-- results-settings
grid = "pld-pendulum"
[rows."base alone"]
variant = "base"
same = {{ "agent.beta" = 0.0 }}
[rows."**PLD**{label}"]
variant = "pld"
{entry}
-->
"""


@pytest.mark.parametrize("label, entry, problem", [
    ("", 'same = { "agent.probe_max_steps" = 50, "agent.hidden" = [256, 256] }', None),  # the negative's control
    ("", 'same = { "agent.probe_max_steps" = 30 }', "ran with agent.probe_max_steps = 30"),
    (" (rerun pending)", 'differs = { "agent.probe_max_steps" = 50 }', "a stale note"),
    ("", 'differs = { "agent.probe_max_steps" = 30 }', "does not say 'rerun pending'"),
    (" (old settings; rerun pending)", 'differs = { "agent.probe_max_steps" = 30 }', None),
    ("", 'variant = "pld-K9"', "has no cell 'pld-K9'"),
])
def test_the_check_fails_when_a_row_and_its_grid_cell_differ(label, entry, problem):
    """The companion negative cases: each broken block is reported, naming what differs; the unbroken ones pass."""
    doc = DOC.format(label=label, entry=entry)
    if entry.startswith("variant"):
        doc = doc.replace('variant = "pld"\n', "")
    problems = check_results(doc)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_the_check_fails_on_a_table_without_a_block_or_a_row_without_an_entry():
    doc = DOC.format(label="", entry="")
    (problem,) = check_results(doc.split("<!--")[0])
    assert problem.startswith("## PLD: a made-up section") and "no results-settings block right after" in problem
    extra = doc.replace("| base alone | 5 | 0.28 |\n", "| base alone | 5 | 0.28 |\n| K = 2 | 5 | 0.3 |\n")
    assert [p.split("): ", 1)[1] for p in check_results(extra)] == ["row 'K = 2' has no entry in the block"]


def test_the_hil_section_is_checked_and_a_wrong_hil_setting_is_caught():
    """Issue 46 item 4: the HIL rows carry blocks too; one row's setting changed in a copy is reported."""
    text = RESULTS.read_text()
    (hil,) = [s for _, s in _sections(text) if s.startswith("## HIL")]
    assert len(BLOCK.findall(hil)) >= 3 and len(_tables(hil)) >= 3
    rlpd = '[rows."rlpd"]\nvariant = "rlpd"\nsame = { "intervention.kind" = "none", "agent.num_qs" = '
    broken = text.replace(rlpd + "10", rlpd + "2", 1)  # (the first of the HIL tables' rlpd rows)
    assert broken != text
    (problem,) = check_results(broken)
    assert problem.startswith("## HIL") and "ran with agent.num_qs = 2, cell hil-fetch:rlpd has 10" in problem
