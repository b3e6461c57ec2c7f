"""Scoped sessions (Flask-SQLAlchemy's ``db.session``, ``async_scoped_session``): the queue
joins the transaction of the *current* session of its scope, whichever that is when it is
called; and ``job_context``, entered around every run of a job by the queue's workers."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine, select, text
from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import postjob_sa
from postjob_sa import AsyncJobQueue, InvalidArgument, Job, JobQueue, Registry, Status

pytestmark = pytest.mark.both_drivers

reg = Registry()
#: what each run saw of the context it ran in
seen: list[tuple[str, str | None]] = []
CONTEXT_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("name", default=None)


@contextlib.contextmanager
def named_context(name: str) -> Iterator[None]:
    """Stands in for a Flask app's app_context(): a ContextVar set for the run, then reset."""
    token = CONTEXT_NAME.set(name)
    try:
        yield
    finally:
        CONTEXT_NAME.reset(token)


@postjob_sa.workflow(name="scoped.sync", registry=reg)
def sync_job(key: str) -> str:
    seen.append((key, CONTEXT_NAME.get()))
    return key


@postjob_sa.workflow(name="scoped.async", registry=reg)
async def async_job(key: str) -> str:
    await asyncio.sleep(0)
    seen.append((key, CONTEXT_NAME.get()))
    return key


@postjob_sa.workflow(name="scoped.tx", registry=reg, transactional=True)
def tx_job(session: Session, key: str) -> str:
    seen.append((key, CONTEXT_NAME.get()))
    return key


def _jobs(engine: Engine) -> list[Job]:
    with Session(engine) as s:
        return list(s.scalars(select(Job).order_by(Job.id)))


def test_a_scoped_session_is_joined_in_its_current_transaction(engine: Engine, clean: None) -> None:
    scope = {"id": "request 1"}
    db_session = scoped_session(sessionmaker(engine), scopefunc=lambda: scope["id"])
    queue = JobQueue(db_session, registry=reg)  # made once, at import time in an app
    job = queue.enqueue(sync_job, "kept")
    assert job in db_session()  # the current session of the scope holds it, uncommitted
    assert _jobs(engine) == []
    db_session.commit()
    assert [j.args for j in _jobs(engine)] == [["kept"]]

    scope["id"] = "request 2"  # another request: another session, another transaction
    queue.enqueue(sync_job, "rolled back")
    db_session.rollback()
    assert [j.args for j in _jobs(engine)] == [["kept"]]
    db_session.remove()


def test_a_scoped_session_is_not_resolved_until_a_call(engine: Engine) -> None:
    def no_session_here() -> Session:
        raise RuntimeError("Working outside of application context.")

    queue = JobQueue(scoped_session(no_session_here))  # at import time: no app context yet
    with pytest.raises(RuntimeError, match="outside of application context"):
        queue.enqueue("anything")


def test_anything_else_is_refused_in_one_line() -> None:
    with pytest.raises(InvalidArgument, match="needs a SQLAlchemy Session or scoped_session"):
        JobQueue(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="job_context must be a callable"):
        JobQueue(Session(), job_context=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="needs a SQLAlchemy AsyncSession or async_scoped"):
        AsyncJobQueue(Session())  # type: ignore[arg-type]


def test_an_async_scoped_session_is_joined_in_the_current_tasks_transaction(
    db_url: URL, engine: Engine, clean: None
) -> None:
    async def main() -> None:
        async_engine = create_async_engine(db_url.set(drivername="postgresql+psycopg"))
        sessions = async_scoped_session(async_sessionmaker(async_engine),
                                        scopefunc=asyncio.current_task)
        queue = AsyncJobQueue(sessions, registry=reg)

        async def request(key: str, commit: bool) -> None:
            await queue.enqueue(async_job, key)
            await (sessions.commit() if commit else sessions.rollback())
            await sessions.remove()

        try:
            await asyncio.gather(request("kept", True), request("rolled back", False))
        finally:
            await async_engine.dispose()

    asyncio.run(main())
    assert [j.args for j in _jobs(engine)] == [["kept"]]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_job_context_is_entered_around_every_run(
    engine: Engine, clean: None, concurrency: int
) -> None:
    seen.clear()
    with Session(engine) as s:
        queue = JobQueue(s, fast_mode=True, registry=reg, concurrency=concurrency,
                         job_context=lambda: named_context("the app"))
        for key in ("a", "b", "c"):
            queue.enqueue(sync_job, key)
            queue.enqueue(async_job, key + "!")
        queue.enqueue(tx_job, "tx")
        s.commit()
        assert queue.drain() == 7
    assert sorted(seen) == sorted((k, "the app") for k in ("a", "b", "c", "a!", "b!", "c!", "tx"))
    assert {j.status for j in _jobs(engine)} == {Status.ok}
    assert CONTEXT_NAME.get() is None  # left again after each run


def test_without_job_context_a_run_is_outside_any(engine: Engine, clean: None) -> None:
    seen.clear()
    with Session(engine) as s:
        queue = JobQueue(s, fast_mode=True, registry=reg)
        queue.enqueue(sync_job, "bare")
        s.commit()
        worker = threading.Thread(target=queue.drain)
        worker.start()
        worker.join(timeout=60)
    assert seen == [("bare", None)]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT status::text FROM postjob.jobs")).scalar() == "ok"
