"""Docstrings and docs cite sources a reader can open (issue 28 item 11): no pointer to the research notes
(``research/replay_methods.md`` and its siblings), which live outside this repository; the paper's section and
equation instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the research notes written while building the library; they are not shipped with it
NOTES = re.compile(r"(?:research/[\w./-]+|\b(?:replay_methods|o2o_methods|anchors_replay|aesthetics)\.md)")


def _files():
    for folder, pattern in (("src", "*.py"), ("bench", "*.py"), ("examples", "*.py"), ("docs", "*.md")):
        yield from sorted((ROOT / folder).rglob(pattern))
    yield ROOT / "README.md"


def test_no_docstring_or_doc_points_to_notes_outside_the_repository():
    found = []
    for path in _files():
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in NOTES.finditer(line):
                if not (ROOT / m.group(0)).exists():
                    found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not found, "pointers to notes that are not in the repository (cite the paper instead):\n" + "\n".join(found)
