"""A run's memo of its job's steps: loaded by the run's first durable call (one query for all
of them, so a re-run's stored steps cost no round trip each), then read in memory; a new one
is recorded by one fenced call (on the job's own transaction in transactional mode, so it
commits or rolls back with the job's writes)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from postjob_sa import _sql
from postjob_sa.context import _context, _RunContext

log = logging.getLogger("postjob_sa.durable")

#: The kinds of step (postjob.steps.kind).
STEP, SLEEP, EVENT = "step", "sleep", "event"


@dataclass(slots=True)
class Stored:
    """One recorded step as the run read it."""

    result: Any = None  # the stored JSON: [value] of a step, [payload] of an event
    error: str | None = None
    message: str | None = None
    digest: str | None = None
    #: seconds from ``read_at`` until a sleep's wake time (or an event wait's, unused)
    wake_in: float | None = None
    read_at: float = field(default_factory=time.monotonic)

    def seconds_left(self) -> float | None:
        """Seconds until the wake time now (negative once it has passed)."""
        if self.wake_in is None:
            return None
        return self.wake_in - (time.monotonic() - self.read_at)


@dataclass
class Memo:
    """The steps of one run's job (None until loaded), the step names this run used, and how
    many sleeps and event waits it has come to (their ordinals name them)."""

    stored: dict[tuple[str, str], Stored] | None = None
    used: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)

    def next_ordinal(self, kind: str) -> str:
        """The name of this run's next sleep or event wait: '1', '2', ..."""
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        return str(n)

    def get(self, kind: str, name: str) -> Stored | None:
        assert self.stored is not None
        return self.stored.get((kind, name))

    def loaded(self, rows: list[dict[str, Any]]) -> Memo:
        if self.stored is None:  # a concurrent first call (asyncio.gather) may have loaded
            self.stored = {(r["kind"], r["name"]): _stored(r) for r in rows}
        return self


def _stored(row: dict[str, Any]) -> Stored:
    return Stored(result=row["result"], error=row["error"], message=row["error_message"],
                  digest=row.get("digest"), wake_in=row["wake_in"])


def running() -> tuple[_RunContext, Memo]:
    """The running job's context and its memo (NotInJob outside a workflow)."""
    ctx = _context()
    if ctx.memo is None:
        ctx.memo = Memo()
    memo: Memo = ctx.memo
    return ctx, memo


def load(ctx: _RunContext, memo: Memo) -> Memo:
    """The memo, loaded with the job's steps on first use (one round trip per run)."""
    ctx.check_held()
    if memo.stored is None:
        memo.loaded(ctx.query(_sql.STEPS_LOAD, {"job_id": ctx.job.id}))
    return memo


async def load_async(ctx: _RunContext, memo: Memo) -> Memo:
    await ctx.check_held_async()
    if memo.stored is None:
        memo.loaded(await ctx.query_async(_sql.STEPS_LOAD, {"job_id": ctx.job.id}))
    return memo


def _params(ctx: _RunContext, kind: str, name: str, digest: str | None, result: str | None,
            error: str | None, message: str | None, wake_in: float | None,
            wake_at: datetime | None) -> dict[str, Any]:
    return {"job_id": ctx.job.id, "lease_token": ctx.job.lease_token, "kind": kind,
            "name": name, "digest": digest, "result": result, "error": error,
            "message": message, "wake_in": wake_in, "wake_at": wake_at}


def _remember(memo: Memo, kind: str, name: str, digest: str | None,
              rows: list[dict[str, Any]]) -> Stored:
    stored = Stored(result=rows[0]["result"], error=rows[0]["error"],
                    message=rows[0]["error_message"], digest=digest, wake_in=rows[0]["wake_in"])
    assert memo.stored is not None
    memo.stored[(kind, name)] = stored
    return stored


def record(ctx: _RunContext, memo: Memo, kind: str, name: str, *, digest: str | None = None,
           result: str | None = None, error: str | None = None, message: str | None = None,
           wake_in: float | None = None, wake_at: datetime | None = None) -> Stored:
    """Record a step (``result``: its JSON text) and return it as stored (the first record
    of a name wins); LeaseLost or JobCancelled when the run no longer holds its job."""
    rows = ctx.query(_sql.STEP_RECORD, _params(ctx, kind, name, digest, result, error, message,
                                               wake_in, wake_at))
    return _remember(memo, kind, name, digest, rows)


async def record_async(ctx: _RunContext, memo: Memo, kind: str, name: str, *,
                       digest: str | None = None, result: str | None = None,
                       error: str | None = None, message: str | None = None,
                       wake_in: float | None = None, wake_at: datetime | None = None) -> Stored:
    rows = await ctx.query_async(_sql.STEP_RECORD, _params(ctx, kind, name, digest, result,
                                                           error, message, wake_in, wake_at))
    return _remember(memo, kind, name, digest, rows)
