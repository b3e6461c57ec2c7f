"""Periodic workflows: ``@workflow(cron=..., timezone=...)`` or ``@workflow(every=seconds)``.

Ticks are a function of the schedule alone (cron times in the schedule's time zone, or whole
multiples of ``every`` seconds since the Unix epoch), so every worker computes the same ones,
by the database's clock. A worker whose registry holds periodic workflows registers them in
``postjob.schedules`` when it starts and, between jobs and before it waits, claims the ticks
that are due: ``postjob.schedule_tick`` moves the schedule's ``last_tick_at`` forward with a
conditional UPDATE and enqueues the job in the same transaction, so each tick gives exactly one
job however many workers claim it.

After downtime only the most recent missed tick runs (once); with ``skip_missed=True`` a tick
runs only if it is claimed within :func:`grace` of its time, so missed ones are skipped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from postjob_sa import _json, _sql
from postjob_sa.errors import InvalidArgument
from postjob_sa.models import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE

if TYPE_CHECKING:
    from postjob_sa._db import Conn
    from postjob_sa.registry import Registry, Workflow

log = logging.getLogger("postjob_sa.worker")

#: The longest a worker goes without looking at its schedules (a tick is claimed at most this
#: late when the worker's clock and the database's disagree).
CHECK_CAP = 30.0
#: With skip_missed, a tick claimed later than this after its time is skipped (or half the
#: time to the next tick, when that is shorter).
MISSED_GRACE = 60.0
#: The shortest interval of ``every``.
MIN_EVERY = 1.0


@dataclass(frozen=True)
class ScheduleSpec:
    """When a periodic workflow runs: a cron expression in a time zone, or every N seconds."""

    cron: str | None = None
    timezone: str | None = None
    every: float | None = None
    skip_missed: bool = False

    @classmethod
    def build(cls, cron: str | None, tz: str | None, every: float | None,
              skip_missed: bool) -> ScheduleSpec | None:
        """Validated, or None without cron and every; InvalidArgument when malformed."""
        if cron is None and every is None:
            if tz is not None or skip_missed:
                raise InvalidArgument("timezone and skip_missed need cron= or every=")
            return None
        if cron is not None and every is not None:
            raise InvalidArgument("a workflow runs by cron= or every=, not both")
        if not isinstance(skip_missed, bool):
            raise InvalidArgument(f"skip_missed must be True or False, not {skip_missed!r}")
        if every is not None:
            if tz is not None:
                raise InvalidArgument("timezone applies to cron= only (every= counts seconds)")
            if (isinstance(every, bool) or not isinstance(every, (int, float))
                    or not math.isfinite(every) or not MIN_EVERY <= every <= 366 * 86400):
                raise InvalidArgument(
                    f"every must be a number of seconds from {MIN_EVERY:g} to a year, not {every!r}")
            return cls(every=float(every), skip_missed=skip_missed)
        if not isinstance(cron, str):
            raise InvalidArgument(f"cron must be a cron expression string, not {cron!r}")
        zone = "UTC" if tz is None else tz
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidArgument(f"unknown time zone {tz!r} (use an IANA name such as "
                                  "'Europe/Paris')") from None
        try:
            CronSim(cron, datetime.now(UTC))
        except CronSimError as exc:
            raise InvalidArgument(f"bad cron expression {cron!r}: {exc}") from None
        return cls(cron=cron, timezone=zone, skip_missed=skip_missed)

    def latest(self, now: datetime) -> datetime:
        """The most recent tick at or before ``now``."""
        if self.every is not None:
            epoch = now.timestamp()
            return datetime.fromtimestamp(math.floor(epoch / self.every) * self.every, UTC)
        assert self.cron is not None
        local = now.astimezone(ZoneInfo(self.timezone or "UTC")) + timedelta(microseconds=1)
        tick: datetime = next(CronSim(self.cron, local, reverse=True))
        return tick

    def following(self, after: datetime) -> datetime:
        """The first tick after ``after``."""
        if self.every is not None:
            epoch = after.timestamp()
            return datetime.fromtimestamp((math.floor(epoch / self.every) + 1) * self.every,
                                          UTC)
        assert self.cron is not None
        tick: datetime = next(CronSim(self.cron, after.astimezone(ZoneInfo(self.timezone or "UTC"))))
        return tick

    def grace(self, tick: datetime) -> float:
        """How late a tick may be claimed and still run, with skip_missed."""
        interval = (self.following(tick) - tick).total_seconds()
        return min(MISSED_GRACE, interval / 2)

    def describe(self) -> str:
        if self.every is not None:
            return f"every {self.every:g}s"
        return f"{self.cron} ({self.timezone})"


@dataclass
class Tick:
    """What a check decided for one schedule."""

    name: str
    tick: datetime | None  # the tick claimed, or None when none was due
    next_tick: datetime
    job_id: int | None = None
    skipped: bool = False


class Scheduler:
    """Claims the due ticks of the periodic workflows of a registry (see the module doc).

    ``clock`` replaces the database's time (tests advance it by hand)."""

    def __init__(self, registry: Registry, names: list[str] | None = None,
                 clock: Callable[[], datetime] | None = None):
        chosen = set(names) if names is not None else None
        self.workflows: list[Workflow[Any, Any]] = [
            wf for wf in registry.workflows.values()
            if wf.schedule is not None and (chosen is None or wf.name in chosen)
        ]
        self.clock = clock
        self._next_check = float("-inf")

    def __bool__(self) -> bool:
        return bool(self.workflows)

    def _now(self, db_now: datetime) -> datetime:
        return self.clock() if self.clock is not None else db_now

    def register(self, conn: Conn) -> None:
        """Write the schedules' definitions (a changed one starts again from its next tick)."""
        if not self.workflows:
            return
        now = self._now(conn.scalar(_sql.DB_TIME))
        for wf in self.workflows:
            spec = wf.schedule
            assert spec is not None
            conn.rows(_sql.SCHEDULE_REGISTER, {
                "name": wf.name, "cron": spec.cron, "timezone": spec.timezone,
                "every": spec.every, "skip_missed": spec.skip_missed,
                "next_tick": spec.following(now), "now": now,
            })
        self._next_check = float("-inf")

    def seconds_to_tick(self) -> float:
        return max(0.0, self._next_check - time.monotonic())

    def tick_if_due(self, conn: Conn) -> list[Tick]:
        if not self.workflows or time.monotonic() < self._next_check:
            return []
        return self.tick(conn)

    def tick(self, conn: Conn) -> list[Tick]:
        """Claim every due tick now; returns what was decided for each schedule."""
        rows = {r["name"]: r for r in conn.rows(
            _sql.SCHEDULES_STATE, {"names": [wf.name for wf in self.workflows]})}
        done: list[Tick] = []
        wait = CHECK_CAP
        for wf in self.workflows:
            spec = wf.schedule
            row = rows.get(wf.name)
            if spec is None or row is None:  # not registered (yet): register() writes it
                continue
            now = self._now(row["now"])
            latest = spec.latest(now)
            following = spec.following(now)
            wait = min(wait, (following - now).total_seconds())
            last = row["last_tick_at"]
            if last is not None and latest <= last:
                done.append(Tick(wf.name, None, following))
                continue
            skip = spec.skip_missed and (now - latest).total_seconds() > spec.grace(latest)
            job_id = conn.scalar(_sql.SCHEDULE_TICK, {
                "name": wf.name, "tick": latest, "next_tick": following, "skip": skip,
                "queue": wf.queue or DEFAULT_QUEUE,
                "max_attempts": wf.max_attempts or DEFAULT_MAX_ATTEMPTS,
                "timeout": wf.timeout,
                "tags": _json.encode({"schedule": wf.name, "tick": latest.isoformat()}),
            })
            if job_id is not None:
                log.info("schedule %s: tick %s enqueued job %s", wf.name, latest.isoformat(),
                         job_id)
            elif skip:
                log.info("schedule %s: tick %s missed (skip_missed): skipped", wf.name,
                         latest.isoformat())
            done.append(Tick(wf.name, latest, following, job_id, skip))
        self._next_check = time.monotonic() + max(0.0, wait)
        return done
