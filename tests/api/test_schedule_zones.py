"""Cron ticks across every kind of zone transition (issue 24 item 8): the next tick is always
in the future, the latest never ahead of now, and the two agree, at every minute around the
DST changes of zones with one-hour, half-hour and two-hour shifts. No real waiting: the
times are simulated, the zones are the system's tz database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from postjob_sa._schedule import ScheduleSpec

ZONES = [
    "Europe/Paris",  # one hour, at 02:00/03:00 local
    "America/New_York",  # one hour, at 02:00/01:00 local
    "Australia/Lord_Howe",  # half an hour
    "Antarctica/Troll",  # two hours
    "America/Santiago",  # at midnight: the skipped or repeated hour is 00:00
    "Asia/Kolkata",  # none (a zone without transitions)
]
CRONS = [
    "30 2 * * *",  # in the repeated (or skipped) hour of Paris
    "30 1 * * *",  # in the repeated hour of New York
    "0 0 * * *",  # Santiago's transition hour
    "0-59 2 * * *",  # every minute of one hour (a fixed hour: each wall time once)
    "15,45 1,2,3 * * *",
    "0 * * * *",  # hourly (real time: both passes of a repeated hour)
    "*/15 * * * *",
    "* * * * *",
]
YEAR = 2026


def transitions(zone: str) -> list[datetime]:
    """The instants (UTC) where the zone's offset changes in YEAR."""
    tz = ZoneInfo(zone)
    out = []
    t = datetime(YEAR, 1, 1, tzinfo=UTC)
    while t.year == YEAR:
        nxt = t + timedelta(minutes=30)
        if t.astimezone(tz).utcoffset() != nxt.astimezone(tz).utcoffset():
            # narrow down to the minute
            m = t
            while m.astimezone(tz).utcoffset() == t.astimezone(tz).utcoffset():
                m += timedelta(minutes=1)
            out.append(m)
        t = nxt
    return out


def around(instant: datetime, hours: int = 3) -> Iterator[datetime]:
    """Every third minute (on it, and a second and a half past it) for ``hours`` on either
    side, and every minute of the quarter of an hour after the change."""
    t = instant - timedelta(hours=hours)
    while t <= instant + timedelta(hours=hours):
        if t.minute % 3 == 0 or timedelta(0) <= t - instant < timedelta(minutes=15):
            yield t
            yield t + timedelta(seconds=1.5)
        t += timedelta(minutes=1)


def test_the_zones_have_the_transitions_this_module_is_about() -> None:
    assert len(transitions("Europe/Paris")) == 2
    assert len(transitions("Australia/Lord_Howe")) == 2
    assert transitions("Asia/Kolkata") == []
    # Troll's fall-back repeats two hours
    back = transitions("Antarctica/Troll")[1]
    tz = ZoneInfo("Antarctica/Troll")
    assert (back - timedelta(minutes=1)).astimezone(tz).utcoffset() == timedelta(hours=2)
    assert back.astimezone(tz).utcoffset() == timedelta(0)


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("cron", CRONS)
def test_the_next_tick_is_always_ahead_and_the_latest_never_is(zone: str, cron: str) -> None:
    spec = ScheduleSpec.build(cron, zone, None, False)
    assert spec is not None
    for instant in transitions(zone) or [datetime(YEAR, 3, 29, 1, tzinfo=UTC)]:
        for now in around(instant):
            following = spec.following(now)
            latest = spec.latest(now)
            assert following > now, (now, following)
            assert latest <= now, (now, latest)
            # no tick between them: the latest's next tick is the next one from now
            assert spec.following(latest) == following, (now, latest, following)
            assert spec.latest(following) == following


def _ticks(spec: ScheduleSpec, start: datetime, end: datetime) -> list[datetime]:
    out, t = [], start
    while (t := spec.following(t)) < end:
        out.append(t)
    return out


def test_a_fixed_time_in_the_repeated_hour_runs_once_that_day() -> None:
    """Paris, 25 October 2026: 02:30 happens at 00:30 and at 01:30 UTC; the job runs at the
    first, once (as Debian's cron does), and its next tick is the next day's."""
    spec = ScheduleSpec.build("30 2 * * *", "Europe/Paris", None, False)
    assert spec is not None
    day = _ticks(spec, datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 26, 12, tzinfo=UTC))
    assert day == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]
    second_pass = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)  # 02:10 again, in CET
    assert spec.following(second_pass) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
    assert spec.latest(second_pass) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    ny = ScheduleSpec.build("30 1 * * *", "America/New_York", None, False)
    assert ny is not None
    assert ny.following(datetime(2026, 11, 1, 6, 10, tzinfo=UTC)) == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)


def test_a_fixed_time_in_the_skipped_hour_runs_when_the_clock_has_jumped() -> None:
    """Paris, 29 March 2026: there is no 02:30; the job runs at 03:00 CEST (01:00 UTC)."""
    spec = ScheduleSpec.build("30 2 * * *", "Europe/Paris", None, False)
    assert spec is not None
    ticks = _ticks(spec, datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 30, 12, tzinfo=UTC))
    assert ticks == [datetime(2026, 3, 29, 1, 0, tzinfo=UTC), datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]


def test_an_hourly_schedule_ticks_in_real_time_through_both_passes() -> None:
    spec = ScheduleSpec.build("*/15 * * * *", "Europe/Paris", None, False)
    assert spec is not None
    ticks = _ticks(spec, datetime(2026, 10, 25, 0, 0, tzinfo=UTC), datetime(2026, 10, 25, 2, 0, tzinfo=UTC))
    assert ticks == [datetime(2026, 10, 25, 0, 0, tzinfo=UTC) + timedelta(minutes=15 * i)
                     for i in range(1, 8)]
    # in the second pass the latest tick is the one a quarter of an hour ago, not an hour ago
    assert spec.latest(datetime(2026, 10, 25, 1, 20, tzinfo=UTC)) == datetime(2026, 10, 25, 1, 15, tzinfo=UTC)


def test_the_grace_of_a_tick_before_a_repeated_hour_is_its_real_interval() -> None:
    """02:00 CEST and the next tick, 02:00 CET, are an hour apart though their wall times are
    equal (datetimes of one zone subtract by wall time): skip_missed's grace is 60 s, not 0."""
    spec = ScheduleSpec.build("0 * * * *", "Europe/Paris", None, True)
    assert spec is not None
    tick = spec.latest(datetime(2026, 10, 25, 0, 0, 30, tzinfo=UTC))
    assert tick == datetime(2026, 10, 25, 0, 0, tzinfo=UTC)
    assert spec.grace(tick) == 60
