"""Events: an emit's commit wakes its waiters (NOTIFY: an idle worker runs them at once), a
rollback wakes no one, an event emitted before the wait counts, a timeout is raised, caught
and replayed, and emits and waits on one key at the same moment lose no wake-up."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import InvalidArgument, JobQueue
from tests.durable import durable_app
from tests.durable.conftest import (
    BackgroundWorker,
    drain,
    enqueue,
    job,
    records,
    status_is,
    steps,
    wait_until,
    waiting,
)

pytestmark = pytest.mark.both_drivers


def _emit(engine: Engine, key: str, payload: Any = None, *, commit: bool = True) -> int:
    with Session(engine) as s:
        event_id = JobQueue(s).emit_event(key, payload)
        s.commit() if commit else s.rollback()
    return event_id


def _events(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.events")).scalar_one())


def test_an_emits_commit_wakes_its_waiter(side: Engine) -> None:
    job_id = enqueue(side, durable_app.waiter, "order-1:shipped")
    with BackgroundWorker(side):
        wait_until(status_is(side, job_id, "sleep"), 10, "waiting")
        row = waiting(side, job_id)
        assert row == {"status": "sleep", "run_at": None, "due": False}  # no time: no polling
        with Session(side) as s:
            JobQueue(s).emit_event("order-1:shipped", {"carrier": "ups"})
            time.sleep(0.3)
            assert job(side, job_id)["status"] == "sleep"  # not before the commit
            s.commit()
            committed = time.monotonic()
        wait_until(status_is(side, job_id, "ok"), 25, "woken by the commit")
        assert time.monotonic() - committed < 15  # NOTIFY: the idle wait is 30 s otherwise
    assert job(side, job_id)["results"] == [{"carrier": "ups"}]
    assert records(side, "delivered", job_id) == 1
    (stored,) = steps(side, job_id)
    assert (stored["kind"], stored["digest"], stored["result"]) == (
        "event", "order-1:shipped", [{"carrier": "ups"}])


def test_a_rolled_back_emit_wakes_no_one(side: Engine) -> None:
    job_id = enqueue(side, durable_app.waiter, "k")
    drain(side)
    _emit(side, "k", 1, commit=False)
    drain(side)
    assert job(side, job_id)["status"] == "sleep"
    assert waiting(side, job_id) == {"status": "sleep", "run_at": None, "due": False}
    assert _events(side) == 0
    _emit(side, "k", 2)
    drain(side)
    assert job(side, job_id)["results"] == [2]


def test_an_event_emitted_before_the_wait_counts_and_the_first_wins(side: Engine) -> None:
    _emit(side, "early", "first")
    _emit(side, "early", "second")
    ids = [enqueue(side, durable_app.waiter, "early"),
           enqueue(side, durable_app.waiter_async, "early"),
           enqueue(side, durable_app.waiter_tx, "early")]
    drain(side)
    drain(side, transactional=True)
    assert [job(side, j)["results"] for j in ids] == [["first"]] * 3


def test_a_timeout_is_raised_and_caught(side: Engine) -> None:
    job_id = enqueue(side, durable_app.waiter, "never", 0.3)
    drain(side)
    row = waiting(side, job_id)
    assert row is not None and row["run_at"] is not None and not row["due"]
    time.sleep(0.35)
    drain(side)
    assert job(side, job_id)["results"] == ["timeout"]
    assert steps(side, job_id)[0]["error"] == "EventTimeout"


def test_a_caught_timeout_is_replayed_though_the_event_came_later(side: Engine) -> None:
    """The memo of a timeout: the run after the sleep takes the timeout branch again, though
    the event is there by then."""
    job_id = enqueue(side, durable_app.wait_then_nap, "late", 0.2, 0.5)
    drain(side)  # waits
    time.sleep(0.25)
    drain(side)  # times out, sleeps
    assert job(side, job_id)["status"] == "sleep"
    _emit(side, "late", "too late")
    time.sleep(0.55)
    drain(side)
    assert job(side, job_id)["results"] == ["timed out"]


def test_a_transactional_waiter_is_woken(side: Engine) -> None:
    job_id = enqueue(side, durable_app.waiter_tx, "tx-key")
    drain(side, transactional=True)
    assert job(side, job_id)["status"] == "sleep"
    _emit(side, "tx-key", [1, 2])
    drain(side, transactional=True)
    assert job(side, job_id)["results"] == [[1, 2]]


def test_a_wait_beside_an_uncommitted_emit_is_not_lost(side: Engine) -> None:
    """The per-key serialization: while an emit's transaction is open, waiters look for the
    event (not committed: they see none) and would record their waits, which that emit,
    having looked already, never sees: a lost wake-up, unless a wait waits for the emit on
    its key to end and then looks again."""
    waiters = [enqueue(side, durable_app.waiter, "held") for _ in range(3)]
    with BackgroundWorker(side, concurrency=3), Session(side) as s:
        JobQueue(s).emit_event("held", "payload")
        time.sleep(1.0)  # the waiters run now, the emit not yet committed
        s.commit()
        for job_id in waiters:
            wait_until(status_is(side, job_id, "ok"), 10, f"waiter {job_id} delivered")
    assert [job(side, j)["results"] for j in waiters] == [["payload"]] * 3


def test_eight_emits_at_once_give_each_waiter_one_delivery(side: Engine) -> None:
    """Eight threads emit under one key at the same moment, while some waiters sleep and
    others are just starting to wait: each waiter is delivered the first event, once, and is
    woken once (the first emit takes the waits; the others find none)."""
    asleep = [enqueue(side, durable_app.waiter, "burst") for _ in range(4)]
    drain(side)
    starting = [enqueue(side, durable_app.waiter, "burst") for _ in range(4)]
    barrier = threading.Barrier(9)
    errors: list[BaseException] = []

    def emit(n: int) -> None:
        try:
            with Session(side) as s:
                barrier.wait(10)
                JobQueue(s).emit_event("burst", n)
                s.commit()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=emit, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    with BackgroundWorker(side, concurrency=4):
        barrier.wait(10)
        for t in threads:
            t.join(30)
        assert not errors, errors
        for job_id in asleep + starting:
            wait_until(status_is(side, job_id, "ok"), 10, f"waiter {job_id} delivered")
    with side.connect() as conn:
        first = conn.execute(text(
            "SELECT payload FROM postjob.events WHERE key = 'burst' ORDER BY id LIMIT 1")).scalar()
        delivered = conn.execute(text(
            "SELECT job_id, count(*) FROM rel_runs WHERE what = 'delivered' GROUP BY job_id")).all()
    assert _events(side) == 8
    assert sorted(delivered) == [(j, 1) for j in asleep + starting]
    assert {job(side, j)["results"][0] for j in asleep + starting} == {first}


def test_bad_keys_and_payloads_are_refused(side: Engine) -> None:
    with Session(side) as s:
        q = JobQueue(s)
        for key in ("", None, "a\x00b", "x" * 501):
            with pytest.raises(InvalidArgument):
                q.emit_event(key)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            q.emit_event("k", {1, 2})
    assert _events(side) == 0


def test_async_job_queue_emits_in_the_callers_transaction(side: Engine) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from postjob_sa import AsyncJobQueue

    job_id = enqueue(side, durable_app.waiter, "async-key")
    drain(side)

    async def emit() -> None:
        engine = create_async_engine(side.url.set(drivername="postgresql+psycopg"))
        try:
            async with AsyncSession(engine) as s:
                await AsyncJobQueue(s).emit_event("async-key", "rolled back")
                await s.rollback()
                await AsyncJobQueue(s).emit_event("async-key", "committed")
                await s.commit()
        finally:
            await engine.dispose()

    asyncio.run(emit())
    drain(side)
    assert job(side, job_id)["results"] == ["committed"]


def test_an_emit_while_the_waiters_sleep_is_being_recorded_wakes_it(side: Engine) -> None:
    """The waiter has recorded its wait and its sleep outcome is on its way (held back by a
    share lock of the test's on its row) when the emit comes: the emit waits for that sleep
    to be recorded, then finds its waiting row and makes it due."""
    durable_app.WAITER_GATE.clear()
    job_id = enqueue(side, durable_app.waiter_gated, "racing")

    def count(sql: str) -> int:  # a transaction per look (activity is read once per one)
        with side.connect() as conn:
            return int(conn.execute(text(sql), {"j": job_id}).scalar_one())

    locks = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND wait_event_type = 'Lock'")
    with BackgroundWorker(side):
        wait_until(status_is(side, job_id, "processing"), 10, "running")
        with side.connect() as holder:
            holder.execute(text("SELECT 1 FROM postjob.unfinished WHERE job_id = :j FOR SHARE"),
                           {"j": job_id})
            durable_app.WAITER_GATE.set()  # the lock is ours: now the run may wait and sleep
            wait_until(lambda: count("SELECT count(*) FROM postjob.event_waits WHERE job_id = :j"),
                       10, "the wait recorded")
            wait_until(lambda: count(locks) == 1, 10, "the sleep outcome waits for the lock")
            emitter = threading.Thread(target=_emit, args=(side, "racing", "here"))
            emitter.start()
            wait_until(lambda: count(locks) == 2 or not emitter.is_alive(), 10,
                       "the emit waits too (or is done)")
            holder.rollback()
        emitter.join(10)
        wait_until(status_is(side, job_id, "ok"), 5, "woken by the emit")
    assert job(side, job_id)["results"] == ["here"]
