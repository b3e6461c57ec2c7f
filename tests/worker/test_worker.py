"""The worker loop: LISTEN wake-up, signals, transactional mode, start-up checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry, SchemaError, Status
from tests.conftest import drop_database, url_string

pytestmark = pytest.mark.both_drivers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def marks(engine: Engine, clean: None) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE TABLE IF NOT EXISTS app_marks (marker text, what text, pid int, "
            "at timestamptz DEFAULT clock_timestamp())"
        ))
        conn.execute(text("TRUNCATE app_marks"))


def _start_worker(db_url: URL, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.worker_app", url_string(db_url), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "ready" in line, (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
    return proc


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out + err


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def _scalar(engine: Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def test_idle_worker_wakes_on_notify_within_milliseconds(db_url: URL, engine: Engine, marks: None) -> None:
    proc = _start_worker(db_url)
    try:
        time.sleep(0.5)  # the worker is idle, waiting on LISTEN
        latencies = []
        with Session(engine) as s:
            q = JobQueue(s)
            for key in range(30):
                q.enqueue("app.stamp", key)
                s.commit()
                committed = time.clock_gettime(time.CLOCK_MONOTONIC)
                _wait_for(lambda k=key: _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker = :m", m=str(k)))
                started = float(_scalar(engine, "SELECT what FROM app_marks WHERE marker = :m", m=str(key)))  # type: ignore[arg-type]
                latencies.append((started - committed) * 1000)
                time.sleep(0.02)
        latencies.sort()
        p50 = latencies[len(latencies) // 2]
        print(f"idle wake-up latency p50 {p50:.2f} ms, max {latencies[-1]:.2f} ms")
        # not a timing test: only that the wake-up came from NOTIFY, not from the 30 s poll
        assert latencies[-1] < 5000
    finally:
        _stop(proc)


def test_sigterm_lets_the_current_job_finish_then_the_worker_exits(db_url: URL, engine: Engine, marks: None) -> None:
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("app.sleep", 1.0, "m1").id
        JobQueue(s).enqueue("app.sleep", 0.1, "m2", run_at=None)
        s.commit()
    proc = _start_worker(db_url)
    try:
        _wait_for(lambda: _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker='m1'"))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "processed 1" in out
        assert _scalar(engine, "SELECT status::text FROM postjob.jobs WHERE id = :i", i=job_id) == "ok"
        # the second job was not started
        assert _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker='m2'") == 0
        assert _scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'processing'") == 0
    finally:
        _stop(proc)


def test_a_second_signal_stops_at_once_and_releases_the_job(db_url: URL, engine: Engine, marks: None) -> None:
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("app.sleep", 30, "long").id
        s.commit()
    proc = _start_worker(db_url)
    try:
        _wait_for(lambda: _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker='long'"))
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
        assert proc.returncode == 0
        row = None
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT status::text, failed_attempts, lease_token FROM postjob.jobs WHERE id = :i"
            ), {"i": job_id}).one()
        assert row == ("ready", 0, None)  # released for retry, no attempt counted
    finally:
        _stop(proc)


def _job_row(engine: Engine, job_id: int) -> tuple[str, int]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status::text, failed_attempts FROM postjob.jobs "
                                "WHERE id = :i"), {"i": job_id}).one()
    return str(row[0]), int(row[1])


def test_a_second_signal_stops_the_job_threads_of_a_host_that_lives_on(
    db_url: URL, engine: Engine, marks: None
) -> None:
    """Issue 24: with several jobs at once, a second signal handed the jobs back while their
    threads went on running them; in a process that lives on after work() (a host app, not
    postjob run) the job's code kept running, and another worker could start it too."""
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("app.busy", 30, "busy").id
        s.commit()
    proc = _start_worker(db_url, "--concurrency", "3", "--linger", "1.5")
    try:
        _wait_for(lambda: _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker='busy'"))
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "after work: 0 running, 0 steps" in out, out + err
        assert _job_row(engine, job_id) == ("ready", 0)  # handed back, no attempt counted
    finally:
        _stop(proc)


def test_a_job_blocked_in_a_call_runs_no_more_of_its_code_once_the_call_returns(
    db_url: URL, engine: Engine, marks: None
) -> None:
    """A thread blocked in a call (here a 5 s sleep) cannot be interrupted until the call
    returns: the second signal waits a little for it, hands the job back all the same (as a
    second signal always did), and when the call returns no more of the job's code runs."""
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("app.sleep", 5, "blocked").id
        s.commit()
    proc = _start_worker(db_url, "--concurrency", "3", "--linger", "5")
    try:
        _wait_for(lambda: _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker='blocked'"))
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        # the sleep returned during the linger: the rest of the job did not run
        assert _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker='blocked' "
                       "AND what = 'end'") == 0
        assert _job_row(engine, job_id) == ("ready", 0)
        assert f"job(s) {job_id} still in a call after 2 s: handed back" in err, err
    finally:
        _stop(proc)


def test_worker_keeps_working_when_its_listen_connection_is_killed(db_url: URL, engine: Engine, marks: None) -> None:
    proc = _start_worker(db_url)
    try:
        time.sleep(0.3)
        with engine.begin() as conn:
            killed = conn.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'postjob worker %'"
            )).scalar()
        assert killed == 1
        with Session(engine) as s:
            for i in range(3):
                JobQueue(s).enqueue("app.stamp", 100 + i)
                s.commit()
                _wait_for(lambda i=i: _scalar(engine, "SELECT count(*) FROM app_marks WHERE marker = :m", m=str(100 + i)))
        _wait_for(lambda: _scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'postjob worker %'") == 1)
    finally:
        _stop(proc)


treg = Registry()


@postjob_sa.workflow(name="tx.write", transactional=True, registry=treg)
def tx_write(session: Session, value: int, fail: bool) -> int:
    session.execute(text("INSERT INTO tx_side (value) VALUES (:v)"), {"v": value})
    assert postjob_sa.current_session() is session
    if fail:
        raise RuntimeError("roll me back")
    return value


def test_transactional_mode_commits_the_jobs_writes_exactly_once(engine: Engine, clean: None) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS tx_side (value int)"))
        conn.execute(text("TRUNCATE tx_side"))
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=treg)
        good = q.enqueue(tx_write, 1, False).id
        bad = q.enqueue(tx_write, 2, True, max_attempts=2).id
        s.commit()
        assert q.step() in (good, bad)
        assert q.step() in (good, bad)
        time.sleep(0.05)
        q.drain()
    with engine.connect() as conn:
        values = sorted(r[0] for r in conn.execute(text("SELECT value FROM tx_side")))
        statuses = dict(conn.execute(text("SELECT id, status::text FROM postjob.jobs")).all())
        bad_row = conn.execute(text("SELECT failed_attempts, error_message FROM postjob.jobs WHERE id = :i"), {"i": bad}).one()
    assert values == [1]  # the failing job's writes were rolled back with it, twice
    assert statuses == {good: "ok", bad: "failed"}
    assert bad_row == (2, "roll me back")


