"""Events: ``wait_for_event(key, timeout)`` in a workflow, ``JobQueue.emit_event(key, payload)``
anywhere. A wait gets the first event under its key (one emitted before the wait counts);
while there is none the job waits without a worker, woken by the emit's commit (NOTIFY) or at
its deadline. The n-th wait of a run is stored with what it got (the payload, or the
timeout), so re-runs get the same."""

from __future__ import annotations

from typing import Any

from postjob_sa import _sql, _validate
from postjob_sa._pending import Pending
from postjob_sa.context import _RunContext
from postjob_sa.durable import memo as _memo
from postjob_sa.durable.memo import EVENT, Memo, Stored, log
from postjob_sa.errors import EventTimeout, InvalidArgument

#: The longest key (an index entry must stay well under a page).
MAX_KEY_LENGTH = 500


def wait_for_event(key: str, timeout: float | None = None) -> Any:
    """The payload of the first event emitted under ``key`` (``JobQueue.emit_event``), one
    emitted before this call included. While there is none the job's run ends here: it waits
    without a worker until an emit under the key commits, then re-runs and this call returns
    the payload. Past ``timeout`` seconds (counted from the first time the job came here) it
    raises :class:`~postjob_sa.EventTimeout`, which the workflow may catch; re-runs get the
    same payload, or the same timeout."""
    key, timeout = _checked(key, timeout)
    ctx, memo = _memo.running()
    name = memo.next_ordinal(EVENT)
    stored = _memo.load(ctx, memo).get(EVENT, name)
    if stored is None:
        rows = ctx.query(_sql.EVENT_WAIT, _params(ctx, name, key, timeout))
        stored = _outcome(memo, name, key, timeout, rows[0])
    return _delivered(ctx, key, timeout, stored)


async def wait_for_event_async(key: str, timeout: float | None = None) -> Any:
    """:func:`wait_for_event` in an ``async def`` workflow."""
    key, timeout = _checked(key, timeout)
    ctx, memo = _memo.running()
    name = memo.next_ordinal(EVENT)
    stored = (await _memo.load_async(ctx, memo)).get(EVENT, name)
    if stored is None:
        rows = await ctx.query_async(_sql.EVENT_WAIT, _params(ctx, name, key, timeout))
        stored = _outcome(memo, name, key, timeout, rows[0])
    return _delivered(ctx, key, timeout, stored)


def key_checked(key: object) -> str:
    """An event key as the API takes it: a non-empty string PostgreSQL stores."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"an event key must be a non-empty string, not {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidArgument(f"an event key is at most {MAX_KEY_LENGTH} characters")
    return _validate.text(key, "an event key")


def _checked(key: object, timeout: object) -> tuple[str, float | None]:
    return key_checked(key), _validate.seconds(timeout, "the timeout")


def _params(ctx: _RunContext, name: str, key: str, timeout: float | None) -> dict[str, Any]:
    return {"job_id": ctx.job.id, "lease_token": ctx.job.lease_token, "seq": int(name),
            "key": key, "timeout": timeout}


def _outcome(memo: Memo, name: str, key: str, timeout: float | None,
             row: dict[str, Any]) -> Stored:
    """What the database said of the wait: stored (an event, a timeout), or still waiting."""
    if row["state"] == "wait":
        raise Pending(None, wake_in=row["wake_in"])
    stored = (Stored(result=[row["payload"]], digest=key) if row["state"] == "event"
              else Stored(error="EventTimeout", digest=key))
    assert memo.stored is not None
    memo.stored[(EVENT, name)] = stored
    return stored


def _delivered(ctx: _RunContext, key: str, timeout: float | None, stored: Stored) -> Any:
    if stored.digest is not None and stored.digest != key:
        log.warning("job %s: a wait for an event under %r finds a stored wait under %r in its "
                    "place (was the code changed under the job?): what that wait got is used",
                    ctx.job.id, key, stored.digest)
    if stored.error is not None:
        raise EventTimeout(stored.digest or key, timeout)
    result = stored.result
    return result[0] if isinstance(result, list) and result else None

