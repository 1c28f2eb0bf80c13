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


def test_directory_lock_excludes_a_second_holder_and_is_released(tmp_path):
    from relive.files import DirectoryLock, LockedError

    first = DirectoryLock(tmp_path, what="run")
    with pytest.raises(LockedError, match=f"run {tmp_path} is in use by process {os.getpid()}"):
        DirectoryLock(tmp_path, what="run")
    first.release()
    with DirectoryLock(tmp_path) as again:
        assert again.held
    assert not again.held


def test_directory_lock_is_dropped_when_its_process_is_killed(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from relive.files import DirectoryLock

    code = ("import sys, time; from relive.files import DirectoryLock; "
            f"lock = DirectoryLock({str(tmp_path)!r}); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        from relive.files import LockedError
        with pytest.raises(LockedError, match=str(proc.pid)):
            DirectoryLock(tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the flock with the process
        try:
            DirectoryLock(tmp_path).release()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_atomic_writes_replace_a_symbolic_link_never_its_target(tmp_path):
    """A link at the path (dangling or to a file) and a link planted at the temporary's name are replaced, never
    written through: no file outside the directory is created or changed."""
    from relive.files import replace_file

    victim, missing = tmp_path / "victim.txt", tmp_path / "elsewhere" / "missing.txt"
    victim.write_text("precious")
    (tmp_path / "elsewhere").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").symlink_to(victim)
    (run / "config.json.tmp").symlink_to(missing)  # (a leftover name, planted as a link)
    write_text_atomic(run / "config.json", "new")
    assert victim.read_text() == "precious" and not missing.exists()
    assert (run / "config.json").read_text() == "new" and not (run / "config.json").is_symlink()
    (run / "out.bin").symlink_to(missing)
    replace_file(run / "out.bin", lambda tmp: tmp.write_bytes(b"\x00\x01"))
    assert not missing.exists() and (run / "out.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "out.bin"]  # (no temporary left)

    def fails(tmp):
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_file(run / "out.bin", fails)
    assert (run / "out.bin").read_bytes() == b"\x00\x01"  # as it was, and no temporary left
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "out.bin"]


def test_an_output_is_refused_over_a_directory_always_and_over_a_file_or_link_without_overwrite(tmp_path):
    from relive.files import refuse_existing_output

    refuse_existing_output(tmp_path / "new.png", overwrite=False)  # nothing there: fine
    (tmp_path / "d").mkdir()
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"--out .*d is a directory"):
            refuse_existing_output(tmp_path / "d", overwrite)
    (tmp_path / "f.onnx").write_bytes(b"x")
    (tmp_path / "dangling.png").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"f.onnx exists; pass --overwrite to replace it$"):
        refuse_existing_output(tmp_path / "f.onnx", False)
    with pytest.raises(ValueError, match=r"dangling.png is a symbolic link; pass --overwrite .*never what it points"):
        refuse_existing_output(tmp_path / "dangling.png", False)
    refuse_existing_output(tmp_path / "f.onnx", True)
    refuse_existing_output(tmp_path / "dangling.png", True)
