"""The README's first code block as a newcomer runs it: saved as a file and run with python,
no DATABASE_URL (the embedded server), a worker that runs the jobs until Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.docs.test_docs import ROOT, blocks

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A new embedded server's data directory (short: its socket lives there)."""
    path = Path(tempfile.mkdtemp(prefix="pjreadme"))
    yield path / "pg"
    shutil.rmtree(path, ignore_errors=True)


def _published(data_dir: Path) -> str | None:
    """The status of the README's publish job, read on the embedded server's socket."""
    if not (data_dir / ".s.PGSQL.5432").exists():
        return None
    try:
        with psycopg.connect(host=str(data_dir), user="postgres", dbname="postgres",
                             connect_timeout=5) as conn:
            row = conn.execute("SELECT status::text FROM postjob.postjobs "
                               "WHERE workflow = 'publish'").fetchone()
    except psycopg.Error:  # starting, or the schema not there yet
        return None
    return None if row is None else str(row[0])


def test_the_first_block_runs_as_is_and_its_worker_stops_on_ctrl_c(
    tmp_path: Path, data_dir: Path
) -> None:
    code = next(b for b in blocks(ROOT / "README.md") if b.lang == "python").code
    (tmp_path / "readme_app.py").write_text(code)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "POSTJOB_DATABASE_URL", "PYTHONPATH")}
    env["POSTJOB_EMBEDDED_DIR"] = str(data_dir)
    proc = subprocess.Popen([sys.executable, "readme_app.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _published(data_dir) != "ok":
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the publish job did not end ok"
            time.sleep(0.2)
        assert proc.poll() is None  # work() goes on, waiting for jobs, until Ctrl-C
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
