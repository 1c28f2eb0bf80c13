"""Issue 44: a run directory gathered from a Ray node (``--storage gather``) arrives as a gzipped tar. An archive
that is not one, or holds anything but plain files and directories under the run directory (an absolute path, a
``..``, a link, a device), is one ``ValueError`` naming the archive's run, with the run directory left as it was; on
the head, that run is recorded as crashed (crash.json says why) and the others go on. It used to surface raw
tarfile exceptions (``AbsolutePathError``, ``ReadError``, ...), which ended the whole sweep. No Ray cluster is
needed: these are the head's and the node's unpacking."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from relive.experiments.grid import RunSpec
from relive.experiments.ray_runner import _pack, _unpack
from relive.experiments.runner import RunOutcome, run_dir_of


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _device(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    return info, None


GOOD = _tar(_file("config.json", b"{}"), _file("summary.json", b"{}"))
BAD = {
    "absolute path": _tar(_file("/tmp/relive-escape.txt")),
    "dot-dot": _tar(_file("../escape.txt")),
    "symlink outside": _tar(_link("eval.csv", "/etc/passwd")),
    "symlink inside": _tar(_file("a.txt"), _link("b.txt", "a.txt")),
    "hard link": _tar(_file("a.txt"), _link("b.txt", "a.txt", tarfile.LNKTYPE)),
    "device": _tar(_device("dev")),
    "not gzip": b"this is not an archive",
    "cut short": GOOD[: len(GOOD) // 2],
    "empty bytes": b"",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_refused_archive_is_one_error_naming_it_and_nothing_changes(tmp_path, case):
    run_dir = tmp_path / "g" / "a" / "T" / "seed_0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text('{"before": true}')
    with pytest.raises(ValueError, match=rf"gather archive of run {run_dir}: refused, the run directory is left as "
                                         r"it was \(") as e:
        _unpack(BAD[case], run_dir)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json"]
    assert (run_dir / "config.json").read_text() == '{"before": true}'
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["seed_0"]  # (the staging directory is gone)
    assert not (tmp_path / "escape.txt").exists()


def test_a_packed_run_directory_round_trips(tmp_path):
    src = tmp_path / "src"
    (src / "tb").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "tb" / "events").write_bytes(b"\x00\x01")
    dst = tmp_path / "dst"
    _unpack(_pack(src), dst)
    assert (dst / "config.json").read_text() == "{}" and (dst / "tb" / "events").read_bytes() == b"\x00\x01"


def test_the_head_records_a_refused_archive_as_a_crash_and_goes_on(tmp_path):
    from relive.experiments.ray_runner import _gathered

    spec = RunSpec("g", "a", "sac", "T", 0)
    node = RunOutcome(spec, "finished", 1.0, tmp_path / "node-scratch", "n1")
    out = _gathered(tmp_path, node, BAD["absolute path"])
    assert out.status == "crashed"
    crash = json.loads((run_dir_of(tmp_path, spec) / "crash.json").read_text())
    assert "gather archive of run" in crash["log_tail"][0] and "absolute path" in crash["log_tail"][0]
    ok = _gathered(tmp_path, RunOutcome(RunSpec("g", "b", "sac", "T", 0), "finished", 1.0, tmp_path, "n1"), GOOD)
    assert ok.status == "finished" and (ok.run_dir / "summary.json").is_file()
