"""AsyncJobQueue: the JobQueue operations inside the caller's AsyncSession transaction."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import postjob_sa
from postjob_sa import AsyncJobQueue, InvalidArgument, Registry, Status

reg = Registry()
T = TypeVar("T")


@postjob_sa.workflow(name="aq.double", registry=reg)
async def double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


#: set once a nap has begun (the worker runs it on an event loop of its own)
NAPPING = threading.Event()


@postjob_sa.workflow(name="aq.nap", registry=reg)
async def nap(seconds: float) -> str:
    NAPPING.set()
    await asyncio.sleep(seconds)
    return "rested"


#: the long jobs below say here whether their code is running (set on entry, cleared on exit)
LONG_RUNNING: dict[str, bool] = {}
LONG_JOB_SECONDS = 8.0


@postjob_sa.workflow(name="aq.long_sync", registry=reg)
def long_sync() -> str:
    LONG_RUNNING["sync"] = True
    try:
        deadline = time.monotonic() + LONG_JOB_SECONDS
        while time.monotonic() < deadline:  # Python code: stops at its next instruction
            time.sleep(0.01)
        return "done"
    finally:
        LONG_RUNNING["sync"] = False


@postjob_sa.workflow(name="aq.long_async", registry=reg)
async def long_async() -> str:
    LONG_RUNNING["async"] = True
    try:
        await asyncio.sleep(LONG_JOB_SECONDS)
        return "done"
    finally:
        LONG_RUNNING["async"] = False


ASYNC_DRIVERS = ["postgresql+psycopg", "postgresql+asyncpg"]


def _run(db_url: URL, body: Callable[[AsyncEngine], Awaitable[T]],
         driver: str = "postgresql+psycopg") -> T:
    async def main() -> T:
        engine = create_async_engine(db_url.set(drivername=driver))
        try:
            return await body(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _count(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


@pytest.fixture
def orders(engine: Engine, clean: None) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS aq_orders (id serial PRIMARY KEY, job_id bigint)"))
        conn.execute(text("TRUNCATE aq_orders"))
    return engine


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
def test_enqueue_commits_with_the_apps_rows_and_goes_with_a_rollback(
    db_url: URL, orders: Engine, driver: str
) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            job = await AsyncJobQueue(s, registry=reg).enqueue(double, 21)
            await s.execute(text("INSERT INTO aq_orders (job_id) VALUES (:j)"), {"j": job.id})
            await s.rollback()
        async with AsyncSession(engine) as s:
            job = await AsyncJobQueue(s, registry=reg).enqueue(double, 21)
            assert job.status is Status.ready and job.args == [21]
            await s.execute(text("INSERT INTO aq_orders (job_id) VALUES (:j)"), {"j": job.id})
            await s.commit()

    _run(db_url, body, driver)
    assert _count(orders, "SELECT count(*) FROM postjob.jobs") == 1
    assert _count(orders, "SELECT count(*) FROM aq_orders o JOIN postjob.postjobs j ON j.id = o.job_id") == 1


def test_bad_input_fails_before_anything_is_written_and_the_session_stays_usable(
    db_url: URL, orders: Engine
) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg)
            with pytest.raises(InvalidArgument, match="args"):
                await q.enqueue(double, {1, 2})
            with pytest.raises(InvalidArgument, match="lone surrogate"):
                await q.enqueue(double, "file-\udcff")
            await q.enqueue(double, 1)
            await s.commit()
        with pytest.raises(InvalidArgument, match="AsyncSession"):
            AsyncJobQueue(engine)  # type: ignore[arg-type]

    _run(db_url, body)
    assert _count(orders, "SELECT count(*) FROM postjob.jobs") == 1


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
def test_checkout_in_the_callers_transaction_skips_what_another_holds(
    db_url: URL, orders: Engine, driver: str
) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            await AsyncJobQueue(s, registry=reg).enqueue_many(double, [[i] for i in range(5)])
            await s.commit()
        async with AsyncSession(engine) as s1, AsyncSession(engine) as s2:
            first = await AsyncJobQueue(s1, registry=reg).checkout(limit=3)
            second = await AsyncJobQueue(s2, registry=reg).checkout(limit=3)  # at once: 2 left
            assert len(first) == 3 and len(second) == 2
            assert not {j.id for j in first} & {j.id for j in second}
            q = AsyncJobQueue(s1, fast_mode=True, registry=reg)
            await q.complete(first[0], 42)
            await q.fail(first[1], RuntimeError("no"), retry=False)
            assert first[0].status is Status.ok and first[1].status is Status.failed
            await s1.commit()
            await s2.rollback()

    _run(db_url, body, driver)
    assert _count(orders, "SELECT string_agg(status::text, ',' ORDER BY id) FROM postjob.jobs") \
        == "ok,failed,processing,ready,ready"  # s2's checkout was rolled back


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
def test_the_worker_entry_points_run_async_workflows(db_url: URL, orders: Engine, driver: str) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, fast_mode=True, registry=reg, concurrency=4)
            first = (await q.enqueue(double, 1)).id  # read before commit expires it
            await q.enqueue_many(double, [[i] for i in range(6)])
            await s.commit()
            assert await q.step() == first
            assert await q.drain() == 6
            await q.enqueue(nap, 0.05)
            await s.commit()
            assert await q.work(count=1) == 1

    _run(db_url, body, driver)
    assert _count(orders, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'") == 8


def test_cancelling_the_task_that_runs_work_stops_the_worker_after_its_jobs(
    db_url: URL, orders: Engine
) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg, concurrency=2)
            await q.enqueue(nap, 0.5)
            await s.commit()
            NAPPING.clear()
            task = asyncio.create_task(q.work(handle_signals=False))
            for _ in range(250):  # until the job runs (checked out is not enough: a job the
                await asyncio.sleep(0.02)  # slots hold but have not begun is handed back)
                if NAPPING.is_set():
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    _run(db_url, body)
    assert _count(orders, "SELECT status::text FROM postjob.jobs") == "ok"  # it ended first
    assert _count(orders, "SELECT count(*) FROM postjob.workers") == 0


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_second_cancel_hands_the_running_job_back_and_nothing_keeps_running(
    db_url: URL, orders: Engine, kind: str, concurrency: int
) -> None:
    """Issue 24 item 14: the second cancel of the task awaiting work() hands the running job
    back; its code stops, and work() returns only then (it used to return at once while
    the worker thread went on running the job, and asyncio.run waited for it)."""
    workflow = long_sync if kind == "sync" else long_async
    LONG_RUNNING.clear()

    async def body(engine: AsyncEngine) -> float:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg, concurrency=concurrency)
            await q.enqueue(workflow)
            await s.commit()
            task = asyncio.create_task(q.work(handle_signals=False))
            for _ in range(250):
                await asyncio.sleep(0.02)
                if LONG_RUNNING.get(kind):
                    break
            assert LONG_RUNNING.get(kind)
            task.cancel()  # the first: stop after the running job
            await asyncio.sleep(0.3)
            assert not task.done() and LONG_RUNNING[kind]  # the job goes on
            task.cancel()  # the second: hand it back
            began = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert LONG_RUNNING[kind] is False  # its code has stopped
            return time.monotonic() - began

    started = time.monotonic()
    took = _run(db_url, body)
    # asyncio.run did not wait for the job (it had most of its 8 s to go)
    assert took < LONG_JOB_SECONDS - 2 and time.monotonic() - started < LONG_JOB_SECONDS - 2
    with orders.connect() as conn:
        status, attempts = conn.execute(text(
            "SELECT status::text, failed_attempts FROM postjob.jobs")).one()
    assert (status, attempts) == ("ready", 0)  # handed back, no attempt counted
    assert _count(orders, "SELECT count(*) FROM postjob.workers") == 0


def test_args_that_do_not_fit_the_workflow_are_refused_and_the_session_stays_usable(
    db_url: URL, orders: Engine
) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg)
            await q.enqueue(double, 1)
            with pytest.raises(InvalidArgument, match="too many positional arguments"):
                await q.enqueue(double, 1, 2)
            with pytest.raises(InvalidArgument, match="missing a required argument"):
                await q.enqueue_many("aq.double", [[1], []])
            await s.commit()

    _run(db_url, body)
    assert _count(orders, "SELECT count(*) FROM postjob.postjobs") == 1
