"""The job context: what a running workflow can ask of postjob_sa.

A ``ContextVar`` holds the running job while its workflow executes. ``spawn`` finds or
creates children (one query fetches all children of the job on first use, so a re-run of a
fan-out parent finds all finished children at once); ``ChildHandle.result()`` returns a
child's result, raises :class:`ChildFailed`, or suspends the parent until the child ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from postjob_sa import _sql, _validate
from postjob_sa._db import sqlstate
from postjob_sa.children import ChildHandle, _ChildKey, _ChildSpec
from postjob_sa.errors import LEASE_LOST_STATE, JobCancelled, LeaseLost, NotInJob
from postjob_sa.models import MANUAL_WORKFLOW, Status


class RunningJob(NamedTuple):
    """The job whose workflow is running (see :func:`current_job`); fields in the order of the
    worker's checkout columns. ``attempt`` is which attempt this run is (1 for the first)."""

    id: int
    lease_token: int | None
    workflow: str
    workflow_version: str
    args: list[Any]
    queue: str
    root_id: int
    full_id: str
    parent_id: int | None
    attempt: int = 1
    max_attempts: int = 5

class _Db(Protocol):
    """What the job context needs of a connection (see postjob_sa._db.Conn)."""

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any: ...


class _AsyncDb(Protocol):
    """The same over an async connection (a transactional ``async def`` job's)."""

    async def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...


