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
