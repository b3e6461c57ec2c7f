"""postjob_sa.testing: what a host application's tests use."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import URL, event
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import AsyncJobQueue, JobQueue, Registry, Status
from postjob_sa.testing import enqueued, enqueued_async, run_jobs, run_jobs_async
from tests.api.test_app_json_codec import app_engine

T = TypeVar("T")

reg = Registry()
attempts: list[int] = []


@postjob_sa.workflow(name="th.greet", registry=reg)
def greet(name: str) -> str:
    return f"hello {name}"


@postjob_sa.workflow(name="th.flaky", max_attempts=3, registry=reg)
def flaky() -> str:
    attempts.append(1)
    if len(attempts) < 3:
        raise RuntimeError("not yet")
    return "finally"


def test_enqueued_sees_the_sessions_own_pending_jobs(session: Session) -> None:
    JobQueue(session, registry=reg).enqueue(greet, "ada")
    assert [j.args for j in enqueued(session, greet)] == [["ada"]]
    assert enqueued(session, "th.greet", "bob") == []
    assert len(enqueued(session, greet, "ada", status=Status.ready)) == 1


def test_run_jobs_runs_until_idle_including_retries(session: Session) -> None:
    attempts.clear()
    q = JobQueue(session, registry=reg)
    q.enqueue(greet, "ada")
    q.enqueue(flaky)
    assert run_jobs(session, registry=reg) == 4
    assert [j.result() for j in enqueued(session, greet)] == ["hello ada"]
    (job,) = enqueued(session, flaky)
    assert job.status is Status.ok and job.result() == "finally" and job.failed_attempts == 2


# -- the async twins, on an AsyncSession of asyncpg (with an app's own jsonb codec) --------------

def _run_async(db_url: URL, body: Callable[[AsyncSession], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = app_engine(db_url)  # asyncpg, with Advanced Alchemy's binary jsonb codec
        try:
            async with AsyncSession(engine) as session:
                return await body(session)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_enqueued_async_sees_the_sessions_own_pending_jobs(db_url: URL, clean: None) -> None:
    async def body(session: AsyncSession) -> None:
        await AsyncJobQueue(session, registry=reg).enqueue(greet, "ada")
        assert [j.args for j in await enqueued_async(session, greet)] == [["ada"]]
        assert await enqueued_async(session, "th.greet", "bob") == []
        assert len(await enqueued_async(session, greet, "ada", status=Status.ready)) == 1
        assert await enqueued_async(session, greet, "ada", status=Status.ok) == []
        await session.rollback()
        assert await enqueued_async(session, greet) == []

    _run_async(db_url, body)


def test_run_jobs_async_runs_until_idle_including_retries(db_url: URL, clean: None) -> None:
    attempts.clear()

    async def body(session: AsyncSession) -> None:
        q = AsyncJobQueue(session, registry=reg)
        await q.enqueue(greet, "ada")
        await q.enqueue(flaky)
        assert await run_jobs_async(session, registry=reg) == 4
        assert [j.result() for j in await enqueued_async(session, greet, "ada")] == ["hello ada"]
        (job,) = await enqueued_async(session, flaky)
        assert job.status is Status.ok and job.result() == "finally" and job.failed_attempts == 2
        assert await run_jobs_async(session, registry=reg) == 0  # nothing left

    _run_async(db_url, body)


def test_enqueued_async_matches_args_whatever_the_apps_jsonb_codec_expects(
    db_url: URL, clean: None
) -> None:
    """A codec whose encoder takes the app's values (orjson.dumps(value)), with SQLAlchemy's
    default serializer: a jsonb parameter bound through it would be JSON of JSON text."""
    async def main() -> list[list[Any]]:
        engine = create_async_engine(db_url.set(drivername="postgresql+asyncpg"))

        @event.listens_for(engine.sync_engine, "connect")
        def _codec(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.run_async(lambda conn: conn.set_type_codec(
                "jsonb", encoder=lambda v: b"\x01" + json.dumps(v).encode(),
                decoder=lambda b: json.loads(b[1:]), schema="pg_catalog", format="binary"))

        try:
            async with AsyncSession(engine) as session:
                await AsyncJobQueue(session, registry=reg).enqueue(greet, "ada")
                return [j.args for j in await enqueued_async(session, greet, "ada")]
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == [["ada"]]
