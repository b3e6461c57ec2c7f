"""A transactional job's transaction that meets a conflict (a serialization failure, SQLSTATE
40001, or a deadlock, 40P01) is the queue's to run again, at once, in a new transaction, with
no attempt counted and no failure logged; only the fifth conflict in a row counts an attempt,
and its error says why."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry
from tests.durable.conftest import BackgroundWorker, job, status_is, wait_until

pytestmark = pytest.mark.both_drivers

reg = Registry()
#: what the waiter does between its checkout and its wait
between: dict[str, threading.Event] = {}
#: the bodies' runs, by workflow
runs: dict[str, int] = {}
#: the engine the conflicting bodies change the shared row on, behind their backs
behind: dict[str, Engine] = {}


@postjob_sa.workflow(name="txc.waiter", transactional=True, registry=reg)
def waiter(session: Session, key: str) -> Any:
    if "checked_out" in between:
        between.pop("checked_out").set()  # the checkout's snapshot is taken ...
        assert between.pop("emitted").wait(20)  # ... and an emit commits after it
    return postjob_sa.wait_for_event(key)


@postjob_sa.workflow(name="txc.conflicts", transactional=True, registry=reg)
def conflicts(session: Session, until: int) -> str:
    """Updates the shared row after another transaction updated it past this one's snapshot
    (a real serialization failure at REPEATABLE READ) in its first ``until`` runs."""
    runs["conflicts"] = n = runs.get("conflicts", 0) + 1
    if n <= until:
        with behind["engine"].begin() as other:
            other.execute(text("UPDATE txc_rows SET n = n + 1 WHERE id = 1"))
    session.execute(text("UPDATE txc_rows SET n = n + 1 WHERE id = 1"))
    return f"run {n}"


@postjob_sa.workflow(name="txc.deadlock", transactional=True, registry=reg)
def deadlock(session: Session) -> str:
    """Its first run deadlocks with another transaction on two advisory locks (a real
    deadlock, which this one's shorter deadlock_timeout makes this one's to report); its
    second runs through."""
    runs["deadlock"] = n = runs.get("deadlock", 0) + 1
    session.execute(text("SELECT pg_advisory_xact_lock(37001)"))
    if n == 1:
        session.execute(text("SET LOCAL deadlock_timeout = '10ms'"))
        other = threading.Thread(target=_lock_two_then_one, daemon=True)
        other.start()
        wait_until(lambda: _waiting_for_a_lock(behind["engine"]), 20, "the other one waits")
    session.execute(text("SELECT pg_advisory_xact_lock(37002)"))
    session.execute(text("UPDATE txc_rows SET n = n + 1 WHERE id = 1"))
    return f"run {n}"


def _lock_two_then_one() -> None:
    with behind["engine"].begin() as conn:
        conn.execute(text("SET LOCAL deadlock_timeout = '60s'"))
        conn.execute(text("SELECT pg_advisory_xact_lock(37002)"))
        conn.execute(text("SELECT pg_advisory_xact_lock(37001) /* txc-other */"))


def _waiting_for_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%txc-other%' "
            "AND pid <> pg_backend_pid()")).scalar())


@pytest.fixture
def rr(engine: Engine, clean: None) -> Iterator[Engine]:
    """A worker's engine at REPEATABLE READ, the shared row, and no runs counted yet."""
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS txc_rows"))
        conn.execute(text("CREATE TABLE txc_rows (id int PRIMARY KEY, n int NOT NULL)"))
        conn.execute(text("INSERT INTO txc_rows VALUES (1, 0), (2, 0)"))
    rr = create_engine(engine.url, isolation_level="REPEATABLE READ")
    behind["engine"] = engine
    runs.clear()
    try:
        yield rr
    finally:
        between.clear()
        behind.clear()
        rr.dispose()
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS txc_rows"))


def _enqueue(engine: Engine, wf: Any, *args: Any, max_attempts: int = 1) -> int:
    with Session(engine) as s:
        job_id = JobQueue(s, registry=reg).enqueue(wf, *args, max_attempts=max_attempts).id
        s.commit()
    return int(job_id)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The worker's lines at WARNING and above, but its stop's."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("postjob_sa")
            and "the test is over" not in r.getMessage()]