@dataclass
class _RunContext:
    """One run of one job: its connection, its session (transactional mode) and its children.

    Spawning writes nothing: children are inserted (with a load of all children, one round
    trip) when the run needs a child's row, waits, or ends.
    """

    job: RunningJob
    db: _Db | None = None
    session: Any = None
    adb: _AsyncDb | None = None
    #: whether the worker's heartbeat found the job no longer this run's (by job id)
    lost: Callable[[int], bool] | None = None
    #: the worker's fast mode (tests): the default back-off waits 0.01 s, not 10 s
    fast_mode: bool = False
    _children: dict[_ChildKey, dict[str, Any]] | None = None
    pending: dict[_ChildKey, _ChildSpec] = field(default_factory=dict)
    #: the run's memo of its job's steps (postjob_sa.durable), made by the first step
    memo: Any = None
    #: the trace context to store on the job before the run's first spawn (JSON; see
    #: postjob_sa._tracing), so that its children inherit this run's span
    trace_for_children: str | None = None

    def is_current(self) -> bool:
        """Whether this run is the one the running code is in (its handles work only there)."""
        return _current.get() is self

    # -- whether the run still holds its job ---------------------------------------------------

    def check_held(self) -> None:
        """Raise as a refused write would once the heartbeat found the job taken from us."""
        if self.lost is not None and self.lost(self.job.id):
            raise self.lease_gone()

    async def check_held_async(self) -> None:
        if self.lost is not None and self.lost(self.job.id):
            raise await self.lease_gone_async()

    def lease_gone(self) -> BaseException:
        """Why this run no longer holds its job: JobCancelled, or else LeaseLost. (On a
        connection whose transaction a refused write aborted the status cannot be read: then
        LeaseLost, which ends the run the same way.)"""
        try:
            assert self.db is not None
            rows = self.db.rows(_sql.JOB_STATUS, {"job_id": self.job.id})
        except Exception:
            rows = []
        return self._gone(rows)

    async def lease_gone_async(self) -> BaseException:
        if self.adb is None:
            return await asyncio.to_thread(self.lease_gone)
        try:
            rows = await self.adb.rows(_sql.JOB_STATUS, {"job_id": self.job.id})
        except Exception:
            rows = []
        return self._gone(rows)

    def _gone(self, rows: list[dict[str, Any]]) -> BaseException:
        if rows and rows[0]["status"] == Status.cancelled.value:
            return JobCancelled(self.job.id)
        return LeaseLost(self.job.id)

    # -- one sync and one async path to the database -------------------------------------------

    def query(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        assert self.db is not None
        try:
            return self.db.rows(sql, params)
        except Exception as exc:
            if sqlstate(exc) == LEASE_LOST_STATE:
                raise self.lease_gone() from None
            raise

    async def query_async(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """On the job's async connection, else on its connection in a thread of its own."""
        if self.adb is None:
            return await asyncio.to_thread(self.query, sql, params)
        try:
            return await self.adb.rows(sql, params)
        except Exception as exc:
            if sqlstate(exc) == LEASE_LOST_STATE:
                raise await self.lease_gone_async() from None
            raise

    # -- children ------------------------------------------------------------------------------

    def _spawn_params(self) -> dict[str, Any]:
        specs = list(self.pending.values())
        self.pending.clear()
        return {
            "parent_id": self.job.id,
            "lease_token": self.job.lease_token,
            "queues": [s.queue for s in specs],
            "workflows": [s.workflow for s in specs],
            "args": [s.args_json for s in specs],
            "max_attempts": [s.max_attempts for s in specs],
            "timeouts": [s.timeout for s in specs],
        }

    def _loaded(self, rows: list[dict[str, Any]]) -> None:
        self._children = {(r["workflow"], _canonical(r["args"])): r for r in rows}

    def flush_children(self, *, load: bool = False) -> None:
        """Insert the children spawned in this run (those that exist are kept) and load every
        child of the job, in one round trip; LeaseLost when the run no longer holds the job.
        Without pending children nothing is done, unless ``load`` asks for the children."""
        if self.pending or (load and self._children is None):
            if self.pending and self.trace_for_children is not None:
                self.query(_sql.JOB_TRACE_CONTEXT_SET, self._trace_params())
            self._loaded(self.query(_sql.CHILDREN_SPAWN, self._spawn_params()))

    async def flush_children_async(self, *, load: bool = False) -> None:
        if self.pending or (load and self._children is None):
            if self.pending and self.trace_for_children is not None:
                await self.query_async(_sql.JOB_TRACE_CONTEXT_SET, self._trace_params())
            self._loaded(await self.query_async(_sql.CHILDREN_SPAWN, self._spawn_params()))

    def _trace_params(self) -> dict[str, Any]:
        context, self.trace_for_children = self.trace_for_children, None
        return {"job_id": self.job.id, "trace_context": context}

    def child(self, key: _ChildKey) -> dict[str, Any]:
        self.flush_children(load=True)
        return self._found(key) or self._by_key(key, self.query(_sql.CHILD_BY_KEY, self._key_params(key)))

    async def child_async(self, key: _ChildKey) -> dict[str, Any]:
        await self.flush_children_async(load=True)
        found = self._found(key)
        if found is not None:
            return found
        return self._by_key(key, await self.query_async(_sql.CHILD_BY_KEY, self._key_params(key)))

    def _found(self, key: _ChildKey) -> dict[str, Any] | None:
        assert self._children is not None
        return self._children.get(key)

    def _key_params(self, key: _ChildKey) -> dict[str, Any]:
        return {"parent_id": self.job.id, "workflow": key[0], "args": key[1]}

    def _by_key(self, key: _ChildKey, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """A child found by its key in the database (the authority on JSON equality)."""
        if not rows:
            raise LookupError(f"child {key} of job {self.job.id} was not created")
        assert self._children is not None
        self._children[key] = rows[0]
        return rows[0]


_current: ContextVar[_RunContext | None] = ContextVar("postjob_sa_job", default=None)


def _context() -> _RunContext:
    ctx = _current.get()
    if ctx is None:
        raise NotInJob("no postjob job is running here: this works only inside a workflow")
    return ctx


def enter(ctx: _RunContext) -> Token[_RunContext | None]:
    """Make ctx the running job's context (undo with leave)."""
    return _current.set(ctx)


def leave(token: Token[_RunContext | None]) -> None:
    _current.reset(token)


def _canonical(args: Any) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def current_job() -> RunningJob:
    """The running job; raises NotInJob outside a workflow."""
    return _context().job


def current_session() -> Any:
    """The Session of a job run in transactional mode; raises NotInJob otherwise."""
    ctx = _context()
    if ctx.session is None:
        raise NotInJob("this job is not running in transactional mode: it has no session")
    return ctx.session


def spawn_child(
    workflow: str,
    args: list[Any],
    *,
    timeout: float | None = None,
    max_attempts: int | None = None,
    queue: str | None = None,
) -> ChildHandle:
    """Find or create the running job's child for (workflow, args)."""
    ctx = _context()
    ctx.check_held()
    args_json = _validate.args_json(args)
    spec = _ChildSpec(
        workflow=_validate.name(workflow, "workflow"),
        args_json=args_json,
        queue=ctx.job.queue if queue is None else _validate.name(queue, "queue"),
        max_attempts=_validate.max_attempts(max_attempts) or 5,
        timeout=_validate.seconds(timeout, "timeout"),
    )
    key = (spec.workflow, _canonical(json.loads(args_json)))
    row = ctx._children.get(key) if ctx._children is not None else None
    if row is None and key not in ctx.pending:
        ctx.pending[key] = spec  # written (or found) with the next round trip
    return ChildHandle(ctx, key, row)


def manual(label: str, *args: Any, timeout: float | None = None) -> ChildHandle:
    """A child that no worker runs; finish it with ``JobQueue.resolve(handle.token, result)``."""
    return spawn_child(
        MANUAL_WORKFLOW, [_validate.name(label, "label"), *args], timeout=timeout, max_attempts=1
    )


def set_workflow_status(status: str) -> None:
    """Record a progress note for the running job (shown by ``postjob ps``); raises
    JobCancelled once the job is cancelled (call it in long loops to stop early)."""
    ctx = _context()
    rows = ctx.query(_sql.WORKFLOW_STATUS_SET, _status_params(ctx, status))
    if not rows[0]["accepted"]:
        raise ctx.lease_gone()


async def set_workflow_status_async(status: str) -> None:
    """:func:`set_workflow_status` for an ``async def`` workflow."""
    ctx = _context()
    rows = await ctx.query_async(_sql.WORKFLOW_STATUS_SET, _status_params(ctx, status))
    if not rows[0]["accepted"]:
        raise await ctx.lease_gone_async()


def _status_params(ctx: _RunContext, status: str) -> dict[str, Any]:
    if not isinstance(status, str):
        raise TypeError("the workflow status must be a string")
    note = _validate.text(status, "the workflow status")
    return {"job_id": ctx.job.id, "lease_token": ctx.job.lease_token, "status": note}
