"""A workflow's arguments are positional: a keyword that is not an option of the call is
refused with ``InvalidArgument`` that says so and names the class called (``JobQueue`` or
``AsyncJobQueue``, not the queue ``AsyncJobQueue`` runs underneath); nothing is written and
the caller's session stays usable. A keyword to ``spawn`` fails the parent's run the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import URL, Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import AsyncJobQueue, InvalidArgument, JobQueue, Registry, Status
from postjob_sa.testing import enqueued, run_jobs

reg = Registry()


@postjob_sa.workflow(name="kw.send", registry=reg)
def send(to: str, subject: str = "hi") -> str:
    return f"{subject} {to}"


@postjob_sa.workflow(name="kw.parent", registry=reg, max_attempts=1)
def parent() -> str:
    return str(send.spawn("ada", subject="yo").result())  # type: ignore[call-arg]


def _jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.postjobs")).scalar_one())


CALLS = {
    "enqueue": lambda q: q.enqueue(send, "ada", subject="yo"),
    "enqueue_many": lambda q: q.enqueue_many(send, [["ada"]], subject="yo"),
}


@pytest.mark.parametrize("method", sorted(CALLS))
def test_jobqueue_refuses_a_keyword_argument_naming_itself(
    engine: Engine, session: Session, method: str
) -> None:
    q = JobQueue(session, registry=reg)
    with pytest.raises(InvalidArgument) as refused:
        CALLS[method](q)
    message = str(refused.value)
    assert f"JobQueue.{method}" in message and "positional" in message and "'subject'" in message
    assert session.execute(text("SELECT 1")).scalar() == 1  # the session is usable
    q.enqueue(send, "ada", "yo")
    session.commit()
    assert _jobs(engine) == 1


@pytest.mark.parametrize("driver", ["postgresql+asyncpg", "postgresql+psycopg"])
@pytest.mark.parametrize("method", sorted(CALLS))
def test_asyncjobqueue_refuses_a_keyword_argument_naming_itself(
    db_url: URL, engine: Engine, clean: None, method: str, driver: str
) -> None:
    async def main() -> str:
        async_engine = create_async_engine(db_url.set(drivername=driver))
        try:
            async with AsyncSession(async_engine) as s:
                q = AsyncJobQueue(s, registry=reg)
                with pytest.raises(InvalidArgument) as refused:
                    await CALLS[method](q)
                assert (await s.execute(text("SELECT 1"))).scalar() == 1
                await q.enqueue(send, "ada", "yo")
                await s.commit()
                return str(refused.value)
        finally:
            await async_engine.dispose()

    message = asyncio.run(main())
    assert f"AsyncJobQueue.{method}" in message and "JobQueue." + method not in message.replace(
        "AsyncJobQueue." + method, "")
    assert "positional" in message and "'subject'" in message
    assert _jobs(engine) == 1


def test_a_misspelt_option_is_refused_the_same_way(session: Session) -> None:
    q: Any = JobQueue(session, registry=reg)
    with pytest.raises(InvalidArgument, match="'queues'.*options of enqueue are queue, parent_id"):
        q.enqueue(send, "ada", queues="mail")


def test_a_keyword_to_spawn_fails_the_parents_run_saying_why(session: Session) -> None:
    JobQueue(session, registry=reg).enqueue(parent)
    run_jobs(session, registry=reg)
    (job,) = enqueued(session, parent)
    assert job.status is Status.failed
    assert job.error == "postjob_sa.errors.InvalidArgument"
    assert "Workflow.spawn" in str(job.error_message) and "positional" in str(job.error_message)
    assert enqueued(session, send) == []
