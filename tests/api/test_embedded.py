"""The embedded server: a predictable data directory, a clear message without the extra, and
processes that start it at once taking turns."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from postjob_sa import embedded


def test_data_dir_is_predictable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POSTJOB_EMBEDDED_DIR", str(tmp_path / "pg"))
    assert embedded.data_dir() == tmp_path / "pg"
    monkeypatch.delenv("POSTJOB_EMBEDDED_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert embedded.data_dir() == tmp_path / "xdg" / "postjob_sa" / "pgdata"


def test_without_the_extra_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "_server", None)
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as if not installed: import fails
    with pytest.raises(embedded.EmbeddedUnavailable) as err:
        embedded.database_url()
    assert "pip install 'postjob_sa[embedded]'" in str(err.value)
    assert "--database-url" in str(err.value)


#: A process that starts (or joins) the server of the directory it is given, then exits (the
#: server stops with its last process).
START = """
import sys
from pathlib import Path
from postjob_sa import embedded
print("starting", flush=True)
embedded.server(Path(sys.argv[1]))
print("started", flush=True)
"""


@pytest.mark.slow
def test_a_process_waits_while_another_is_starting_the_server() -> None:
    """On a fresh machine pgserver creates its system user (as root) before its own lock, so the
    test suite's four workers starting the server at once ran useradd and initdb side by side
    and one failed. A start waits for any other start of the same directory to end."""
    base = Path(tempfile.mkdtemp(prefix="pjstart"))  # short: the socket lives in the directory
    target = base / "pg"
    target.mkdir()
    try:
        with open(embedded.start_lock_path(target), "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # another process is starting it
            proc = subprocess.Popen([sys.executable, "-c", START, str(target)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "starting"
            deadline = time.monotonic() + 5  # ample to initdb when nothing holds it back
            while time.monotonic() < deadline and proc.poll() is None:
                assert not (target / "PG_VERSION").exists(), "initdb ran during another start"
                time.sleep(0.1)
            assert proc.poll() is None, proc.communicate()
            fcntl.flock(held, fcntl.LOCK_UN)
            out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "started"
        assert (target / "PG_VERSION").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)
