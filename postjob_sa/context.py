"""The job context: what a running workflow can ask of postjob_sa.

A ``ContextVar`` holds the running job while its workflow executes. ``spawn`` finds or
creates children (one query fetches all children of the job on first use, so a re-run of a
fan-out parent finds all finished children at once); ``ChildHandle.result()`` returns a
child's result, raises :class:`ChildFailed`, or suspends the parent until the child ends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from postjob_sa import _sql, _validate
from postjob_sa._db import sqlstate
from postjob_sa.errors import LEASE_LOST_STATE, ChildFailed, LeaseLost, NotInJob
from postjob_sa.models import FINAL_STATUSES, MANUAL_WORKFLOW, Status

_ChildKey = tuple[str, str]  # (workflow, canonical JSON of args)


class Pending(BaseException):
    """Unwinds a workflow that waits for an unfinished child (not an error: the job sleeps).

    A BaseException, so ``except Exception`` in workflow code does not swallow it.
    """

    def __init__(self, child_id: int):
        super().__init__(child_id)
        self.child_id = child_id


class RunningJob(NamedTuple):
    """The job whose workflow is running (see :func:`current_job`); fields in the order of the
    worker's checkout columns."""

    id: int
    lease_token: int | None
    workflow: str
    workflow_version: str
    args: list[Any]
    queue: str
    root_id: int
    full_id: str
    parent_id: int | None


@dataclass
class _ChildSpec:
    workflow: str
    args_json: str
    queue: str
    max_attempts: int
    timeout: float | None


@dataclass
class ChildHandle:
    """A child job as the running parent sees it in this run."""

    _ctx: _RunContext
    _key: _ChildKey
    _row: dict[str, Any] | None = None

    def _in_run(self) -> None:
        """Refuse use outside the run that made this handle (NotInJob, not the internal
        Pending a wait would raise there)."""
        if _current.get() is not self._ctx:
            raise NotInJob(
                f"this handle of a child of job {self._ctx.job.id} is used outside the run that "
                "spawned it: use it inside that workflow, while it runs"
            )

    def _loaded(self) -> dict[str, Any]:
        if self._row is None:
            self._in_run()
            self._ctx.flush_children()
            self._row = self._ctx.children.get(self._key) or self._ctx.find_child(self._key)
        return self._row

    @property
    def id(self) -> int:
        return int(self._loaded()["id"])

    @property
    def status(self) -> Status:
        """The child's status as read in this run."""
        return Status(self._loaded()["status"])

    @property
    def token(self) -> str:
        """The token that finishes this manual job (``JobQueue.resolve``)."""
        row = self._loaded()
        if row["workflow"] != MANUAL_WORKFLOW:
            raise NotInJob(f"job {row['id']} is not a manual job and has no token")
        if "token" not in row:  # created on first use, then remembered for this run
            self._in_run()
            row["token"] = str(self._ctx.db.scalar(_sql.MANUAL_TOKEN, {"job_id": row["id"]}))
        return str(row["token"])

    def result(self) -> Any:
        """The child's result; raises ChildFailed if it failed or timed out; otherwise the
        parent sleeps until the child ends and then re-runs from the top. Outside the run
        that spawned the child it raises NotInJob."""
        self._in_run()
        row = self._loaded()
        status = Status(row["status"])
        if status is Status.ok:
            results = row["results"]
            return results[0] if isinstance(results, list) and results else None
        if status in FINAL_STATUSES:
            raise ChildFailed(row["id"], status.value, row["error"], row["error_message"])
        raise Pending(int(row["id"]))


class _Db(Protocol):
    """What the job context needs of a connection (see postjob_sa._db.Conn)."""

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any: ...


@dataclass
class _RunContext:
    job: RunningJob
    db: _Db
    session: Any = None
    _children: dict[_ChildKey, dict[str, Any]] | None = None
    pending: dict[_ChildKey, _ChildSpec] = field(default_factory=dict)

    @property
    def children(self) -> dict[_ChildKey, dict[str, Any]]:
        if self._children is None:
            self._spawn([])
        assert self._children is not None
        return self._children

    def _spawn(self, specs: list[_ChildSpec]) -> None:
        """Insert these children (those that exist are kept) and load every child of the job,
        in one round trip; LeaseLost when this run no longer holds the job."""
        try:
            rows = self.db.rows(
                _sql.CHILDREN_SPAWN,
                {
                    "parent_id": self.job.id,
                    "lease_token": self.job.lease_token,
                    "queues": [s.queue for s in specs],
                    "workflows": [s.workflow for s in specs],
                    "args": [s.args_json for s in specs],
                    "max_attempts": [s.max_attempts for s in specs],
                    "timeouts": [s.timeout for s in specs],
                },
            )
        except Exception as exc:
            if sqlstate(exc) == LEASE_LOST_STATE:
                raise LeaseLost(self.job.id) from None
            raise
        self._children = {(r["workflow"], _canonical(r["args"])): r for r in rows}

    def find_child(self, key: _ChildKey) -> dict[str, Any]:
        """Look a child up by its key in the database (the authority on JSON equality)."""
        rows = self.db.rows(
            _sql.CHILD_BY_KEY, {"parent_id": self.job.id, "workflow": key[0], "args": key[1]}
        )
        if not rows:
            raise LookupError(f"child {key} of job {self.job.id} was not created")
        self.children[key] = rows[0]
        return rows[0]

    def flush_children(self) -> None:
        """Insert the children spawned in this run that do not exist yet (one statement)."""
        if not self.pending:
            return
        specs = list(self.pending.values())
        self.pending.clear()
        self._spawn(specs)


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
    args_json = _validate.args_json(args)
    spec = _ChildSpec(
        workflow=_validate.name(workflow, "workflow"),
        args_json=args_json,
        queue=ctx.job.queue if queue is None else _validate.name(queue, "queue"),
        max_attempts=_validate.max_attempts(max_attempts) or 5,
        timeout=_validate.seconds(timeout, "timeout"),
    )
    key = (spec.workflow, _canonical(json.loads(args_json)))
    row = ctx.children.get(key)
    if row is None and key not in ctx.pending:
        ctx.pending[key] = spec
    return ChildHandle(ctx, key, row)


def manual(label: str, *args: Any, timeout: float | None = None) -> ChildHandle:
    """A child that no worker runs; finish it with ``JobQueue.resolve(handle.token, result)``."""
    return spawn_child(
        MANUAL_WORKFLOW, [_validate.name(label, "label"), *args], timeout=timeout, max_attempts=1
    )


def set_workflow_status(status: str) -> None:
    """Record a progress note for the running job (shown by ``postjob ps``)."""
    ctx = _context()
    if not isinstance(status, str):
        raise TypeError("the workflow status must be a string")
    note = _validate.text(status, "the workflow status")
    params = {"job_id": ctx.job.id, "lease_token": ctx.job.lease_token, "status": note}
    if not ctx.db.scalar(_sql.WORKFLOW_STATUS_SET, params):
        raise LeaseLost(ctx.job.id)
