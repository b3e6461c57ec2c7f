"""Durable sleep: the job gives up its worker and lease until a time, then re-runs, and the
sleep call returns at once. The n-th sleep of a run is stored with its wake time (the
database's clock), so a re-run before that time sleeps on for what is left, and one after it
goes past the call."""

from __future__ import annotations

import math
from datetime import datetime

from postjob_sa import _validate
from postjob_sa._pending import Pending
from postjob_sa.durable import memo as _memo
from postjob_sa.durable.memo import SLEEP, Stored
from postjob_sa.errors import InvalidArgument

#: The longest sleep (a year and a day, as the longest timeout).
MAX_SLEEP = _validate.MAX_TIMEOUT_SECONDS


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` without holding a worker: the job's run ends here (no process busy,
    no lease held), the job runs again when the time has come, and then this call returns.
    Code before it runs again; use :func:`step` for what must not."""
    _sleep(wake_in=_seconds(seconds))


def sleep_until(when: datetime) -> None:
    """:func:`sleep` until ``when`` (a timezone-aware datetime)."""
    _sleep(wake_at=_when(when))


async def sleep_async(seconds: float) -> None:
    """:func:`sleep` in an ``async def`` workflow."""
    await _sleep_async(wake_in=_seconds(seconds))


async def sleep_until_async(when: datetime) -> None:
    """:func:`sleep_until` in an ``async def`` workflow."""
    await _sleep_async(wake_at=_when(when))


def _sleep(*, wake_in: float | None = None, wake_at: datetime | None = None) -> None:
    """The run's next sleep: stored once (with ``wake_in`` or ``wake_at``), then waited."""
    ctx, memo = _memo.running()
    name = memo.next_ordinal(SLEEP)
    stored = _memo.load(ctx, memo).get(SLEEP, name)
    if stored is None:
        stored = _memo.record(ctx, memo, SLEEP, name, wake_in=wake_in, wake_at=wake_at)
    _wait(stored)


async def _sleep_async(*, wake_in: float | None = None,
                       wake_at: datetime | None = None) -> None:
    ctx, memo = _memo.running()
    name = memo.next_ordinal(SLEEP)
    stored = (await _memo.load_async(ctx, memo)).get(SLEEP, name)
    if stored is None:
        stored = await _memo.record_async(ctx, memo, SLEEP, name, wake_in=wake_in, wake_at=wake_at)
    _wait(stored)


def _wait(stored: Stored) -> None:
    """Return once the wake time has passed; until then end the run (the job sleeps)."""
    left = stored.seconds_left()
    if left is not None and left > 0:
        raise Pending(None, wake_in=left)


def _seconds(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds) or seconds < 0 or seconds > MAX_SLEEP:
        raise InvalidArgument(f"sleep takes from 0 to {MAX_SLEEP:g} seconds, not {seconds!r}")
    return float(seconds)


def _when(when: object) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise InvalidArgument(f"sleep_until takes a timezone-aware datetime, not {when!r}")
    return when
