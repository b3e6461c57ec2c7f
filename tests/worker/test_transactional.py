"""Transactional mode at its edges: a workflow that commits or rolls back its own session, a run
that undoes the worker's transaction, and worker loops that leave the caller's session alone."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry

pytestmark = pytest.mark.both_drivers

treg = Registry()


@postjob_sa.workflow(name="txe.rollback", transactional=True, registry=treg)
def rolls_back(session: Session, value: int) -> int:
    session.execute(text("INSERT INTO txe_side (value) VALUES (:v)"), {"v": value})
    session.rollback()  # the workflow undoes its own first write ...
    session.execute(text("INSERT INTO txe_side (value) VALUES (:v)"), {"v": value + 100})
    return value  # ... and keeps the second, which commits with the job


@postjob_sa.workflow(name="txe.commit_then_fail", transactional=True, registry=treg)
def commits_then_fails(session: Session, value: int) -> int:
    session.execute(text("INSERT INTO txe_side (value) VALUES (:v)"), {"v": value})
    session.commit()  # a savepoint of the job's: still undone when the job fails
    raise RuntimeError("after my commit")


@postjob_sa.workflow(name="txe.undo_worker", transactional=True, registry=treg)
def undoes_the_worker(session: Session, value: int) -> int:
    dbapi = session.connection().connection.dbapi_connection
    assert dbapi is not None
    dbapi.rollback()  # a raw ROLLBACK: the worker's checkout is gone too
    session.execute(text("INSERT INTO txe_side (value) VALUES (:v)"), {"v": value})
    return value


@postjob_sa.workflow(name="txe.plain", registry=treg)
def plain(value: int) -> int:
    return value


@pytest.fixture
def side(engine: Engine, clean: None) -> Engine:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS txe_side (value int)"))
        conn.execute(text("TRUNCATE txe_side"))
    return engine


def _values(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(r[0] for r in conn.execute(text("SELECT value FROM txe_side")))


def _job(engine: Engine, job_id: int) -> tuple[str, int]:
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT status::text, failed_attempts FROM postjob.jobs WHERE id = :i"
        ), {"i": job_id}).one()
        return str(row[0]), int(row[1])


def test_a_workflow_that_rolls_back_its_session_runs_once(side: Engine) -> None:
    with Session(side) as s:
        q = JobQueue(s, fast_mode=True, registry=treg)
        job = q.enqueue(rolls_back, 1)
        s.commit()
        assert q.step() == job.id
        assert q.step() is None  # not back in the queue: nothing left to run
    assert _job(side, job.id) == ("ok", 0)
    assert _values(side) == [101]


def test_a_failing_workflow_loses_even_what_it_committed_itself(side: Engine) -> None:
    with Session(side) as s:
        q = JobQueue(s, fast_mode=True, registry=treg)
        job = q.enqueue(commits_then_fails, 7, max_attempts=1)
        s.commit()
        assert q.step() == job.id
    assert _job(side, job.id) == ("failed", 1)
    assert _values(side) == []


def test_a_run_that_undoes_the_workers_transaction_commits_nothing_and_says_so(side: Engine) -> None:
    with Session(side) as s:
        q = JobQueue(s, fast_mode=True, registry=treg)
        job_id = q.enqueue(undoes_the_worker, 3).id
        s.commit()
        with pytest.raises(postjob_sa.InvalidJobState, match="undid the worker's transaction"):
            q.step()
    assert _job(side, job_id) == ("ready", 0)  # not reported as processed
    assert _values(side) == []  # and its writes were not committed


def test_drain_leaves_what_the_caller_has_pending_alone(side: Engine) -> None:
    with Session(side) as s:
        q = JobQueue(s, fast_mode=True, registry=treg)  # transactional workflows registered
        job_id = q.enqueue(plain, 5).id  # pending in the caller's transaction
        s.execute(text("INSERT INTO txe_side (value) VALUES (42)"))
        assert q.drain() == 0  # the worker cannot see uncommitted work ...
        assert q.step() is None
        s.commit()  # ... and did not roll it back
    assert _values(side) == [42]
    assert _job(side, job_id) == ("ready", 0)
    with Session(side) as s:
        assert JobQueue(s, registry=treg).drain() == 1
    assert _job(side, job_id) == ("ok", 0)


def test_a_transactional_job_gets_a_session_of_the_workers_not_the_callers(side: Engine) -> None:
    seen: list[Session] = []
    r = Registry()

    @postjob_sa.workflow(name="txe.which", transactional=True, registry=r)
    def which(session: Session) -> None:
        seen.append(session)

    with Session(side) as s:
        q = JobQueue(s, registry=r)
        q.enqueue(which)
        s.commit()
        assert q.drain() == 1
        assert seen and seen[0] is not s
