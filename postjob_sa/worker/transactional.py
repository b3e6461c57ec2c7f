"""Transactional mode: one job, one transaction. Its checkout, its own writes and its outcome
commit together, on a connection the worker takes from the engine (never the caller's session).

The workflow gets a Session joined to that transaction: its ``commit()`` and ``rollback()`` act
on a savepoint, so a workflow that rolls back its own work does not undo its checkout. All the
job's writes sit inside one more savepoint of the runner's, which an error rolls back whole
before the error is recorded. The outcome must be accepted (the job still held by this
checkout) or nothing of the run commits. A serialization failure or a deadlock met on the way
rolls back the whole transaction, checkout included, and the job runs again at once in a new
one, with no attempt counted (postjob_sa.worker.conflicts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from postjob_sa import _backoff, _metrics, _session_sql, _sql
from postjob_sa._db import Conn, check_driver, no_prepared_statements
from postjob_sa.context import RunningJob, _RunContext
from postjob_sa.errors import InvalidJobState
from postjob_sa.registry import Registry, Workflow
from postjob_sa.worker.conflicts import Conflict, Conflicts
from postjob_sa.worker.executor import (
    Outcome,
    conflict_of,
    error_name,
    outcome_params,
    run_job,
    run_job_async,
)
from postjob_sa.worker.recorder import log_outcome, recorded_status

log = logging.getLogger("postjob_sa.worker")
#: How often a transactional worker makes due its jobs whose time has come (its idle waits do
#: too).
PROMOTE_INTERVAL = 0.05
_UNDONE = ("the run undid the worker's transaction (did the workflow run ROLLBACK or COMMIT "
           "on the connection itself?)")


class TransactionalRunner:
    """Runs transactional jobs one at a time (see the module docstring)."""

    def __init__(self, engine: Engine, registry: Registry, *, lease: float, fast_mode: bool,
                 pooled: bool = False):
        self.engine = engine
        self.pooled = pooled
        self.driver = check_driver(engine)
        self.registry = registry
        self.lease = lease
        self.fast_mode = fast_mode
        self._async: AsyncEngine | None = None
        self._promoted_at = float("-inf")
        self.conflicts = Conflicts()

    def promote_if_due(self, conn: Conn, pairs: tuple[list[str], list[str]]) -> None:
        """Make due the jobs of ``pairs`` whose time has come, now and then, on the worker
        loop's own connection ``conn``: inside a job's transaction the rows it makes due would
        stay locked for as long as the job runs."""
        now = time.monotonic()
        if now - self._promoted_at < PROMOTE_INTERVAL:
            return
        conn.scalar(_sql.WORKER_PROMOTE, {"workflows": pairs[0], "versions": pairs[1]})
        self._promoted_at = now

    def step(self, checkout: dict[str, Any]) -> int | None:
        """Run one job; its id once its outcome is committed, None if none was due. A conflict
        of its transaction runs it again at once (see postjob_sa.worker.conflicts)."""
        while True:
            try:
                return self._step(checkout)
            except Conflict as conflict:
                self.conflicts.met(conflict)

    def _step(self, checkout: dict[str, Any]) -> int | None:
        with self.engine.connect() as conn:
            if self.pooled:
                no_prepared_statements(conn.connection.dbapi_connection, self.driver)
            trans = conn.begin()
            try:
                row = conn.execute(_session_sql.JOB_CHECKOUT, checkout).mappings().first()
                if row is None:
                    trans.rollback()
                    return None
                job = RunningJob(**row)
                _metrics.started_many({(job.workflow, job.queue): 1})
                outcome = self._failed(job) or _unless_conflict(job, self._run(conn, job))
                try:
                    rows = conn.execute(_session_sql.JOB_FINISH, _finish(outcome)).all()
                    _check_accepted(job, outcome, rows, trans.rollback)
                    trans.commit()
                except DBAPIError as exc:
                    if conflict_of(exc) is None:
                        raise
                    raise _not_recorded(job, outcome, exc) from exc
            except BaseException:
                if trans.is_active:
                    trans.rollback()
                raise
        return self._ended(job, outcome, rows)

    def _failed(self, job: RunningJob) -> Outcome | None:
        """The failed attempt of a job whose transaction met conflict after conflict."""
        return self.conflicts.failed(job, self.registry.workflows[job.workflow], self.fast_mode)

    def _ended(self, job: RunningJob, outcome: Outcome, rows: Sequence[Any]) -> int:
        self.conflicts.ended(job.id)
        return _ended(job, outcome, rows)

    def _run(self, conn: Connection, job: RunningJob) -> Outcome:
        wf = self.registry.workflows[job.workflow]
        writes = conn.begin_nested()  # every write of the job, whatever it commits itself
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        dbapi = conn.connection.dbapi_connection
        ctx = _RunContext(job, db=Conn.borrow(dbapi, self.driver), session=session,
                          fast_mode=self.fast_mode)
        try:
            outcome = run_job(ctx, wf)
            if outcome.kind in _KEPT:
                session.commit()  # what the workflow left pending belongs to its result
        except Exception as exc:  # the session could not commit: the job's writes are broken
            outcome = _not_committed(job, wf, exc, self.fast_mode)
        finally:
            session.close()
        if outcome.kind in _KEPT and writes.is_active:
            try:
                writes.commit()
                return outcome
            except Exception as exc:
                outcome = _not_committed(job, wf, exc, self.fast_mode)
        try:
            if writes.is_active:
                writes.rollback()
        except Exception as exc:
            raise InvalidJobState(f"{outcome.describe()}: {_UNDONE}; nothing of it was committed") from exc
        return _no_lost(outcome)

    # -- async def workflows: the same, on an async connection on the event loop of jobs -------

    async def step_async(self, checkout: dict[str, Any]) -> int | None:
        """:meth:`step` for ``async def`` workflows (runs on the worker's event loop)."""
        while True:
            try:
                return await self._step_async(checkout)
            except Conflict as conflict:
                self.conflicts.met(conflict)

    async def _step_async(self, checkout: dict[str, Any]) -> int | None:
        async with self._async_engine().connect() as conn:
            trans = await conn.begin()
            try:
                row = (await conn.execute(_session_sql.JOB_CHECKOUT, checkout)).mappings().first()
                if row is None:
                    await trans.rollback()
                    return None
                job = RunningJob(**row)
                _metrics.started_many({(job.workflow, job.queue): 1})
                outcome = self._failed(job) or _unless_conflict(
                    job, await self._run_async(conn, job))
                try:
                    rows = (await conn.execute(_session_sql.JOB_FINISH, _finish(outcome))).all()
                    if _lost(job, rows):
                        await trans.rollback()
                    _check_accepted(job, outcome, rows, lambda: None)
                    await trans.commit()
                except DBAPIError as exc:
                    if conflict_of(exc) is None:
                        raise
                    raise _not_recorded(job, outcome, exc) from exc
            except BaseException:
                if trans.is_active:
                    await trans.rollback()
                raise
        return self._ended(job, outcome, rows)

    async def _run_async(self, conn: AsyncConnection, job: RunningJob) -> Outcome:
        wf = self.registry.workflows[job.workflow]
        writes = await conn.begin_nested()
        session = AsyncSession(bind=conn, join_transaction_mode="create_savepoint")
        ctx = _RunContext(job, adb=_AsyncConnDb(conn), session=session, fast_mode=self.fast_mode)
        try:
            outcome = await run_job_async(ctx, wf)
            if outcome.kind in _KEPT:
                await session.commit()
        except Exception as exc:
            outcome = _not_committed(job, wf, exc, self.fast_mode)
        finally:
            await session.close()
        if outcome.kind in _KEPT and writes.is_active:
            try:
                await writes.commit()
                return outcome
            except Exception as exc:
                outcome = _not_committed(job, wf, exc, self.fast_mode)
        try:
            if writes.is_active:
                await writes.rollback()
        except Exception as exc:
            raise InvalidJobState(f"{outcome.describe()}: {_UNDONE}; nothing of it was committed") from exc
        return _no_lost(outcome)

    def _async_engine(self) -> AsyncEngine:
        """Async connections to the worker's database (psycopg 3), made once."""
        if self._async is None:
            self._async = create_async_engine(
                self.engine.url.set(drivername="postgresql+psycopg"),
                connect_args={"prepare_threshold": None} if self.pooled else {})
        return self._async

    async def close_async(self) -> None:
        if self._async is not None:
            await self._async.dispose()
            self._async = None


_KEPT = ("ok", "sleep")  # outcomes whose writes commit with them


class _AsyncConnDb:
    """The job context's statements on the async connection of its transaction."""

    def __init__(self, conn: AsyncConnection):
        self.conn = conn

    async def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        result = await self.conn.exec_driver_sql(sql, dict(params or {}))
        return [dict(r) for r in result.mappings()] if result.returns_rows else []


def _not_committed(job: RunningJob, wf: Workflow[Any, Any], exc: Exception,
                   fast_mode: bool) -> Outcome:
    return Outcome(job.id, job.lease_token, "err", error=error_name(exc),
                   message=f"the job's writes could not be committed: {exc}",
                   version=wf.version, workflow=job.workflow, attempt=job.attempt,
                   max_attempts=job.max_attempts,
                   retry_in=_backoff.delay(wf.backoff, job.attempt, fast=fast_mode,
                                           workflow=wf.name),
                   conflict=conflict_of(exc))


def _unless_conflict(job: RunningJob, outcome: Outcome) -> Outcome:
    """The run's outcome, to be recorded; a run that failed on a conflict raises
    :class:`Conflict` instead (its transaction is rolled back, and the job run again)."""
    if outcome.conflict is not None and outcome.kind == "err" and outcome.interrupt is None:
        raise Conflict(job, outcome)
    return outcome


def _not_recorded(job: RunningJob, outcome: Outcome, exc: DBAPIError) -> Conflict:
    """The conflict ``exc`` met in recording the run's outcome or committing it."""
    return Conflict(job, Outcome(
        job.id, job.lease_token, "err", error=error_name(exc),
        message=f"its outcome ({outcome.kind}) could not be recorded: {exc}",
        backtrace=outcome.backtrace, version=outcome.version, workflow=job.workflow,
        attempt=job.attempt, max_attempts=job.max_attempts, conflict=conflict_of(exc)))


def _no_lost(outcome: Outcome) -> Outcome:
    if outcome.kind == "lost":  # cannot happen while we hold the row; be safe
        return Outcome(outcome.job_id, outcome.lease_token, "release", workflow=outcome.workflow)
    return outcome


def _finish(outcome: Outcome) -> dict[str, Any]:
    """finish_v4's parameters for one outcome (its lease ends with it)."""
    return outcome_params([outcome])


def _lost(job: RunningJob, rows: Sequence[Any]) -> bool:
    return any(r[0] == "lost" and r[1] == job.id for r in rows)


def _check_accepted(job: RunningJob, outcome: Outcome, rows: Sequence[Any],
                    rollback: Callable[[], None]) -> None:
    if _lost(job, rows):
        # the run undid the checkout (a raw ROLLBACK on the connection): commit nothing of
        # it, and stop rather than run the job again and again
        rollback()
        raise InvalidJobState(f"{outcome.describe()}: {_UNDONE}; nothing of it was committed")


def _ended(job: RunningJob, outcome: Outcome, rows: Sequence[Any]) -> int:
    woken = any(r[0] == "woken" and r[1] == job.id for r in rows)
    _metrics.finished(outcome.workflow or job.workflow, outcome.kind, outcome.duration)
    log_outcome(outcome, recorded_status(outcome, woken))
    if outcome.interrupt is not None:
        raise outcome.interrupt
    return job.id
