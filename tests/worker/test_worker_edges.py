"""The worker at its edges: a locked due job, a slow job beside a quick one in a batch, an
interrupted job, the engine's own connection settings, and errors the database raises."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry, WorkerOptions
from postjob_sa.worker.loop import Worker
from tests.conftest import driver_under_test, libpq_url

pytestmark = pytest.mark.both_drivers

reg = Registry()


@postjob_sa.workflow(name="edge.echo", registry=reg)
def echo(value: Any) -> Any:
    return value


@postjob_sa.workflow(name="edge.nap", registry=reg)
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"


@postjob_sa.workflow(name="edge.exit", registry=reg)
def exits(kind: str) -> None:
    if kind == "exit":
        raise SystemExit(3)
    if kind == "keyboard":
        raise KeyboardInterrupt
    raise asyncio.CancelledError


def _statuses(engine: Engine) -> dict[int, tuple[str, int]]:
    with engine.connect() as conn:
        return {int(r[0]): (str(r[1]), int(r[2])) for r in conn.execute(text(
            "SELECT id, status::text, failed_attempts FROM postjob.jobs ORDER BY id"))}


def _transactions(engine: Engine) -> int:
    """The database's transactions counted so far."""
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(conn.execute(text(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()")).scalar_one())


IDLE_BACKENDS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND state = 'idle' AND pid <> pg_backend_pid()")


def _transactions_once_earlier_ones_are_counted(engine: Engine) -> int:
    """_transactions, once what ran before is in the statistics: an idle backend may hold its
    counts back for up to 10 s (a test's polling a moment ago), one that exits reports them.
    So the pool's idle connections are closed (a connection checked out stays) and their
    backends waited out (10 s at most: an idle backend of another engine has reported by
    then)."""
    engine.pool.dispose()
    deadline = time.monotonic() + 10
    while _scalar(engine, IDLE_BACKENDS) and time.monotonic() < deadline:
        engine.pool.dispose()  # the look's own connection
        time.sleep(0.05)
    engine.pool.dispose()
    return _transactions(engine)


def _scalar(engine: Engine, query: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


@contextlib.contextmanager
def running_worker(engine: Engine) -> Iterator[Worker]:
    """A worker's loop in a thread, stopped (and its connections closed) at the end."""
    worker = Worker(engine, reg, WorkerOptions(fast_mode=True, handle_signals=False))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stopper.request("the test is over")
        thread.join(30)
        assert not thread.is_alive()


def _status(engine: Engine, job_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                                {"i": job_id}).scalar_one())


def _until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _hold_runnable_row(holder: Any, job_id: int) -> None:
    """What an app's checkout or an operator's command not yet committed does to a job."""
    holder.begin()
    holder.execute(text("SELECT 1 FROM postjob.unfinished WHERE job_id = :i FOR UPDATE"),
                   {"i": job_id})


def test_an_idle_worker_does_not_spin_on_a_deadline_it_cannot_reap(
    engine: Engine, clean: None
) -> None:
    """A job past its deadline whose runnable row another transaction holds: the reaper skips
    it, so at every idle look something is due now. The worker looks again less and less often
    (``idle.MISS_DELAYS``), never in a loop; once the row is free the job is timed out."""
    with Session(engine) as s:
        job_id = JobQueue(s, registry=reg).enqueue(echo, 1, timeout=0.5).id
        s.commit()
    with engine.connect() as holder:
        _hold_runnable_row(holder, job_id)
        time.sleep(1.2)  # past its deadline
        before = _transactions_once_earlier_ones_are_counted(engine)
        started = time.monotonic()
        with running_worker(engine):
            time.sleep(3)
            elapsed = time.monotonic() - started
            time.sleep(1.2)  # the statistics of those 3 s are in
            spent = _transactions(engine) - before
            holder.rollback()
            _until(lambda: _status(engine, job_id) == "timeout", 15, "the job was timed out")
    print(f"idle worker beside a deadline it cannot reap: {spent} transactions in {elapsed:.1f} s")
    # a few per second, not thousands (and the start's own: registration, the schema check,
    # the pooler probe's five statements); a loaded machine stretches the 3 s
    assert spent < 25 + 5 * (elapsed + 1.2), (spent, elapsed)


def test_a_due_job_another_transaction_held_runs_by_the_idle_wait_s_cap(
    engine: Engine, clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker skips a due job whose runnable row another transaction holds, without looking
    for it in a loop; when that transaction rolls back nothing wakes the worker, so the job
    runs at the next wake-up or when the idle wait's cap ends it (``idle.WAIT_CAP``, 30 s;
    2 s here)."""
    from postjob_sa.worker import idle

    monkeypatch.setattr(idle, "WAIT_CAP", 2.0)
    with Session(engine) as s:
        job_id = JobQueue(s, registry=reg).enqueue(echo, 1).id
        s.commit()
    with engine.connect() as holder:
        _hold_runnable_row(holder, job_id)
        before = _transactions_once_earlier_ones_are_counted(engine)
        with running_worker(engine):
            time.sleep(3)
            assert _status(engine, job_id) == "ready"  # skipped, not waited for
            time.sleep(1.2)
            spent = _transactions(engine) - before
            holder.rollback()
            released = time.monotonic()
            _until(lambda: _status(engine, job_id) == "ok", 15, "the job ran")
            took = time.monotonic() - released
    print(f"idle worker beside a held due job: {spent} transactions in 4.2 s; ran {took:.1f} s "
          "after the release")
    assert spent < 25 + 5 * 4.2, spent


def test_a_quick_jobs_outcome_does_not_wait_for_a_slow_one_in_the_same_batch(
    engine: Engine, clean: None
) -> None:
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        quick = q.enqueue(echo, "quick").id
        slow = q.enqueue(nap, 3.0).id
        s.commit()

    def drain() -> None:
        with Session(engine) as s:
            JobQueue(s, registry=reg, batch_size=2).drain()

    worker = threading.Thread(target=drain)
    worker.start()
    try:
        deadline = time.monotonic() + 1.5
        while _statuses(engine)[quick][0] != "ok" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _statuses(engine) == {quick: ("ok", 0), slow: ("processing", 0)}
    finally:
        worker.join(60)
    assert _statuses(engine) == {quick: ("ok", 0), slow: ("ok", 0)}


@pytest.mark.parametrize(("kind", "error", "running_job"), [
    ("exit", SystemExit, ("err", 1)),  # the job's own doing: an attempt
    ("keyboard", KeyboardInterrupt, ("ready", 0)),  # interrupted from outside: handed back
    ("cancel", asyncio.CancelledError, ("ready", 0)),
])
def test_an_interrupted_job_is_recorded_and_the_rest_of_its_batch_handed_back(
    engine: Engine, clean: None, kind: str, error: type[BaseException], running_job: tuple[str, int]
) -> None:
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=reg, batch_size=3)
        first = q.enqueue(echo, 1).id
        interrupted = q.enqueue(exits, kind).id
        unstarted = q.enqueue(echo, 3).id
        s.commit()
        with pytest.raises(error):
            q.drain()
    statuses = _statuses(engine)
    assert statuses[first] == ("ok", 0)
    assert statuses[interrupted] == running_job
    assert statuses[unstarted] == ("ready", 0)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM postjob.workers")).scalar() == 0


@pytest.fixture
def configured(db_url: URL) -> Iterator[tuple[Engine, list[str]]]:
    """An engine whose connections are made by its own creator and set up by a connect event."""
    made: list[str] = []
    driver: Any = importlib.import_module(driver_under_test())

    def creator() -> Any:
        made.append("creator")
        return driver.connect(libpq_url(db_url))

    eng = create_engine(f"postgresql+{driver_under_test()}://", creator=creator)

    @event.listens_for(eng, "connect")
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        with dbapi_connection.cursor() as cur:
            cur.execute("SET statement_timeout = '12345ms'")
        dbapi_connection.commit()

    yield eng, made
    eng.dispose()


def test_worker_connections_come_from_the_engine(configured: tuple[Engine, list[str]], clean: None) -> None:
    eng, made = configured
    r = Registry()
    seen: list[str] = []

    @postjob_sa.workflow(name="edge.setting", transactional=True, registry=r)
    def setting(session: Session) -> None:
        seen.append(session.execute(text("SHOW statement_timeout")).scalar_one())

    @postjob_sa.workflow(name="edge.long", registry=r)
    def long() -> None:
        time.sleep(0.5)  # long enough for the heartbeat (lease 0.6 s) to need its connection

    with Session(eng) as s:
        q = JobQueue(s, registry=r, lease=0.6)
        q.enqueue(setting)
        q.enqueue(long)
        s.commit()
        before = len(made)
        assert q.drain() == 2
    assert seen == ["12345ms"]
    assert len(made) - before >= 2  # the worker's own connection and the heartbeat's


def test_a_value_the_database_refuses_fails_that_job_and_no_other(
    engine: Engine, clean: None, caplog: pytest.LogCaptureFixture
) -> None:
    with engine.begin() as conn:  # a rule of the host's: the database refuses this result
        conn.execute(text(
            "ALTER TABLE postjob.postjobs ADD CONSTRAINT no_poison "
            "CHECK (results IS NULL OR results <> '[\"poison\"]'::jsonb) NOT VALID"))
    try:
        with Session(engine) as s:
            q = JobQueue(s, fast_mode=True, registry=reg, batch_size=3)
            ids = [q.enqueue(echo, v).id for v in ("a", "poison", "b")]
            s.commit()
            with caplog.at_level(logging.WARNING, logger="postjob_sa.worker"):
                assert q.drain() == 3
        statuses = _statuses(engine)
        assert [statuses[i] for i in ids] == [("ok", 0), ("failed", 1), ("ok", 0)]
        with engine.connect() as conn:
            error, message = conn.execute(text(
                "SELECT error, error_message FROM postjob.jobs WHERE id = :i"),
                {"i": ids[1]}).one()
        assert error == "OutcomeRefused" and "no_poison" in message
        assert "the database refused its outcome" in caplog.text
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE postjob.postjobs DROP CONSTRAINT no_poison"))


DEADLOCK_TRIGGER = """
CREATE FUNCTION edge_deadlock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- a sequence counts the deadlocks raised (nextval survives the rollback they cause)
  IF nextval('edge_deadlocks') <= (SELECT n FROM edge_deadlock_count) THEN
    RAISE EXCEPTION 'deadlock detected (a test)' USING ERRCODE = 'deadlock_detected';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER edge_deadlock BEFORE UPDATE ON postjob.{table}
  FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION edge_deadlock();
"""


@contextlib.contextmanager
def _deadlocks(engine: Engine, count: int, when: str, table: str = "postjobs") -> Iterator[None]:
    """The first ``count`` updates of a row of ``table`` (a job's record, or its row in
    postjob.unfinished) that match ``when`` (SQL) fail as deadlocks."""
    with engine.begin() as conn:
        conn.execute(text("CREATE SEQUENCE edge_deadlocks"))
        conn.execute(text("CREATE TABLE edge_deadlock_count (n int)"))
        conn.execute(text("INSERT INTO edge_deadlock_count VALUES (:n)"), {"n": count})
        conn.execute(text(DEADLOCK_TRIGGER.format(when=when, table=table)))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER edge_deadlock ON postjob.{table}"))
            conn.execute(text("DROP FUNCTION edge_deadlock()"))
            conn.execute(text("DROP TABLE edge_deadlock_count"))
            conn.execute(text("DROP SEQUENCE edge_deadlocks"))


@pytest.mark.parametrize(("deadlocks", "expected"), [(2, ("ok", 0)), (1000, ("failed", 1))])
def test_deadlocks_are_tried_again_a_bounded_number_of_times(
    engine: Engine, clean: None, caplog: pytest.LogCaptureFixture,
    deadlocks: int, expected: tuple[str, int],
) -> None:
    with _deadlocks(engine, deadlocks, """NEW.results = '["deadlock"]'::jsonb"""):
        with Session(engine) as s:
            q = JobQueue(s, fast_mode=True, registry=reg, batch_size=2)
            ids = [q.enqueue(echo, v).id for v in ("deadlock", "fine")]
            s.commit()
        done: list[int] = []

        def drain() -> None:
            with Session(engine) as s:
                done.append(JobQueue(s, fast_mode=True, registry=reg, batch_size=2).drain())

        with caplog.at_level(logging.WARNING, logger="postjob_sa.worker"):
            worker = threading.Thread(target=drain)
            worker.start()
            worker.join(30)
        assert not worker.is_alive(), "the worker retries a deadlock for ever"
        statuses = _statuses(engine)
        assert [statuses[i] for i in ids] == [expected, ("ok", 0)]
        assert "trying again" in caplog.text
        assert "database unreachable" not in caplog.text  # a deadlock is not a lost connection


@pytest.mark.parametrize("deadlocks", [6, 1000])
def test_a_checkout_that_deadlocks_is_tried_again_by_the_loop_a_bounded_number_of_times(
    engine: Engine, clean: None, caplog: pytest.LogCaptureFixture, deadlocks: int,
) -> None:
    # 6: more than the cycle's own retries (3), fewer than the loop's turns (10)
    with _deadlocks(engine, deadlocks, "NEW.lease_token IS NOT NULL AND OLD.lease_token IS NULL",
                    table="unfinished"):
        with Session(engine) as s:
            job_id = JobQueue(s, registry=reg).enqueue(echo, "fine").id
            s.commit()
        errors: list[BaseException] = []

        def drain() -> None:
            try:
                with Session(engine) as s:
                    JobQueue(s, fast_mode=True, registry=reg).drain()
            except Exception as exc:
                errors.append(exc)

        with caplog.at_level(logging.WARNING, logger="postjob_sa.worker"):
            worker = threading.Thread(target=drain)
            worker.start()
            worker.join(60)
        assert not worker.is_alive(), "the worker retries a deadlock for ever"
        if deadlocks == 6:
            assert errors == [] and _statuses(engine)[job_id] == ("ok", 0)
        else:  # it gives up and says why; the job waits for the next worker
            assert len(errors) == 1 and "deadlock detected" in str(errors[0])
            assert _statuses(engine)[job_id][0] == "ready"
        assert "trying again" in caplog.text
        assert "database unreachable" not in caplog.text
