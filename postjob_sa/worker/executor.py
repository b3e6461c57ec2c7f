"""Runs one job and turns what its workflow did into an outcome for ``postjob.finish_v4``.

Whatever the workflow does, the outcome can be stored: a result PostgreSQL would refuse fails the
job with ``ResultNotJSON``, and error text is escaped (NUL, lone surrogates) and cut to size. A
failed attempt carries the delay before the next one, from the workflow's back-off (policy is
the code's, not the database's).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from postjob_sa import _backoff, _json, _sql, _tracing
from postjob_sa._pending import Pending
from postjob_sa.context import _RunContext, enter, leave
from postjob_sa.errors import (
    ArgumentMismatch,
    JobCancelled,
    LeaseLost,
    NonRecoverable,
    ResultNotJSON,
)
from postjob_sa.registry import Workflow
from postjob_sa.worker.signals import Abort

log = logging.getLogger("postjob_sa.worker")

MAX_MESSAGE_CHARS = 10_000
MAX_FRAMES = 100


@dataclass(slots=True)
class Outcome:
    """How one run ended: one element of the outcomes ``postjob.finish_v4`` records."""

    job_id: int
    lease_token: int | None
    kind: str  # ok | err | failed | sleep | release | lost (not recorded: the lease is gone)
    result: str | None = None  # JSON of [value]
    error: str | None = None
    message: str | None = None
    backtrace: str | None = None  # JSON array of frames
    version: str | None = None
    awaiting: int | None = None
    #: SystemExit, KeyboardInterrupt or CancelledError raised by the job: recorded, then re-raised
    interrupt: BaseException | None = None
    workflow: str = ""
    duration: float = 0.0  # seconds the run took
    #: seconds before the next attempt (err: the workflow's back-off)
    retry_in: float | None = None
    #: the attempt this run was, and how many the job has
    attempt: int | None = None
    max_attempts: int | None = None
    #: seconds until a sleeping job runs again whatever wakes it before (a durable sleep, an
    #: event's timeout); None: until it is woken
    wake_in: float | None = None
    #: an err's SQLSTATE when the run failed on a conflict with another transaction (see
    #: :func:`conflict_of`): a transactional job's is run again at once, no attempt counted
    conflict: str | None = None

    def describe(self) -> str:
        """'job 12 (app.send)', for log lines."""
        return f"job {self.job_id} ({self.workflow})" if self.workflow else f"job {self.job_id}"

    @property
    def final_failure(self) -> bool:
        """Whether this failed run fails the job (no retry: non-recoverable, or no attempt left)."""
        return self.kind == "failed" or (
            self.kind == "err" and self.attempt is not None and self.max_attempts is not None
            and self.attempt >= self.max_attempts)

    @property
    def delay(self) -> float | None:
        """finish_v4's delay: an err's seconds before the next attempt, a sleep's until it runs
        again (None: until it is woken)."""
        return self.retry_in if self.kind == "err" else self.wake_in if self.kind == "sleep" else None

    def rejected(self, reason: str) -> Outcome:
        """This run failed instead, because the database refused its outcome."""
        return Outcome(
            self.job_id, self.lease_token, "failed", error="OutcomeRefused",
            message=_json.storable(f"the database refused the outcome of this run: {reason}",
                                   MAX_MESSAGE_CHARS),
            version=self.version, workflow=self.workflow, duration=self.duration,
            attempt=self.attempt, max_attempts=self.max_attempts,
        )


def outcome_params(outcomes: list[Outcome], stopped: list[tuple[int, int]] | None = None, *,
                   literals: bool = True) -> dict[str, Any]:
    """finish_v4's arguments (postjob_sa/sql/outcomes.sql) for a batch of outcomes and the runs
    that stopped without one (id, lease token): array literals (built as text, which costs
    the worker less than its psycopg driver adapting lists element by element), or lists
    (``literals=False``: for a caller's session, whose driver may type its parameters, as
    asyncpg does)."""
    ok = [o for o in outcomes if o.kind == "ok"]
    others = [o for o in outcomes if o.kind != "ok"] if len(ok) < len(outcomes) else []
    stopped = stopped or []
    columns: dict[str, tuple[str, list[Any]]] = {
        "ok_ids": ("n", [o.job_id for o in ok]),
        "ok_tokens": ("n", [o.lease_token for o in ok]),
        "ok_results": ("t", [o.result or _NULL for o in ok]),
        "ok_versions": ("t", [o.version for o in ok]),
        "ids": ("n", [o.job_id for o in others]),
        "tokens": ("n", [o.lease_token for o in others]),
        "kinds": ("t", [o.kind for o in others]),
        "errors": ("t", [o.error for o in others]),
        "messages": ("t", [o.message for o in others]),
        "backtraces": ("t", [o.backtrace for o in others]),
        "versions": ("t", [o.version for o in others]),
        "awaiting": ("n", [o.awaiting for o in others]),
        "delays": ("n", [o.delay for o in others]),
        "stopped": ("n", [job_id for job_id, _ in stopped]),
        "stopped_tokens": ("n", [token for _, token in stopped]),
    }
    if not literals:
        return {name: values for name, (_, values) in columns.items()}
    return {name: _numbers(values) if kind == "n" else _texts(values)
            for name, (kind, values) in columns.items()}


_NULL = "[null]"
#: The quoted array elements of the texts most outcomes carry (versions, kinds, a None result).
_QUOTED: dict[str | None, str] = {None: "NULL"}


def _numbers(values: list[Any]) -> str:
    """A PostgreSQL array literal of numbers (None: NULL)."""
    if not values:
        return "{}"
    return "{" + ",".join(["NULL" if v is None else repr(v) if isinstance(v, float) else str(int(v))
                           for v in values]) + "}"


def _texts(values: list[str | None]) -> str:
    """A PostgreSQL array literal of texts (None: NULL)."""
    if not values:
        return "{}"
    return "{" + ",".join([_array_text(v) for v in values]) + "}"


def _array_text(value: str | None) -> str:
    """One element of a PostgreSQL array literal, quoted (or NULL)."""
    quoted = _QUOTED.get(value)
    if quoted is None:
        assert value is not None
        quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if len(value) <= 32 and len(_QUOTED) < 1000:  # versions and small results recur
            _QUOTED[value] = quoted
    return quoted


#: The SQLSTATEs of a transaction's conflict with another, which running it again may get past.
CONFLICTS = {"40001": "serialization failure", "40P01": "deadlock"}


def conflict_of(exc: BaseException) -> str | None:
    """The SQLSTATE (40001, 40P01) of the serialization failure or deadlock ``exc`` is, wraps
    (SQLAlchemy's ``orig``) or was raised from or while handling; psycopg's errors carry it as
    ``sqlstate``, psycopg2's as ``pgcode``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if state in CONFLICTS:
            return str(state)
        orig = getattr(e, "orig", None)
        todo += [orig if isinstance(orig, BaseException) else None, e.__cause__, e.__context__]
    return None


def error_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _error_outcome(ctx: _RunContext, wf: Workflow[Any, Any], kind: str, exc: BaseException) -> Outcome:
    frames = traceback.extract_tb(exc.__traceback__)[-MAX_FRAMES:]
    backtrace = [_json.storable(f"{f.filename}:{f.lineno}:in {f.name}") for f in frames]
    attempt = ctx.job.attempt
    return Outcome(
        job_id=ctx.job.id,
        lease_token=ctx.job.lease_token,
        kind=kind,
        error=_json.storable(error_name(exc)),
        message=_json.storable(str(exc), MAX_MESSAGE_CHARS),
        backtrace=_json.encode(backtrace),
        version=wf.version,
        retry_in=_backoff.delay(wf.backoff, attempt, fast=ctx.fast_mode, workflow=wf.name)
        if kind == "err" else None,
        conflict=conflict_of(exc) if kind == "err" and isinstance(exc, Exception) else None,
    )


def run_job(ctx: _RunContext, wf: Workflow[Any, Any]) -> Outcome:
    """Call a (sync) workflow with the job's args inside the job context. Never raises but
    :class:`Abort`: an interruption comes back as an outcome that carries it."""
    span = _traced(ctx) if _tracing.enabled() else None
    token = enter(ctx)
    started = time.monotonic()
    try:
        try:
            with wf.job_context() if wf.job_context else nullcontext():  # e.g. a Flask app's
                value = wf.fn(ctx.session, *ctx.job.args) if wf.transactional else wf.fn(*ctx.job.args)
        except (Abort, LeaseLost, JobCancelled):
            raise
        except BaseException as exc:
            outcome = _from_error(ctx, wf, exc, _flush(ctx))
        else:
            outcome = _from_value(ctx, wf, value, _flush(ctx) if ctx.pending else None)
    except (LeaseLost, JobCancelled) as gone:
        outcome = _lost(ctx, wf, gone)
    finally:
        leave(token)
        if span is not None:
            span.leave()
    return _ended(span, _stamped(outcome, ctx, started))


async def run_job_async(ctx: _RunContext, wf: Workflow[Any, Any]) -> Outcome:
    """Await an ``async def`` workflow inside the job context (a task of its own, so the
    context is the task's); the same outcomes as :func:`run_job`. A cancelled task hands its
    job back (an outcome of kind ``release`` that carries the CancelledError)."""
    span = await _traced_async(ctx) if _tracing.enabled() else None
    token = enter(ctx)
    started = time.monotonic()
    try:
        try:
            args = ctx.job.args
            with wf.job_context() if wf.job_context else nullcontext():
                value = await (wf.fn(ctx.session, *args) if wf.transactional else wf.fn(*args))
        except (Abort, LeaseLost, JobCancelled):
            raise
        except BaseException as exc:
            outcome = _from_error(ctx, wf, exc, await _flush_async(ctx))
        else:
            flush_error = await _flush_async(ctx) if ctx.pending else None
            outcome = _from_value(ctx, wf, value, flush_error)
    except (LeaseLost, JobCancelled) as gone:
        outcome = _lost(ctx, wf, gone)
    finally:
        leave(token)
        if span is not None:
            span.leave()
    return _ended(span, _stamped(outcome, ctx, started))


# -- tracing (only with a tracer provider set: see postjob_sa._tracing) -----------------------

def _traced(ctx: _RunContext) -> _tracing.RunSpan:
    """The run's span, in the trace its job's stored context names (a trace of its own when
    it has none yet: then stored, for its re-runs and children to join)."""
    try:
        rows: list[dict[str, Any]] | None = ctx.query(_sql.JOB_TRACE_CONTEXT, {"job_id": ctx.job.id})
    except Exception as exc:  # the run goes on in a trace of its own
        log.debug("job %s: its trace context could not be read: %s", ctx.job.id, exc)
        rows = None
    span = _span(ctx, rows)
    if span.store is not None:
        try:
            ctx.query(_sql.JOB_TRACE_CONTEXT_SET, _stored(ctx, span.store))
        except Exception as exc:  # its later runs begin traces of their own
            log.debug("job %s: its trace context could not be stored: %s", ctx.job.id, exc)
    return span.__enter__()


async def _traced_async(ctx: _RunContext) -> _tracing.RunSpan:
    try:
        rows: list[dict[str, Any]] | None = await ctx.query_async(
            _sql.JOB_TRACE_CONTEXT, {"job_id": ctx.job.id})
    except Exception as exc:
        log.debug("job %s: its trace context could not be read: %s", ctx.job.id, exc)
        rows = None
    span = _span(ctx, rows)
    if span.store is not None:
        try:
            await ctx.query_async(_sql.JOB_TRACE_CONTEXT_SET, _stored(ctx, span.store))
        except Exception as exc:
            log.debug("job %s: its trace context could not be stored: %s", ctx.job.id, exc)
    return span.__enter__()


def _span(ctx: _RunContext, rows: list[dict[str, Any]] | None) -> _tracing.RunSpan:
    """The run's span from the rows of JOB_TRACE_CONTEXT (None: they could not be read, so
    nothing is stored either)."""
    job = ctx.job
    span = _tracing.RunSpan(rows[0]["trace_context"] if rows else None, workflow=job.workflow,
                            job_id=job.id, attempt=job.attempt, queue=job.queue,
                            root_id=job.root_id)
    if not rows:
        span.store = span.for_children = None
    ctx.trace_for_children = span.for_children  # stored before the run's first spawn
    return span


def _stored(ctx: _RunContext, context: str) -> dict[str, Any]:
    return {"job_id": ctx.job.id, "trace_context": context}


def _ended(span: _tracing.RunSpan | None, outcome: Outcome) -> Outcome:
    if span is not None:
        span.end(outcome.kind, outcome.error, outcome.message)
    return outcome


def _lost(ctx: _RunContext, wf: Workflow[Any, Any], gone: BaseException) -> Outcome:
    """A run that found its job no longer its own: nothing of it is recorded."""
    return Outcome(ctx.job.id, ctx.job.lease_token, "lost", version=wf.version,
                   error="cancelled" if isinstance(gone, JobCancelled) else None)


def _stamped(outcome: Outcome, ctx: _RunContext, started: float) -> Outcome:
    outcome.workflow = ctx.job.workflow
    outcome.duration = time.monotonic() - started
    outcome.attempt = ctx.job.attempt
    outcome.max_attempts = ctx.job.max_attempts
    return outcome


def _flush(ctx: _RunContext) -> Exception | None:
    """Create the children the run spawned; the error if that failed (LeaseLost and
    JobCancelled propagate)."""
    try:
        ctx.flush_children()
    except (LeaseLost, JobCancelled):
        raise
    except Exception as exc:
        log.warning("job %s: could not create the children it spawned: %s", ctx.job.id, exc)
        return exc
    return None


async def _flush_async(ctx: _RunContext) -> Exception | None:
    try:
        await ctx.flush_children_async()
    except (LeaseLost, JobCancelled):
        raise
    except Exception as exc:
        log.warning("job %s: could not create the children it spawned: %s", ctx.job.id, exc)
        return exc
    return None


def _from_error(ctx: _RunContext, wf: Workflow[Any, Any], exc: BaseException,
                flush_error: Exception | None) -> Outcome:
    """The outcome of a run that raised ``exc`` (its spawned children already flushed)."""
    job = ctx.job
    if isinstance(exc, Pending):
        if flush_error is not None:  # the children could not be written: retry the run
            return _error_outcome(ctx, wf, "err", flush_error)
        return Outcome(job.id, job.lease_token, "sleep", version=wf.version, awaiting=exc.child_id,
                       wake_in=exc.wake_in)
    if isinstance(exc, TypeError):
        problem = wf.args_problem(job.args)
        if problem is not None:  # the call itself failed: no retry can make the args fit
            mismatch = ArgumentMismatch(wf.mismatch(job.args, problem))
            return _error_outcome(ctx, wf, "failed", mismatch.with_traceback(exc.__traceback__))
    if isinstance(exc, NonRecoverable):
        return _error_outcome(ctx, wf, "failed", exc)
    if isinstance(exc, Exception):
        return _error_outcome(ctx, wf, "err", exc)
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        # interrupted from outside: back to ready, no attempt counted
        return Outcome(job.id, job.lease_token, "release", version=wf.version, interrupt=exc)
    outcome = _error_outcome(ctx, wf, "err", exc)  # SystemExit and the like: an attempt
    outcome.interrupt = exc
    return outcome


def _from_value(ctx: _RunContext, wf: Workflow[Any, Any], value: Any,
                flush_error: Exception | None) -> Outcome:
    job = ctx.job
    if flush_error is not None:
        return _error_outcome(ctx, wf, "err", flush_error)
    if value is None:
        return Outcome(job.id, job.lease_token, "ok", result="[null]", version=wf.version)
    try:
        result = _json.encode([value])
    except _json.NotStorable as exc:
        err = ResultNotJSON(f"the workflow returned a value that cannot be stored as JSON: {exc}")
        return _error_outcome(ctx, wf, "failed", err)
    return Outcome(job.id, job.lease_token, "ok", result=result, version=wf.version)
