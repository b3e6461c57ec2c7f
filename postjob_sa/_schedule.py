"""When a periodic workflow runs: a cron expression in a time zone, or every N seconds.

Ticks are a function of the schedule alone (cron times in the schedule's time zone, or whole
multiples of ``every`` seconds since the Unix epoch), so every worker computes the same ones.
``postjob_sa.worker.scheduler`` claims them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from postjob_sa.errors import InvalidArgument

#: With skip_missed, a tick claimed later than this after its time is skipped (or half the
#: time to the next tick, when that is shorter).
MISSED_GRACE = 60.0
#: The shortest interval of ``every``.
MIN_EVERY = 1.0
#: Ticks of a repeated hour a search passes at most (a minute each; the longest repeat in the
#: tz database is two hours).
MAX_STEPS = 1500


def _utc(tick: datetime) -> datetime:
    """Ticks are compared and subtracted in UTC: two datetimes of one zone compare by wall
    time, whatever their fold, so 02:30 CEST and 02:30 CET would be equal."""
    return tick.astimezone(UTC)


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
        fields = len(cron.split())
        if fields == 6:  # cronsim would read a leading seconds field
            raise InvalidArgument(
                f"cron must have five fields (minute hour day-of-month month day-of-week), "
                f"not 6: {cron!r} (for a period in seconds use every=)")
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
        """The most recent tick at or before ``now`` (UTC)."""
        if self.every is not None:
            epoch = now.timestamp()
            return datetime.fromtimestamp(math.floor(epoch / self.every) * self.every, UTC)
        assert self.cron is not None
        # the microsecond is added to the instant, not to the local time: local arithmetic
        # drops the fold, and in a repeated hour that is the other pass, an hour away
        local = (now + timedelta(microseconds=1)).astimezone(self._zone())
        tick = _utc(next(CronSim(self.cron, local, reverse=True)))
        # In a repeated hour cron's wall-clock walk back can skip ticks of the first pass
        # (a fixed time runs at its first occurrence): the latest is the last tick of the
        # forward sequence at or before now.
        for _ in range(MAX_STEPS):
            later = self.following(tick)
            if later > now:
                break
            tick = later
        return tick

    def following(self, after: datetime) -> datetime:
        """The first tick after ``after`` (UTC); always later than ``after``."""
        if self.every is not None:
            epoch = after.timestamp()
            return datetime.fromtimestamp((math.floor(epoch / self.every) + 1) * self.every,
                                          UTC)
        assert self.cron is not None
        # A fixed time (``30 2 * * *``) runs once a day, at the first occurrence of its wall
        # time: from the second pass of a repeated hour, cron's walk returns that first
        # occurrence, in the past. The next tick is the first one after ``after``.
        ticks = CronSim(self.cron, after.astimezone(self._zone()))
        tick = _utc(next(ticks))
        for _ in range(MAX_STEPS):
            if tick > after:
                return tick
            tick = _utc(next(ticks))
        return max(tick, after + timedelta(seconds=MISSED_GRACE))  # never now: no busy loop

    def local(self, tick: datetime) -> datetime:
        """A tick in the schedule's time zone (what the job's ``tick`` tag shows)."""
        return tick.astimezone(self._zone()) if self.cron is not None else tick

    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or "UTC")

    def grace(self, tick: datetime) -> float:
        """How late a tick may be claimed and still run, with skip_missed."""
        interval = (self.following(tick) - tick).total_seconds()
        return min(MISSED_GRACE, interval / 2)

    def describe(self) -> str:
        if self.every is not None:
            return f"every {self.every:g}s"
        return f"{self.cron} ({self.timezone})"
