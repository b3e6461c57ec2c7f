"""Runs one job and turns what its workflow did into an outcome for ``finish_jobs``."""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from postjob_sa.context import Pending, _RunContext, enter, leave
from postjob_sa.errors import NonRecoverable, ResultNotJSON
from postjob_sa.registry import Workflow

log = logging.getLogger("postjob_sa.worker")

MAX_MESSAGE_CHARS = 10_000
MAX_FRAMES = 100


class Abort(BaseException):
    """Stops the running job at once (a second SIGINT/SIGTERM); the job is released."""


@dataclass
class Outcome:
    """How one run ended: the arguments of one row of ``postjob.finish_jobs``."""

    job_id: int
    lease_token: int | None
    kind: str  # ok | err | failed | sleep | release
    result: str | None = None  # JSON of [value]
    error: str | None = None
    message: str | None = None
    backtrace: str | None = None  # JSON array of frames
    version: str | None = None
    awaiting: int | None = None


def _error_outcome(ctx: _RunContext, wf: Workflow[Any, Any], kind: str, exc: BaseException) -> Outcome:
    frames = traceback.extract_tb(exc.__traceback__)[-MAX_FRAMES:]
    backtrace = [f"{f.filename}:{f.lineno}:in {f.name}" for f in frames]
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return Outcome(
        job_id=ctx.job.id,
        lease_token=ctx.job.lease_token,
        kind=kind,
        error=name,
        message=str(exc)[:MAX_MESSAGE_CHARS].replace("\x00", "\\0"),
        backtrace=json.dumps(backtrace),
        version=wf.version,
    )


_RESULT_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def run_job(ctx: _RunContext, wf: Workflow[Any, Any]) -> Outcome:
    """Call the workflow with the job's args inside the job context; never raises (but Abort)."""
    token = enter(ctx)
    try:
        return _run(ctx, wf)
    finally:
        leave(token)


def _run(ctx: _RunContext, wf: Workflow[Any, Any]) -> Outcome:
    job = ctx.job
    try:
        if wf.transactional:
            value = wf.fn(ctx.session, *job.args)
        else:
            value = wf.fn(*job.args)
    except Pending as pending:
        try:
            ctx.flush_children()
        except Exception as exc:  # the children could not be written: retry the run
            return _error_outcome(ctx, wf, "err", exc)
        return Outcome(job.id, job.lease_token, "sleep", version=wf.version,
                       awaiting=pending.child_id)
    except NonRecoverable as exc:
        return _error_outcome(ctx, wf, "failed", exc)
    except Exception as exc:
        try:
            ctx.flush_children()
        except Exception:
            log.exception("job %s: could not create its spawned children", job.id)
        return _error_outcome(ctx, wf, "err", exc)
    if ctx.pending:
        try:
            ctx.flush_children()
        except Exception as exc:
            return _error_outcome(ctx, wf, "err", exc)
    if value is None:
        return Outcome(job.id, job.lease_token, "ok", result="[null]", version=wf.version)
    try:
        result = _RESULT_ENCODER.encode([value])
    except (TypeError, ValueError) as exc:
        err = ResultNotJSON(f"the workflow returned a value that is not JSON: {exc}")
        return _error_outcome(ctx, wf, "failed", err)
    if "\\u0000" in result:
        err = ResultNotJSON("the workflow returned a string with a NUL character")
        return _error_outcome(ctx, wf, "failed", err)
    return Outcome(job.id, job.lease_token, "ok", result=result, version=wf.version)


def finish_params(outcomes: list[Outcome], fast: bool) -> dict[str, Any]:
    """The parameters of ``finish_jobs`` for a batch of outcomes."""
    return {
        "ids": [o.job_id for o in outcomes],
        "leases": [o.lease_token for o in outcomes],
        "outcomes": [o.kind for o in outcomes],
        "results": [o.result for o in outcomes],
        "errors": [o.error for o in outcomes],
        "messages": [o.message for o in outcomes],
        "backtraces": [o.backtrace for o in outcomes],
        "versions": [o.version for o in outcomes],
        "awaiting": [o.awaiting for o in outcomes],
        "fast": fast,
    }
