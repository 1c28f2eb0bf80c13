import os

import pytest

from relive.files import write_text_atomic


def test_an_interrupted_atomic_write_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    write_text_atomic(path, "first")
    assert path.read_text() == "first" and not (tmp_path / "config.json.tmp").exists()

    def killed(src, dst):  # the process dies between writing the temporary file and renaming it
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "second, longer contents")
    assert path.read_text() == "first"  # never a truncated or half-new file
    monkeypatch.undo()
    write_text_atomic(path, "third")  # the leftover temporary file is simply overwritten
    assert path.read_text() == "third" and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