def _failures(caplog: pytest.LogCaptureFixture, job_id: int) -> list[str]:
    """The job's lines at WARNING and above (where a failed run is logged)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.getMessage().startswith(f"job {job_id} (")]


def test_a_wait_that_meets_an_emit_committed_after_the_checkout_costs_no_attempt(
        engine: Engine, rr: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """The wait takes the key's lock, which the emit held: at REPEATABLE READ a serialization
    failure. With one attempt the job must still end ok, with the event's payload."""
    key = "txc-wait"
    job_id = _enqueue(engine, waiter, key, max_attempts=1)
    checked_out, emitted = threading.Event(), threading.Event()
    between.update(checked_out=checked_out, emitted=emitted)
    with BackgroundWorker(rr, reg, transactional=True):
        assert checked_out.wait(20)
        with engine.begin() as conn:  # committed after the job's snapshot, before its wait
            JobQueue(Session(bind=conn)).emit_event(key, "late")
        emitted.set()
        wait_until(lambda: job(engine, job_id)["status"] in ("ok", "failed"), 30,
                   "the job ended")
    ended = job(engine, job_id)
    assert (ended["status"], ended["results"], ended["failed_attempts"]) == ("ok", ["late"], 0), \
        ended
    assert _warnings(caplog) == []


def test_conflicts_short_of_five_are_run_again_at_once_without_an_attempt(
        engine: Engine, rr: Engine, caplog: pytest.LogCaptureFixture) -> None:
    job_id = _enqueue(engine, conflicts, 4, max_attempts=1)
    with BackgroundWorker(rr, reg, transactional=True):
        wait_until(lambda: job(engine, job_id)["status"] in ("ok", "failed"), 30,
                   "the job ended")
    ended = job(engine, job_id)
    assert (ended["status"], ended["results"], ended["failed_attempts"]) == \
        ("ok", ["run 5"], 0), ended
    assert runs["conflicts"] == 5
    assert _warnings(caplog) == []
    with engine.connect() as conn:  # 4 updates behind its back, and its own once
        assert conn.execute(text("SELECT n FROM txc_rows WHERE id = 1")).scalar() == 5


def test_the_fifth_conflict_in_a_row_counts_an_attempt_and_says_why(
        engine: Engine, rr: Engine, caplog: pytest.LogCaptureFixture) -> None:
    job_id = _enqueue(engine, conflicts, 1000, max_attempts=2)
    with BackgroundWorker(rr, reg, transactional=True):
        wait_until(status_is(engine, job_id, "failed"), 30, "the job failed")
    assert runs["conflicts"] == 10, "not five conflicts to each of its two attempts"
    ended = job(engine, job_id)
    assert ended["failed_attempts"] == 2
    assert "5 conflicts in a row" in ended["error_message"], ended
    assert "could not serialize" in ended["error_message"], ended
    logged = _failures(caplog, job_id)
    assert len(logged) == 2 and all("5 conflicts in a row" in m for m in logged), logged


def test_a_deadlock_is_run_again_at_once_without_an_attempt(
        engine: Engine, rr: Engine, caplog: pytest.LogCaptureFixture) -> None:
    job_id = _enqueue(engine, deadlock, max_attempts=1)
    with BackgroundWorker(rr, reg, transactional=True):
        wait_until(lambda: job(engine, job_id)["status"] in ("ok", "failed"), 30,
                   "the job ended")
    ended = job(engine, job_id)
    assert (ended["status"], ended["results"], ended["failed_attempts"]) == \
        ("ok", ["run 2"], 0), ended
    assert _warnings(caplog) == []
    assert runs["deadlock"] == 2
    with engine.connect() as conn:  # the second run's update, not the first's too
        assert conn.execute(text("SELECT n FROM txc_rows WHERE id = 1")).scalar() == 1


@postjob_sa.workflow(name="txc.parent", transactional=True, registry=reg)
def parent(session: Session) -> Any:
    return touching_parent.spawn().result()


@postjob_sa.workflow(name="txc.touching_parent", transactional=True, registry=reg)
def touching_parent(session: Session) -> str:
    """Its first run has another transaction change its (sleeping) parent's row past this
    one's snapshot: the parent's wake-up, written with this one's outcome, is a serialization
    failure."""
    runs["child"] = n = runs.get("child", 0) + 1
    if n == 1:
        with behind["engine"].begin() as other:
            other.execute(text("UPDATE postjob.postjobs SET workflow_status = 'touched' "
                               "WHERE id = :p"), {"p": postjob_sa.current_job().parent_id})
    return f"child run {n}"


