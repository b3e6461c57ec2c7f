"""Idle workers through DST changes (issue 24 item 8): in the repeated hour of a fall-back a
worker with a periodic workflow at a fixed time used to see its next tick in the past and
loop without pause (schedules read, checkout, worker_idle) until the hour was over. Real
workers, a real database; the time of day is simulated (the schedulers' clock), no waiting
for a DST date."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry
from tests.worker.test_worker_edges import (
    _transactions,
    _transactions_once_earlier_ones_are_counted,
)

reg = Registry()


@postjob_sa.workflow(name="dst.paris", cron="30 2 * * *", timezone="Europe/Paris", registry=reg)
def paris() -> str:
    return "paris"


@postjob_sa.workflow(name="dst.new_york", cron="30 1 * * *", timezone="America/New_York",
                     registry=reg)
def new_york() -> str:
    return "new york"


@postjob_sa.workflow(name="dst.spring", cron="30 2 * * *", timezone="Europe/Paris", registry=reg)
def spring() -> str:
    return "spring"


def _simulated(start: datetime) -> Callable[[], datetime]:
    """A clock at ``start`` when the test begins, running at the real pace."""
    began = time.monotonic()
    return lambda: start + timedelta(seconds=time.monotonic() - began)


#: each workflow's worker, and the simulated time it starts at
CASES = {
    # 02:10 CET on 25 October 2026: the second pass of Paris's repeated hour (02:30 ran at
    # 00:30 UTC, in the first)
    "dst.paris": datetime(2026, 10, 25, 1, 10, tzinfo=UTC),
    # 01:10 EST on 1 November 2026: New York's second 01:10
    "dst.new_york": datetime(2026, 11, 1, 6, 10, tzinfo=UTC),
    # 01:59:59 CET on 29 March 2026, a second before Paris skips to 03:00 (no 02:30 that day:
    # the tick is 03:00 CEST)
    "dst.spring": datetime(2026, 3, 29, 0, 59, 59, tzinfo=UTC),
}


def test_idle_workers_stay_idle_through_zone_transitions(engine: Engine, clean: None) -> None:
    before = _transactions_once_earlier_ones_are_counted(engine)
    workers = []
    for name, start in CASES.items():
        with Session(engine) as s:
            worker = JobQueue(s, registry=reg)._worker(workflows=[name], handle_signals=False)
        worker.scheduler.clock = _simulated(start)
        workers.append(worker)
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    time.sleep(3)
    for w in workers:
        w.stopper.request("the test is over")
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    time.sleep(1.2)  # the workers' connections have closed: their statistics are in
    spent = _transactions(engine) - before
    print(f"three idle workers in zone transitions: {spent} transactions in 3 s")
    assert spent < 150, spent  # a few per second each, not thousands (7,580 before the fix)
    with engine.connect() as conn:
        jobs = conn.execute(text("SELECT workflow, tags->>'tick', status::text FROM postjob.jobs "
                                 "ORDER BY id")).all()
    # the fall-back ticks ran in the first pass (before the workers came): nothing now; the
    # spring tick comes a second after the start, at the first minute after the jump
    assert [tuple(j) for j in jobs] == [("dst.spring", "2026-03-29T03:00:00+02:00", "ok")]
