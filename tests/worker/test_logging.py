"""What postjob_sa logs: a failed run at WARNING with its error class, its message and the
status the database recorded (the traceback at INFO, ``postjob run -v``); nothing at all when
the package is imported."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, NonRecoverable, Registry
from tests.cli.test_cli_db import POSTJOB
from tests.conftest import url_string

reg = Registry()


@postjob_sa.workflow(name="log.flaky", registry=reg, max_attempts=2)
def flaky() -> None:
    raise ConnectionError("the mail server is down")


class Refused(NonRecoverable):
    pass


@postjob_sa.workflow(name="log.refused", registry=reg)
def refused() -> None:
    raise Refused("no such customer")


@postjob_sa.workflow(name="log.fine", registry=reg)
def fine() -> str:
    return "ok"


def _worker_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    lines = [(r.levelno, re.sub(r"in \d+\.\d ms", "in T ms", r.getMessage()))
             for r in caplog.records if r.name == "postjob_sa.worker"]
    caplog.clear()
    return lines


def _until_final(engine: Engine, q: JobQueue) -> None:
    for _ in range(200):  # a retry is due in milliseconds (fast mode)
        q.drain()
        with engine.connect() as conn:
            if not conn.execute(text("SELECT count(*) FROM postjob.jobs "
                                     "WHERE status NOT IN ('ok', 'failed')")).scalar():
                return
        time.sleep(0.01)
    raise AssertionError("the jobs did not end")


def test_a_failed_run_is_logged_with_its_error_and_the_status_recorded(
    engine: Engine, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    q = JobQueue(session, registry=reg, fast_mode=True)
    flaky_id, refused_id = q.enqueue(flaky).id, q.enqueue(refused).id
    q.enqueue(fine)
    session.commit()
    with caplog.at_level(logging.WARNING, logger="postjob_sa"):
        _until_final(engine, q)
    assert sorted(_worker_lines(caplog)) == sorted([
        (logging.WARNING, f"job {flaky_id} (log.flaky): err in T ms (will retry in 0.01 s): "
                          "ConnectionError: the mail server is down"),
        (logging.WARNING, f"job {flaky_id} (log.flaky): failed in T ms (no attempts left): "
                          "ConnectionError: the mail server is down"),
        (logging.WARNING, f"job {refused_id} (log.refused): failed in T ms (not retried): "
                          "tests.worker.test_logging.Refused: no such customer"),
    ])  # the ok run is logged at INFO, tracebacks too


def test_the_traceback_is_logged_at_info(
    engine: Engine, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    q = JobQueue(session, registry=reg, fast_mode=True)
    refused_id = q.enqueue(refused).id
    session.commit()
    with caplog.at_level(logging.INFO, logger="postjob_sa"):
        assert q.drain() == 1
    [warning, traceback] = _worker_lines(caplog)
    assert warning == (logging.WARNING, f"job {refused_id} (log.refused): failed in T ms "
                                        "(not retried): tests.worker.test_logging.Refused: "
                                        "no such customer")
    assert traceback[0] == logging.INFO
    assert traceback[1].startswith(
        f"job {refused_id} (log.refused): traceback (most recent call last):\n  ")
    assert traceback[1].endswith(":in refused")


TASKS = """
import postjob_sa

@postjob_sa.workflow(name="cli.flaky", max_attempts=2)
def flaky() -> None:
    raise ConnectionError("the mail server is down")
"""

WARNING_LINE = re.compile(
    r"^\d\d:\d\d:\d\d \[\d+\] WARNING job (\d+) \(cli\.flaky\): (err|failed) in \d+\.\d ms "
    r"\((will retry in [0-9.]+ s|no attempts left)\): ConnectionError: the mail server is down$"
)


@pytest.mark.parametrize("verbose", [[], ["-v"]], ids=["default", "-v"])
def test_postjob_run_logs_failures_at_warning_and_their_traceback_with_v(
    db_url: URL, clean: None, tmp_path: Path, verbose: list[str]
) -> None:
    (tmp_path / "tasks.py").write_text(TASKS)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([POSTJOB, "--database-url", url_string(db_url), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)

    res = cli("job", "enqueue", "cli.flaky", "--import", "tasks")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    res = cli(*verbose, "run", "--import", "tasks", "--count", "2", "--fast")
    assert res.returncode == 0, res.stderr
    warnings = [m.groups() for m in map(WARNING_LINE.match, res.stderr.splitlines()) if m]
    assert warnings == [(job_id, "err", "will retry in 0.01 s"),
                        (job_id, "failed", "no attempts left")]
    tracebacks = res.stderr.count(f"INFO job {job_id} (cli.flaky): traceback (most recent call last):")
    assert tracebacks == (2 if verbose else 0)
    assert ("tasks.py:6:in flaky" in res.stderr) == bool(verbose)


def test_importing_postjob_sa_logs_nothing_at_info() -> None:
    code = ("import logging; logging.basicConfig(level=logging.INFO); "
            "import postjob_sa")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0 and (res.stdout, res.stderr) == ("", "")
