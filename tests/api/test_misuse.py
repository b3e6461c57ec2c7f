"""Mistakes a newcomer makes with the API get an error that says what to do, never a raw
driver error or an internal exception, and the caller's transaction stays usable."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import (
    ChildHandle,
    InvalidArgument,
    InvalidJobState,
    JobQueue,
    NotInJob,
    Registry,
    SchemaError,
)
from tests.conftest import _admin

reg = Registry()
handles: list[ChildHandle] = []


@postjob_sa.workflow(name="misuse.echo", registry=reg)
def echo(value: Any = None) -> Any:
    return value


@postjob_sa.workflow(name="misuse.keeper", registry=reg)
def keeper() -> str:
    handles.append(echo.spawn("kept"))  # a handle kept beyond its run
    return "done"


@postjob_sa.workflow(name="misuse.broken", registry=reg, max_attempts=1)
def broken() -> None:
    raise ValueError("boom")


def not_a_workflow(x: int) -> int:
    return x


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.jobs")).scalar_one())


# -- issue 11, item 12 ---------------------------------------------------------------------


def test_enqueuing_the_same_child_twice_returns_the_child_it_has(engine: Engine, session: Session) -> None:
    q = JobQueue(session, registry=reg)
    parent = q.enqueue(echo, "parent")
    first = q.enqueue(echo, {"a": 1, "b": 2}, parent_id=parent.id)
    again = q.enqueue(echo, {"b": 2, "a": 1}, parent_id=parent.id)  # the same args as JSON
    assert again.id == first.id
    other = q.enqueue(echo, {"a": 1}, parent_id=parent.id)
    assert other.id != first.id
    session.commit()  # the transaction is usable: nothing failed in it
    assert _count(engine) == 3


def test_enqueue_of_the_manual_workflow_is_refused(engine: Engine, session: Session) -> None:
    q = JobQueue(session, registry=reg)
    q.enqueue(echo, "mine")
    message = ("__manual__ is reserved for manual steps, which no worker runs: create one with "
               "postjob_sa.manual(...) inside a workflow")
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue("__manual__", "approve")
    assert str(caught.value) == message
    with pytest.raises(InvalidArgument, match="reserved for manual steps"):
        q.enqueue_many("__manual__", [["approve"]])
    session.commit()
    assert _count(engine) == 1


def test_reset_of_a_running_job_is_refused_and_the_session_stays_usable(
    engine: Engine, session: Session
) -> None:
    with Session(engine) as worker:
        q = JobQueue(worker, registry=reg)
        job_id = q.enqueue(echo, 1).id
        worker.commit()
        assert [j.id for j in q.checkout()] == [job_id]
        worker.commit()  # the job is processing now, as under a worker
    q = JobQueue(session, registry=reg)
    q.enqueue(echo, "mine")
    with pytest.raises(InvalidJobState) as caught:
        q.reset(job_id)
    assert str(caught.value) == (
        f"job {job_id} is running: reset it once it has finished (or once its worker is gone "
        "and `postjob reap` has rescued it)"
    )
    session.commit()
    with engine.connect() as conn:
        statuses = conn.execute(text("SELECT status::text FROM postjob.jobs ORDER BY id")).scalars().all()
    assert statuses == ["processing", "ready"]


# -- issue 12, section 4: misleading or raw errors ------------------------------------------


def test_an_undecorated_function_is_named_with_the_decorator_to_use(session: Session) -> None:
    with pytest.raises(InvalidArgument) as caught:
        JobQueue(session).enqueue(not_a_workflow, 1)  # type: ignore[arg-type]
    assert str(caught.value) == ("'not_a_workflow' is not a workflow: decorate it with "
                                 "@postjob_sa.workflow (or pass the workflow's name)")


def test_a_queue_on_an_engine_asks_for_a_session(engine: Engine) -> None:
    with pytest.raises(InvalidArgument) as caught:
        JobQueue(engine)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "JobQueue needs a SQLAlchemy Session or scoped_session (Flask-SQLAlchemy's db.session), "
        f"e.g. JobQueue(Session(engine)), not {engine!r}"
    )


def test_a_transactional_workflow_without_a_session_parameter_is_refused_at_decoration() -> None:
    def no_session() -> None:
        pass

    with pytest.raises(InvalidArgument) as caught:
        postjob_sa.workflow(name="misuse.tx", transactional=True, registry=Registry())(no_session)
    assert str(caught.value) == (
        "workflow 'misuse.tx' is transactional: the worker passes its Session as the first "
        f"argument, but {__name__}.test_a_transactional_workflow_without_a_session_parameter_is_"
        "refused_at_decoration.<locals>.no_session takes no positional parameter "
        "(e.g. def send(session: Session, ...))"
    )
    # a session parameter, or *args, is what it needs
    postjob_sa.workflow(name="misuse.tx1", transactional=True, registry=Registry())(lambda s: None)
    postjob_sa.workflow(name="misuse.tx2", transactional=True, registry=Registry())(lambda *a: None)


def test_a_child_handle_used_after_its_run_says_so(engine: Engine, session: Session) -> None:
    handles.clear()
    q = JobQueue(session, registry=reg, fast_mode=True)
    parent = q.enqueue(keeper).id
    session.commit()
    assert q.drain() == 2
    [handle] = handles
    message = (f"this handle of a child of job {parent} is used outside the run that spawned it: "
               "use it inside that workflow, while it runs")
    with pytest.raises(NotInJob) as caught:
        handle.result()
    assert str(caught.value) == message


def test_the_result_of_a_job_that_has_not_run_says_how_to_get_it(engine: Engine, session: Session) -> None:
    q = JobQueue(session, registry=reg, fast_mode=True)
    job = q.enqueue(echo, "value")
    failing = q.enqueue(broken)
    with pytest.raises(InvalidJobState) as caught:
        job.result()  # a Celery habit: the job has not run
    assert str(caught.value) == (
        f"job {job.id} is ready: it has no result yet. A worker runs it once the transaction "
        "that enqueued it has committed (in tests: JobQueue(session).drain()); then read it "
        "again (session.refresh(job)) and call job.result()"
    )
    session.commit()
    assert q.drain() == 2
    session.refresh(job)
    assert job.result() == "value"
    session.refresh(failing)
    with pytest.raises(InvalidJobState) as caught:
        failing.result()
    assert str(caught.value) == f"job {failing.id} ended failed, without a result: ValueError: boom"
    with pytest.raises(InvalidJobState, match="^this job has not been written yet: it has no result$"):
        postjob_sa.Job(workflow="misuse.echo").result()


@pytest.fixture
def bare_db(server_url: URL) -> Iterator[Engine]:
    """A database without the postjob schema."""
    name = f"pjt_{os.getpid()}_misuse_bare"
    admin = _admin(server_url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng = create_engine(server_url.set(database=name))
    try:
        yield eng
    finally:
        eng.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


HINT = ("run `postjob db migrate`, or in an app whose Alembic migrations install it, "
        "`alembic upgrade head` (after `postjob db revision` when postjob_sa was upgraded)")


def test_enqueue_before_migrating_says_which_command_to_run(bare_db: Engine) -> None:
    with Session(bare_db) as s:
        with pytest.raises(SchemaError) as caught:
            JobQueue(s).enqueue("misuse.echo", 1)
        assert str(caught.value) == f"the postjob schema is missing from this database: {HINT}"
    with Session(bare_db) as s:
        with pytest.raises(SchemaError, match="missing from this database"):
            JobQueue(s).drain()
    postjob_sa.migrate(bare_db, "pj0001")  # a schema older than the code
    with Session(bare_db) as s:
        with pytest.raises(SchemaError) as caught:
            JobQueue(s, registry=reg).checkout()
        assert str(caught.value) == f"the postjob schema in this database is older than this code: {HINT}"
