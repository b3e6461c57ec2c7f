"""Helpers for testing an application that uses postjob_sa.

``run_jobs(session)`` runs everything that is runnable now (fast back-off, in this process);
``enqueued(session, workflow)`` lists the jobs of a workflow that the session can see, e.g.
to assert that a request handler enqueued what it should.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from postjob_sa.models import Job, Status
from postjob_sa.queue import JobQueue
from postjob_sa.registry import Registry, Workflow


def run_jobs(session: Session, *, registry: Registry | None = None, rounds: int = 100) -> int:
    """Commit the session, then run jobs until none is runnable (retries back off 0.01 s·1.5^n,
    so a few rounds also run retried jobs). Returns how many runs happened."""
    session.commit()
    q = JobQueue(session, fast_mode=True, registry=registry)
    total = 0
    for _ in range(rounds):
        ran = q.drain()
        total += ran
        if ran == 0 and not _retry_due_soon(session):
            break
    session.expire_all()
    return total


def _retry_due_soon(session: Session) -> bool:
    pending = session.scalar(
        select(Job.id).where(Job.status == Status.err).limit(1)
    )
    session.rollback()
    if pending is not None:
        import time

        time.sleep(0.02)
        return True
    return False


def enqueued(
    session: Session, workflow: Workflow[Any, Any] | str, *args: Any, status: Status | None = None
) -> list[Job]:
    """The jobs of this workflow (and these args, if given) visible to the session."""
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    stmt = select(Job).where(Job.workflow == name).order_by(Job.id)
    if args:
        stmt = stmt.where(Job.args == list(args))
    if status is not None:
        stmt = stmt.where(Job.status == status)
    session.flush()
    return list(session.scalars(stmt))
