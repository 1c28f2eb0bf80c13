"""The docs are tested (issue 19): every fenced ```python block of README.md and docs/*.md runs, and every shell line
that starts with ``relive `` parses with the real CLI parser and names presets, grids, tasks and replays that exist.

A Python block that is a fragment not meant to run is marked in the Markdown by a ``<!-- not run: reason -->`` line
just before its fence; only those are skipped. The blocks of one file run in order in one namespace (a later block
may use what an earlier one defined), in a scratch directory."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from relive.cli import build_parser
from relive.experiments.grid import find_grid
from relive.presets import PRESETS
from relive.registry import AGENTS, REPLAYS, load_builtins
from relive.train.generate import LEVELS, MAZE_TASKS, TASKS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")


def _blocks(path: Path):
    """(language, first line number, code, not-run reason or None) for every fenced block of a Markdown file."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        reason = NOT_RUN.search(prev)
        out.append((lang, start + 1, "\n".join(lines[start + 1:j]), reason.group(1) if reason else None))
        i = j + 1
    return out


def _python_blocks():
    return [(p, line, code, reason) for p in DOCS for lang, line, code, reason in _blocks(p) if lang == "python"]


def _shell_commands():
    """(file, line, argv) for every ``relive ...`` command of a bash (or unlabelled) block, split at ``&&``."""
    cmds = []
    for p in DOCS:
        for lang, line, code, _ in _blocks(p):
            if lang not in ("bash", "sh", "shell", ""):
                continue
            joined = code.replace("\\\n", " ").splitlines()
            for k, text in enumerate(joined):
                for part in text.split("&&"):
                    part = part.strip()
                    if not part.startswith("relive "):
                        continue
                    part = re.sub(r"\$\{?\w+\}?", "X", part)  # $VARS: a dummy value
                    argv = shlex.split(part, comments=True)[1:]
                    cmds.append((p, line + 1 + k, argv))
    return cmds


PY_BLOCKS = _python_blocks()
SHELL = _shell_commands()


def test_the_docs_have_blocks():
    assert len([b for b in PY_BLOCKS if b[3] is None]) >= 3
    assert len(SHELL) >= 20


# pages whose blocks train agents (migration.md: SB3 and TorchRL learning runs) run in the slow stage
DOCS_THAT_TRAIN = {"migration.md"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.name in DOCS_THAT_TRAIN else p
                                  for p in sorted({b[0] for b in PY_BLOCKS})], ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path, monkeypatch):
    """Each file's runnable Python blocks run in order, in one namespace, in a scratch directory. The namespace
    is a module's (in sys.modules while the blocks run: dataclasses look their module up); methods the blocks
    register (docs/extending.md) are unregistered afterwards."""
    import sys
    import types

    import torch

    from relive.replay.samplers import SAMPLERS

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    threads = torch.get_num_threads()
    module = types.ModuleType(f"__doc_block_{path.stem}__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace: dict = module.__dict__
    load_builtins()
    registered = [(table, set(table)) for table in (REPLAYS, AGENTS, SAMPLERS)]
    ran = 0
    try:
        for p, line, code, reason in PY_BLOCKS:
            if p != path or reason is not None:
                continue
            try:
                exec(compile(code, f"{p.name}:{line}", "exec"), namespace)
            except Exception as e:  # name the block
                raise AssertionError(f"{p.name}, the python block at line {line} fails: {e!r}") from e
            ran += 1
    finally:
        torch.set_num_threads(threads)
        for table, before in registered:
            for name in set(table) - before:
                table.pop(name)
    if ran == 0:
        pytest.skip(f"every python block of {path.name} is marked not run")


def test_not_run_marks_give_a_reason():
    for p, line, _, reason in PY_BLOCKS:
        assert reason is None or len(reason) > 10, f"{p.name}:{line}: say why the block is not run"


def _check_names(argv: list[str], where: str) -> None:
    """The presets, grids, tasks, datasets and replays a command names exist."""
    load_builtins()
    cmd = argv[0]
    pos = [a for a in argv[1:] if not a.startswith("-")]
    opts = {}
    for i, a in enumerate(argv):
        if a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            opts[a] = argv[i + 1]
    tasks = set(TASKS) | set(MAZE_TASKS)

    def known(task: str) -> bool:  # Meta-World's tasks are named by metaworld (its own venv): the pattern only
        return task.lower() in tasks or re.fullmatch(r"metaworld-[a-z]+(-[a-z]+)*-v3", task.lower()) is not None
    if cmd == "train" and "--resume" not in opts:
        assert pos and pos[0] in PRESETS, f"{where}: unknown preset in {argv}"
    if cmd == "bench" and argv[1] in ("run", "report"):
        find_grid(argv[2])  # raises on an unknown grid
    if cmd == "data" and argv[1] == "make":
        assert known(argv[2]), f"{where}: unknown task {argv[2]!r}"
        assert argv[3] in LEVELS, f"{where}: unknown level {argv[3]!r}"
    if cmd == "presets" and ("--show" in opts or len(pos) > 0):
        name = opts.get("--show", pos[0] if pos else None)
        assert name in set(PRESETS) | set(REPLAYS) | set(AGENTS) | {"replays", "agents"}, f"{where}: {name!r}"
    if "--replay" in opts:
        assert opts["--replay"] in REPLAYS, f"{where}: unknown replay {opts['--replay']!r}"
    ds = opts.get("--dataset", "")
    m = re.fullmatch(r"relive/([\w.-]+)/([\w-]+)-v0", ds)
    if m:
        assert known(m.group(1)), f"{where}: unknown task in dataset {ds!r}"
        assert m.group(2) in LEVELS, f"{where}: unknown level in dataset {ds!r}"


@pytest.mark.parametrize("path,line,argv", SHELL, ids=[f"{p.name}:{ln}" for p, ln, _ in SHELL])
def test_shell_commands_parse(path, line, argv):
    where = f"{path.name}:{line}"
    try:
        build_parser().parse_args(argv)
    except SystemExit as stop:
        raise AssertionError(f"{where}: `relive {shlex.join(argv)}` does not parse") from stop
    _check_names(argv, where)


def test_the_readme_preset_list_names_every_preset():
    """README's `relive presets` line lists every preset (a name, or a stem with its suffixes in parentheses)."""
    import re

    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if x.startswith("relive presets  "))
    listed = line.split("#", 1)[1]
    names = set()
    for stem, suffixes in re.findall(r"([a-z0-9_]+)(?:\(([^)]*)\))?", listed):
        names.add(stem)
        for part in (suffixes or "").replace(";", ",").split(","):
            part = part.strip()
            if part.startswith("each also "):
                continue
            if part:
                names.add(stem + part)
    also = re.search(r"each also (_[a-z]+)", listed)
    if also:
        names |= {n + also.group(1) for n in list(names) if n.startswith("ddpg") and not n.endswith("_her")}
    missing = sorted(set(PRESETS) - names)
    assert not missing, f"README's preset list lacks {missing}"


def _slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc slugify, after inline markup is dropped)."""
    import unicodedata

    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_links_into_the_docs_resolve():
    """README.md is outside the docs site, so `make docs` (which fails on a broken link or anchor of a page) does not
    check it: every docs/PAGE.md or docs/PAGE.md#anchor the README links to exists."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert links, "the README links to no docs page"
    bad = []
    for page, anchor in links:
        path = ROOT / page
        if not path.is_file():
            bad.append(page)
        elif anchor and anchor not in {_slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", path.read_text(), re.M)}:
            bad.append(f"{page}#{anchor}")
    assert not bad, f"README links to missing docs pages or headings: {bad}"
