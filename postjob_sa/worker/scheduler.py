"""Periodic workflows: ``@workflow(cron=..., timezone=...)`` or ``@workflow(every=seconds)``.

Ticks are a function of the schedule alone (``postjob_sa._schedule.ScheduleSpec``), so every
worker computes the same ones, by the database's clock. A worker whose registry holds periodic
workflows registers them in ``postjob.schedules`` when it starts and, between jobs and before it waits, claims the ticks
that are due: ``postjob.schedule_tick`` moves the schedule's ``last_tick_at`` forward with a
conditional UPDATE and enqueues the job in the same transaction, so each tick gives exactly one
job however many workers claim it.

After downtime only the most recent missed tick runs (once); with ``skip_missed=True`` a tick
runs only if it is claimed within its schedule's grace, so missed ones are skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from postjob_sa import _json, _sql
from postjob_sa.models import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE

if TYPE_CHECKING:
    from postjob_sa._db import Conn
    from postjob_sa.registry import Registry, Workflow

log = logging.getLogger("postjob_sa.worker")

#: The longest a worker goes without looking at its schedules (a tick is claimed at most this
#: late when the worker's clock and the database's disagree).
CHECK_CAP = 30.0


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
                "tags": _json.encode({"schedule": wf.name, "tick": spec.local(latest).isoformat()}),
            })
            if job_id is not None:
                log.info("schedule %s: tick %s enqueued job %s", wf.name, spec.local(latest).isoformat(),
                         job_id)
            elif skip:
                log.info("schedule %s: tick %s missed (skip_missed): skipped", wf.name,
                         spec.local(latest).isoformat())
            done.append(Tick(wf.name, latest, following, job_id, skip))
        self._next_check = time.monotonic() + max(0.0, wait)
        return done