def test_step_transactional_runs_a_plain_workflow_in_the_session(engine: Engine, clean: None) -> None:
    r = Registry()

    @postjob_sa.workflow(name="tx.plain", registry=r)
    def plain() -> str:
        return "in a transaction" if postjob_sa.current_session() is not None else "no"

    with Session(engine) as s:
        q = JobQueue(s, registry=r)
        job = q.enqueue(plain)
        s.commit()
        assert q.step(transactional=True) == job.id
        s.refresh(job)
        assert job.status is Status.ok and job.result() == "in a transaction"


@pytest.fixture
def unmigrated(server_url: URL) -> Iterator[Engine]:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS pjt_unmigrated WITH (FORCE)"))
        conn.execute(text("CREATE DATABASE pjt_unmigrated"))
    admin.dispose()
    eng = create_engine(server_url.set(database="pjt_unmigrated"))
    yield eng
    eng.dispose()
    drop_database(server_url, server_url.set(database="pjt_unmigrated"))


def test_worker_refuses_a_missing_or_outdated_schema_with_the_fix(unmigrated: Engine) -> None:
    with Session(unmigrated) as s:
        with pytest.raises(SchemaError, match="postjob db migrate"):
            JobQueue(s).work(count=1)
    postjob_sa.migrate(unmigrated)
    with unmigrated.begin() as conn:
        conn.execute(text("CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql AS $$ SELECT 'pj0000'::text $$"))
    with Session(unmigrated) as s:
        with pytest.raises(SchemaError, match="pj0000.*postjob db migrate"):
            JobQueue(s).drain()


def test_work_count_and_signal_free_threads(engine: Engine, clean: None) -> None:
    r = Registry()
    postjob_sa.workflow(name="thr.noop", registry=r)(lambda: None)
    with Session(engine) as s:
        JobQueue(s, registry=r).enqueue_many("thr.noop", [[] for _ in range(10)])
        s.commit()
    done: list[int] = []

    def run() -> None:
        with Session(engine) as s:
            done.append(JobQueue(s, registry=r, batch_size=3).work(count=5))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert done == [5, 5]
    assert _scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'") == 10