def test_a_conflict_in_recording_the_outcome_is_run_again_at_once_without_an_attempt(
        engine: Engine, rr: Engine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="postjob_sa.worker")
    job_id = _enqueue(engine, parent, max_attempts=1)
    with BackgroundWorker(rr, reg, transactional=True):
        wait_until(lambda: job(engine, job_id)["status"] in ("ok", "failed"), 30,
                   "the parent ended")
    ended = job(engine, job_id)
    assert (ended["status"], ended["results"]) == ("ok", ["child run 2"]), ended
    with engine.connect() as conn:
        child = conn.execute(text("SELECT status::text, failed_attempts FROM postjob.postjobs "
                                  "WHERE parent_id = :p"), {"p": job_id}).one()
    assert tuple(child) == ("ok", 0)
    assert runs["child"] == 2
    retried = [m for m in caplog.messages if "running it again at once" in m]
    assert len(retried) == 1 and "its outcome (ok) could not be recorded" in retried[0], retried
    assert "SQLSTATE 40001" in retried[0], retried
    assert _warnings(caplog) == []


@postjob_sa.workflow(name="txc.wrapped", transactional=True, registry=reg)
def wrapped(session: Session, how: str) -> str:
    """Its first run meets a serialization failure and raises another error from it."""
    runs["wrapped"] = n = runs.get("wrapped", 0) + 1
    try:
        conflicts.fn(session, 1 if n == 1 else 0)
    except OperationalError as exc:
        if how == "nonrecoverable":
            raise postjob_sa.NonRecoverable("the app gives up on a conflict") from exc
        raise RuntimeError("the app's own error") from exc
    return f"run {n}"


@pytest.mark.parametrize(("how", "status"), [("from", "ok"), ("nonrecoverable", "failed")])
def test_an_error_raised_from_a_conflict_is_a_conflict_unless_non_recoverable(
        engine: Engine, rr: Engine, caplog: pytest.LogCaptureFixture, how: str,
        status: str) -> None:
    job_id = _enqueue(engine, wrapped, how, max_attempts=1)
    with BackgroundWorker(rr, reg, transactional=True):
        wait_until(lambda: job(engine, job_id)["status"] in ("ok", "failed"), 30,
                   "the job ended")
    assert job(engine, job_id)["status"] == status
    assert runs["wrapped"] == (2 if status == "ok" else 1)


@postjob_sa.workflow(name="txc.conflicts_async", transactional=True, registry=reg)
async def conflicts_async(session: AsyncSession, until: int) -> str:
    """:func:`conflicts` as an ``async def`` workflow (run on the worker's async engine)."""
    runs["async"] = n = runs.get("async", 0) + 1
    if n <= until:
        with behind["engine"].begin() as other:
            other.execute(text("UPDATE txc_rows SET n = n + 1 WHERE id = 1"))
    await session.execute(text("UPDATE txc_rows SET n = n + 1 WHERE id = 1"))
    return f"run {n}"


@pytest.fixture
def rr_default(engine: Engine, rr: Engine) -> Iterator[Engine]:
    """REPEATABLE READ as the database's default level: the level of the worker's async
    connections, which take the database's."""
    name = engine.url.database
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" SET default_transaction_isolation = '
                          "'repeatable read'"))
    try:
        yield rr
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" RESET default_transaction_isolation'))
        engine.dispose()  # its pooled connections carry the level


def test_an_async_workflow_s_conflicts_are_run_again_at_once_too(
        engine: Engine, rr_default: Engine, caplog: pytest.LogCaptureFixture) -> None:
    job_id = _enqueue(engine, conflicts_async, 2, max_attempts=1)
    with BackgroundWorker(rr_default, reg, transactional=True):
        wait_until(lambda: job(engine, job_id)["status"] in ("ok", "failed"), 30,
                   "the job ended")
    ended = job(engine, job_id)
    assert (ended["status"], ended["results"], ended["failed_attempts"]) == \
        ("ok", ["run 3"], 0), ended
    assert _warnings(caplog) == []
