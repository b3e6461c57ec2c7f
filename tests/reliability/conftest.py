"""Harness of the reliability tests: real ``postjob run`` processes (the installed console
script) against a real server, each bounded in time.

Every helper waits with a deadline and fails with what it saw; worker processes are killed
(by their own pid) when a test ends, whatever happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text

from tests.conftest import libpq_url, url_string

ROOT = Path(__file__).resolve().parents[2]
POSTJOB = str(Path(sys.executable).parent / "postjob")
APP = "tests.reliability.rel_app"
#: workers idle on LISTEN: their connection (application_name "postjob worker host:pid") is
#: idle after asking how long to wait
LISTENING = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE 'postjob worker %' "
    "AND state = 'idle' AND query LIKE 'SELECT postjob.worker_idle%'"
)


class WorkerProcess:
    """One ``postjob run`` process; its stderr goes to a file (read with ``log()``)."""

    def __init__(self, url: URL, *args: str, env: dict[str, str] | None = None):
        self.logfile = tempfile.NamedTemporaryFile(  # closed in stop()
            prefix="postjob-worker-", suffix=".log", delete=False
        )
        argv = [POSTJOB, "--database-url", url_string(url), "run", "--import", APP, *args]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=self.logfile, stderr=subprocess.STDOUT,
            env={**os.environ, "REL_APP_URL": libpq_url(url), **(env or {})},
        )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return Path(self.logfile.name).read_text(errors="replace")

    def kill(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, wait for the exit; SIGKILL if it does not come. Returns the status."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self.logfile.close()
        return code


@pytest.fixture
def workers() -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes: ``workers(url, "--lease", "2")``; all are stopped at the end."""
    started: list[WorkerProcess] = []

    def start(url: URL, *args: str) -> WorkerProcess:
        w = WorkerProcess(url, *args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop(timeout=10)
        Path(w.logfile.name).unlink(missing_ok=True)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.02) -> Any:
    """Poll until predicate() is truthy (returns it) or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        time.sleep(interval)


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def wait_listening(engine: Engine, n: int, procs: list[WorkerProcess], timeout: float = 60) -> None:
    """Wait until n workers are idle on LISTEN (started, schema checked, waiting for work):
    eight processes starting on a loaded 2-core machine (make test runs modules side by side)
    can take more than 20 s."""
    def ready() -> bool:
        for p in procs:
            assert p.alive(), f"worker {p.pid} exited early:\n{p.log()}"
        return int(scalar(engine, LISTENING.text)) >= n

    wait_for(ready, timeout, f"{n} workers listening")


def create_runs_table(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE TABLE IF NOT EXISTS rel_runs (job_id bigint, pid int, what text, "
            "at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ))
        conn.execute(text("TRUNCATE rel_runs"))


@pytest.fixture
def runs(engine: Engine, clean: None) -> Engine:
    """An empty queue and an empty side table ``rel_runs``."""
    create_runs_table(engine)
    return engine


def report(line: str) -> None:
    """A measured figure: printed (pytest -s) and kept in $POSTJOB_RELIABILITY_REPORT."""
    print(line)
    target = os.environ.get("POSTJOB_RELIABILITY_REPORT")
    if target:
        with open(target, "a") as fh:
            fh.write(line + "\n")
