"""postjob_sa.testing: what a host application's tests use."""

from __future__ import annotations

from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry, Status
from postjob_sa.testing import enqueued, run_jobs

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
