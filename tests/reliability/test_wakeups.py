"""No thundering herd: under ``postjob run --processes N`` the supervisor listens and wakes one
idle child per notification; a child whose checkout came back full wakes the next one, so a
burst fans out. Independent workers (no supervisor) each LISTEN on a channel of their own, and
a new job wakes the one that has waited longest, not every one.

Wake-ups are counted in the workers' debug log ("woken by ..."), never timed."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, scalar, wait_for, wait_listening

CHILDREN = 8
#: after the last job ended: long enough for every child a herd would have woken to log it
GRACE = 1.0


def _enqueue(engine: Engine, workflow: str, *arg_lists: list[object]) -> list[int]:
    """All in one transaction: one NOTIFY."""
    with Session(engine) as s:
        ids = JobQueue(s).enqueue_many(workflow, list(arg_lists))
        s.commit()
    return ids


def _woken(proc: WorkerProcess, source: str) -> int:
    return len(re.findall(rf"DEBUG woken by {source}", proc.log()))


def _ok(engine: Engine, n: int) -> None:
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'")
             == n, 20, f"{n} jobs ok")


def test_one_job_wakes_one_child_and_a_full_checkout_one_more(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    sup = workers(db_url, "-vv", "--processes", str(CHILDREN), "--batch", "2")
    wait_listening(engine, CHILDREN, [sup])
    for n in range(1, 4):
        _enqueue(engine, "rel.record", [n])
        _ok(engine, n)
        time.sleep(GRACE)
        wait_listening(engine, CHILDREN, [sup])
        # one job, batch 2: the checkout is not full, nobody else is woken
        assert _woken(sup, "supervisor") == n, sup.log()
    assert _woken(sup, "notification") == 0  # the children do not LISTEN


def test_a_burst_fans_out_one_child_at_a_time(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    sup = workers(db_url, "-vv", "--processes", str(CHILDREN))
    wait_listening(engine, CHILDREN, [sup])
    _enqueue(engine, "rel.record", [1])
    _ok(engine, 1)
    time.sleep(GRACE)
    # batch 1: the woken child's checkout is full, so it asks for one more, which finds nothing
    assert _woken(sup, "supervisor") == 2, sup.log()
    assert len(re.findall(r"woke worker \d+ \(a notification\)", sup.log())) == 1
    wait_listening(engine, CHILDREN, [sup])

    _enqueue(engine, "rel.slow", *([1.5, str(i)] for i in range(4)))  # one NOTIFY, four jobs
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM rel_runs WHERE what = 'end'") == 4,
             20, "four slow jobs done")
    with engine.connect() as conn:
        starts = conn.execute(text(
            "SELECT pid, at FROM rel_runs WHERE what = 'start' ORDER BY at")).all()
        ends = conn.execute(text("SELECT min(at) FROM rel_runs WHERE what = 'end'")).scalar()
    assert len({pid for pid, _ in starts}) == 4  # four children ...
    assert all(at < ends for _, at in starts)  # ... at once: all started before one ended
    time.sleep(GRACE)
    assert 2 + 4 <= _woken(sup, "supervisor") <= 2 + 5, sup.log()  # four, and one that found none


def test_independent_workers_each_listen_and_one_wakes_per_job(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    """No herd without a supervisor either: each idle worker waits on its own channel, and a
    new job's insert wakes one of them (postjob._wake)."""
    engine = runs
    procs = [workers(db_url, "-vv") for _ in range(3)]
    wait_listening(engine, 3, procs)
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.workers "
                                    "WHERE waiting_since IS NOT NULL") == 3, 10,
             "every worker marked waiting")
    _enqueue(engine, "rel.record", [1])
    _ok(engine, 1)
    time.sleep(GRACE)
    assert sum(_woken(p, "notification") for p in procs) == 1, [p.log() for p in procs]
