"""Helpers for testing an application that uses postjob_sa.

``run_jobs(session)`` runs everything that is runnable now (fast back-off, in this process);
``enqueued(session, workflow)`` lists the jobs of a workflow that the session can see, e.g.
to assert that a request handler enqueued what it should. ``run_jobs_async`` and
``enqueued_async`` are their twins for an ``AsyncSession``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, Text, bindparam, cast, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from postjob_sa import _validate
from postjob_sa.models import Job, Status
from postjob_sa.queue import JobQueue
from postjob_sa.registry import Registry, Workflow

if TYPE_CHECKING:  # the asyncio extension loads with the async helpers only
    from sqlalchemy.ext.asyncio import AsyncSession

#: How long to wait for a retry that fast mode (0.01 s·1.5^n) has made due soon.
RETRY_WAIT = 0.02


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
    pending = session.scalar(_RETRYING)
    session.rollback()
    if pending is not None:
        time.sleep(RETRY_WAIT)
        return True
    return False


_RETRYING = select(Job.id).where(Job.status == Status.err).limit(1)


def enqueued(
    session: Session, workflow: Workflow[Any, Any] | str, *args: Any, status: Status | None = None
) -> list[Job]:
    """The jobs of this workflow (and these args, if given) visible to the session."""
    stmt = _jobs_of(workflow, args, status)
    session.flush()
    return list(session.scalars(stmt))


def _jobs_of(workflow: Workflow[Any, Any] | str, args: tuple[Any, ...],
             status: Status | None) -> Select[Job]:
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    stmt = select(Job).where(Job.workflow == name).order_by(Job.id)
    if args:
        # the args as text, cast in SQL: no jsonb codec of the app's sees them (see _session_sql)
        encoded = bindparam("args", _validate.args_json(args), type_=Text)
        stmt = stmt.where(Job.args == cast(encoded, JSONB))
    if status is not None:
        stmt = stmt.where(Job.status == status)
    return stmt


async def run_jobs_async(
    session: AsyncSession, *, registry: Registry | None = None, rounds: int = 100
) -> int:
    """:func:`run_jobs` for an ``AsyncSession``: commit it, then run jobs until none is
    runnable (the worker runs in a thread, with psycopg 3, as ``AsyncJobQueue.drain`` does).
    Returns how many runs happened."""
    from postjob_sa.async_queue import AsyncJobQueue

    await session.commit()
    q = AsyncJobQueue(session, fast_mode=True, registry=registry)
    q.worker_engine, ours = q._engine()  # one engine for every round
    total = 0
    try:
        for _ in range(rounds):
            ran = await q.drain()
            total += ran
            if ran == 0 and not await _retry_due_soon_async(session):
                break
    finally:
        if ours:
            q.worker_engine.dispose()
    session.expire_all()
    return total


async def _retry_due_soon_async(session: AsyncSession) -> bool:
    pending = await session.scalar(_RETRYING)
    await session.rollback()
    if pending is not None:
        await asyncio.sleep(RETRY_WAIT)
        return True
    return False


async def enqueued_async(
    session: AsyncSession, workflow: Workflow[Any, Any] | str, *args: Any,
    status: Status | None = None,
) -> list[Job]:
    """:func:`enqueued` for an ``AsyncSession``: the jobs of this workflow (and these args,
    if given) visible to the session, its own uncommitted ones included."""
    stmt = _jobs_of(workflow, args, status)
    await session.flush()
    return list((await session.scalars(stmt)).all())
