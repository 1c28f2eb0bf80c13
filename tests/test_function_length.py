"""No function in src/relive is longer than ~80 lines unless it says why (issue 29): a reader splits a long function
where its phases, branches or sections are; one that reads better whole carries ``# long: <reason>`` on its ``def``
line or the line right after (for a multi-line signature: the line after the ``def`` line)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "relive"
MAX_LINES = 80
MARK = "# long:"


def long_functions(path: Path, root: Path = ROOT, max_lines: int = MAX_LINES) -> list[str]:
    """``file:line name (N lines)`` for each function or method in ``path`` longer than ``max_lines`` lines (from the
    ``def`` line to the last line of the body, docstring included) that has no ``# long: <reason>`` comment."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length <= max_lines:
            continue
        marks = lines[node.lineno - 1:node.lineno + 1]  # the def line and the one after it
        if any(MARK in line and line.split(MARK, 1)[1].strip() for line in marks):
            continue
        found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)"))
    return [entry for _, entry in sorted(found)]


def test_no_function_over_80_lines_without_a_reason():
    offenders = [entry for path in sorted(SRC.rglob("*.py")) for entry in long_functions(path)]
    assert not offenders, (f"functions over {MAX_LINES} lines: split them where a reader would, or say why on the def "
                           f"line with '{MARK} <reason>':\n" + "\n".join(offenders))


def test_the_check_sees_long_functions_methods_and_reasons(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (tmp_path / "m.py").write_text(
        f"def short():\n    return 1\n\n"
        f"def too_long():\n{body}\n\n"
        f"class C:\n    def method(self):\n{body.replace('    ', '        ')}\n\n"
        f"def excused():  # long: one linear declaration\n{body}\n\n"
        f"def excused_below(\n        a):  # long: one linear declaration\n{body}\n\n"
        f"def empty_reason():  # long:\n{body}\n")
    found = long_functions(tmp_path / "m.py", root=tmp_path)
    assert [entry.split()[1] for entry in found] == ["too_long", "method", "empty_reason"]
    assert found[0] == "m.py:4 too_long (86 lines)"


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line module.name`` for each ``from relive.x import _name`` in ``path``: a module reaching into another's
    private names. A package's private module (``_tree_kernels``, ``_reaper_kernels``: kernels its siblings share)
    may be imported, and imported from."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
        if not module.startswith("relive") or module.rsplit(".", 1)[-1].startswith("_"):
            continue
        package = SRC.parent.joinpath(*module.split("."))
        found += [f"{path.relative_to(root)}:{node.lineno} {module}.{a.name}" for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__")
                  and not (package / f"{a.name}.py").is_file()]
    return found


def test_no_module_imports_another_modules_private_names(tmp_path):
    """(issue 29: buffer imported storage's _as_numpy, lerobot_io minari_io's _swap_into_place, ...)"""
    offenders = [entry for path in sorted(SRC.rglob("*.py")) for entry in private_imports(path)]
    assert not offenders, "private names imported from another module (make them public or move them):\n" + \
        "\n".join(offenders)
    (tmp_path / "m.py").write_text("from relive.replay.storage import Storage, _as_numpy\n"
                                   "from relive import __version__\nfrom relive.replay import _tree_kernels\n")
    assert private_imports(tmp_path / "m.py", root=tmp_path) == ["m.py:1 relive.replay.storage._as_numpy"]
