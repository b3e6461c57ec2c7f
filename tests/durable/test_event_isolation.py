"""No event wake-up is lost, whatever the isolation level: an emit at REPEATABLE READ or
SERIALIZABLE whose snapshot predates a wait, a transactional job at REPEATABLE READ whose
snapshot predates an emit, a database whose default level is REPEATABLE READ, and a job that
waits for two keys while one of two emits rolls back.

At REPEATABLE READ and SERIALIZABLE a conflict may come back as a serialization failure,
which the caller tries again (as for any conflict at those levels); what must never happen is
an emit that commits and a waiter that sleeps on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidArgument, JobQueue, Registry
from tests.durable.conftest import BackgroundWorker, job, status_is, wait_until

pytestmark = pytest.mark.both_drivers

reg = Registry()
#: what the transactional waiter does between its checkout and its wait
between: dict[str, threading.Event] = {}


@postjob_sa.workflow(name="evi.waiter", registry=reg)
def waiter(key: str) -> Any:
    return postjob_sa.wait_for_event(key)


@postjob_sa.workflow(name="evi.waiter_tx", transactional=True, registry=reg)
def waiter_tx(session: Session, key: str) -> Any:
    if "checked_out" in between:
        between.pop("checked_out").set()  # the checkout's snapshot is taken ...
        assert between.pop("emitted").wait(20)  # ... and an emit commits after it
    return postjob_sa.wait_for_event(key)


def _enqueue(engine: Engine, wf: Any, *args: Any) -> int:
    with Session(engine) as s:
        job_id = JobQueue(s, registry=reg).enqueue(wf, *args).id
        s.commit()
    return int(job_id)


def _drain(engine: Engine) -> int:
    with Session(engine) as s:
        return JobQueue(s, fast_mode=True, registry=reg).drain()


def _emit_retried(conn: Connection, key: str, payload: Any) -> None:
    """emit_event in the connection's transaction, tried again after a serialization failure."""
    for _ in range(5):
        try:
            JobQueue(Session(bind=conn)).emit_event(key, payload)
            conn.commit()
            return
        except OperationalError as exc:
            assert "could not serialize" in str(exc) or "deadlock" in str(exc), exc
            conn.rollback()
            conn.begin()
    raise AssertionError("the emit kept failing")


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_an_emit_whose_snapshot_predates_the_wait_still_wakes_it(
        engine: Engine, clean: None, level: str) -> None:
    key = f"iso-emit-{level}"
    job_id = _enqueue(engine, waiter, key)
    with engine.connect().execution_options(isolation_level=level) as emitter:
        emitter.begin()
        emitter.execute(text("SELECT 1"))  # the emitter's snapshot: nobody waits yet
        assert _drain(engine) == 1  # the job records its wait and sleeps
        assert job(engine, job_id)["status"] == "sleep"
        _emit_retried(emitter, key, {"at": level})
    assert _drain(engine) == 1, "the emit committed, its waiter was not woken"
    assert job(engine, job_id)["results"] == [{"at": level}]


def test_a_transactional_job_at_repeatable_read_sees_an_event_emitted_after_its_checkout(
        engine: Engine, clean: None) -> None:
    key = "iso-tx-wait"
    job_id = _enqueue(engine, waiter_tx, key)
    checked_out, emitted = threading.Event(), threading.Event()
    between.update(checked_out=checked_out, emitted=emitted)
    rr = create_engine(engine.url, isolation_level="REPEATABLE READ")
    try:
        with BackgroundWorker(rr, reg, transactional=True):
            assert checked_out.wait(20)
            with engine.begin() as conn:  # committed after the job's snapshot, before its wait
                JobQueue(Session(bind=conn)).emit_event(key, "late")
            emitted.set()
            wait_until(status_is(engine, job_id, "ok"), 20, "the job saw the event")
    finally:
        between.clear()
        rr.dispose()
    assert job(engine, job_id)["results"] == ["late"]


@pytest.fixture
def rr_database(engine: Engine, clean: None) -> Iterator[Engine]:
    """The module's database, with REPEATABLE READ as its default level for new sessions."""
    name = engine.url.database
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" SET default_transaction_isolation = '
                          "'repeatable read'"))
    rr = create_engine(engine.url)
    try:
        with rr.connect() as conn:
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "repeatable read"
        yield rr
    finally:
        rr.dispose()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" RESET default_transaction_isolation'))
        engine.dispose()  # its pooled connections carry the level


def test_a_worker_on_a_database_whose_default_is_repeatable_read_misses_no_event(
        rr_database: Engine) -> None:
    """The wait takes the key's lock and then reads the events: a worker statement at the
    database's REPEATABLE READ would read them in a snapshot taken before the lock."""
    key = "iso-default-rr"
    job_id = _enqueue(rr_database, waiter, key)
    with rr_database.connect().execution_options(isolation_level="READ COMMITTED") as emitter:
        emitter.begin()
        JobQueue(Session(bind=emitter)).emit_event(key, "held")  # the key's lock, until commit
        done = threading.Event()

        def run() -> None:
            _drain(rr_database)  # its wait queues behind the emit
            done.set()

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        wait_until(lambda: _waiting_for_a_lock(rr_database), 20, "the wait queued behind the emit")
        emitter.commit()
        runner.join(30)
        assert done.is_set()
    wait_until(lambda: _drain(rr_database) or job(rr_database, job_id)["status"] == "ok", 10,
               "the job got the event")
    assert job(rr_database, job_id)["results"] == ["held"]
    # at once, at READ COMMITTED: no attempt lost to a serialization failure on the way
    assert job(rr_database, job_id)["failed_attempts"] == 0


def test_a_pooled_worker_on_a_database_whose_default_is_repeatable_read_is_refused(
        rr_database: Engine) -> None:
    """Behind a pooler the worker cannot set its level (no session state): it refuses to
    start, in one line, saying what to set."""
    with Session(rr_database) as s, pytest.raises(InvalidArgument) as refused:
        JobQueue(s, registry=reg, pooled=True).drain()
    assert "default_transaction_isolation" in str(refused.value)
    assert "read committed" in str(refused.value)


def _waiting_for_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%wait_event%'")).scalar())


def test_a_job_waiting_for_two_keys_is_woken_when_one_of_two_emits_rolls_back(
        engine: Engine, clean: None) -> None:
    """Two emits under the two keys one job waits for (as ``asyncio.gather`` of two waits
    leaves it): the first holds the job's rows, the second goes on meanwhile; the first rolls
    back. The second committed, so the job must be woken."""
    job_id = _enqueue(engine, waiter, "two-a")
    assert _drain(engine) == 1
    assert job(engine, job_id)["status"] == "sleep"
    with engine.begin() as conn:  # its second wait, under the other key
        conn.execute(text("INSERT INTO postjob.event_waits (job_id, seq, key) "
                          "VALUES (:j, 2, 'two-b')"), {"j": job_id})
    with engine.connect() as first, engine.connect() as second:
        first.begin()
        JobQueue(Session(bind=first)).emit_event("two-a", "a")  # wakes the job: holds its rows
        done = threading.Event()

        def emit_second() -> None:
            with second.begin():
                JobQueue(Session(bind=second)).emit_event("two-b", "b")
            done.set()

        t = threading.Thread(target=emit_second, daemon=True)
        t.start()
        t.join(2)  # the second emit goes on (or waits for the first)
        first.rollback()  # the first wakes no one after all
        t.join(30)
        assert done.is_set()
    assert _drain(engine) == 1, "the second emit committed, the job it waits for sleeps on"
