"""`postjob run`, `reap` and `demo` through the installed script, against the real server."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue
from postjob_sa._migrations import MIGRATE_HINT
from tests.cli.test_cli_db import POSTJOB, assert_bad_input, postjob
from tests.conftest import create_clone, drop_database, url_string
from tests.reliability.conftest import scalar, wait_for

pytestmark = pytest.mark.both_drivers


@pytest.fixture
def cli(db_url: URL, clean: None) -> Any:
    url = url_string(db_url)
    return lambda *args: postjob(*args, url=url)


def _enqueue_measures(engine: Engine, *words: str) -> list[int]:
    with engine.begin() as conn:
        return [int(conn.execute(text("INSERT INTO postjob.postjobs (workflow, args) VALUES "
                                      "('demo.measure', CAST(:a AS jsonb)) RETURNING id"),
                                 {"a": f'["{w}"]'}).scalar_one()) for w in words]


def _statuses(engine: Engine) -> dict[int, tuple[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status::text, results FROM postjob.jobs"))
        return {r[0]: (r[1], r[2]) for r in rows}


def test_run_processes_count_jobs_and_logs_each(cli: Any, engine: Engine) -> None:
    ids = _enqueue_measures(engine, "ab", "abc", "abcd")
    res = cli("run", "--import", "postjob_sa.demo", "--count", "2", "--fast", "--batch", "2", "-v")
    assert res.returncode == 0, res.stderr
    assert re.search(r"worker pid \d+ started", res.stderr)
    assert len(re.findall(r"INFO job \d+ \([\w.]+\): ok", res.stderr)) == 2
    assert "stopped after 2 job(s)" in res.stderr
    done = _statuses(engine)
    assert [done[i][0] for i in ids].count("ok") == 2
    assert done[ids[0]] == ("ok", [2])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run"], "no workflows to run"),
        (["run", "--import", "no_such_module_xyz"], "cannot import workflow module"),
        (["run", "--import", "postjob_sa.demo", "--lease", "0"], "more than 0"),
        (["run", "--import", "postjob_sa.demo", "--processes", "0"], "--processes"),
        (["run", "--import", "postjob_sa.demo", "--jobs-per-process", "0"], "--jobs-per-process"),
        (["run", "--import", "postjob_sa.demo", "--batch", "0"], "batch_size"),
    ],
)
def test_run_bad_input(cli: Any, engine: Engine, args: list[str], needle: str) -> None:
    ids = _enqueue_measures(engine, "x")
    assert_bad_input(cli(*args), needle)
    assert _statuses(engine)[ids[0]][0] == "ready"


def _workers(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.workers")).scalar_one())


def _lines(stream: Any) -> tuple[queue.Queue[str], threading.Thread]:
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for raw in stream:
            out.put(raw.decode(errors="replace"))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return out, thread


def _wait_for(lines: queue.Queue[str], pattern: str, seen: list[str], timeout: float = 15) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        seen.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"no line matched {pattern!r}:\n{''.join(seen)}")


@pytest.mark.slow
def test_concurrency_restarts_a_crashed_worker_and_forwards_sigterm(
    db_url: URL, engine: Engine, clean: None
) -> None:
    proc = subprocess.Popen(
        [POSTJOB, "--database-url", url_string(db_url), "run", "--import", "postjob_sa.demo",
         "--processes", "2", "--fast", "-v"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    (lines, pump), seen = _lines(proc.stderr), []
    try:
        pids = [int(_wait_for(lines, r"worker \d started with pid (\d+)", seen).group(1)) for _ in range(2)]
        ids = _enqueue_measures(engine, "one", "three")
        for _ in ids:
            _wait_for(lines, r"INFO job \d+ \([\w.]+\): ok", seen)
        deadline = time.monotonic() + 10  # the log line comes just before the outcome is written
        while {s for s, _ in _statuses(engine).values()} != {"ok"} and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pids[0], signal.SIGKILL)
        _wait_for(lines, rf"pid {pids[0]}\) crashed \(signal 9\)", seen)
        new_pid = int(_wait_for(lines, r"worker 1 started with pid (\d+)", seen).group(1))
        assert new_pid not in pids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pump.join(timeout=5)
        proc.stderr.close()
    assert {s for s, _ in _statuses(engine).values()} == {"ok"}
    for pid in [pids[1], new_pid]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_reap_fails_over_a_dead_workers_job(cli: Any, engine: Engine) -> None:
    """A job checked out under a lease nobody renews (its holder gone) is rescued by reap."""
    import postjob_sa.demo  # noqa: F401  (registers demo.measure)

    (job_id,) = _enqueue_measures(engine, "z")
    with Session(engine) as s:
        assert [j.id for j in JobQueue(s, lease=0.05).checkout(["demo.measure"])] == [job_id]
        s.commit()
    time.sleep(0.1)
    res = cli("reap")
    assert res.returncode == 0 and "reaped 1 job(s)" in res.stdout
    assert _statuses(engine)[job_id][0] == "err"


def test_demo_runs_a_tree_to_the_end_and_again(cli: Any, engine: Engine) -> None:
    for run in (1, 2):
        res = cli("demo")
        assert res.returncode == 0, res.stderr
        root = int(re.search(r"enqueued job (\d+)", res.stdout).group(1))  # type: ignore[union-attr]
        assert f"job {root} is ok" in res.stdout
        assert "__manual__" in res.stdout and '"approved_by":"postjob demo"' in res.stdout
        with engine.connect() as conn:
            statuses = conn.execute(text("SELECT DISTINCT status::text FROM postjob.jobs "
                                         "WHERE root_id = :r"), {"r": root}).scalars().all()
        assert statuses == ["ok"], run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_run_stops_on_ctrl_c_or_sigterm_with_status_0(
    db_url: URL, engine: Engine, clean: None, signum: int
) -> None:
    """A worker asked to stop has done what it was asked: its exit status is 0, not 130."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM postjob.workers"))
    proc = subprocess.Popen(
        [POSTJOB, "--database-url", url_string(db_url), "run", "--import", "postjob_sa.demo"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    (lines, pump), seen = _lines(proc.stderr), []
    try:
        _wait_for(lines, r"worker pid \d+ started", seen)
        deadline = time.monotonic() + 15  # registered: its signal handlers are in place
        while time.monotonic() < deadline and not _workers(engine):
            time.sleep(0.05)
        proc.send_signal(signum)
        assert proc.wait(timeout=15) == 0
        name = signal.Signals(signum).name
        _wait_for(lines, rf"received {name}: stopping after the running jobs", seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pump.join(timeout=5)
        proc.stderr.close()


def test_a_worker_whose_schema_is_downgraded_away_stops_in_one_line(
    server_url: URL, template_db: str
) -> None:
    """A downgrade while a worker runs: it stops at its next statement, exit 2, one line
    that says what happened and what to run (not "internal error" and a traceback)."""
    url = create_clone(server_url, template_db, "schema_gone")
    engine = create_engine(url)
    proc = subprocess.Popen([POSTJOB, "--database-url", url_string(url), "run", "--import",
                             "postjob_sa.demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.workers"), 60,
                 "the worker registered")
        postjob_sa.downgrade(engine)
        with engine.connect() as conn:  # wake it: its next statement meets no schema
            conn.execute(text("NOTIFY postjob_notifications"))
            conn.commit()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        engine.dispose()
        drop_database(server_url, url)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2, err.decode()
    assert "Traceback" not in err.decode()
    assert lines[-1] == ("postjob: the postjob schema is gone from this database while the "
                         "worker ran (downgraded or dropped?): " + MIGRATE_HINT)
