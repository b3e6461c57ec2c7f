"""Leases and heartbeats: a job on a live worker is never taken from it, whatever other
transactions hold, and a checkout in the caller's transaction locks only what it hands out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue, Registry
from postjob_sa.worker.loop import Worker
from tests.conftest import dbapi_connect, libpq_url

pytestmark = pytest.mark.both_drivers

reg = Registry()
RUNS_URL: list[str] = []


def _record(what: str) -> None:
    conn = dbapi_connect(RUNS_URL[0])
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO lease_runs (job_id, what) VALUES (%s, %s)",
                        (postjob_sa.current_job().id, what))
    finally:
        conn.close()


@postjob_sa.workflow(name="lease.slow", registry=reg)
def slow(seconds: float) -> str:
    _record("start")
    time.sleep(seconds)
    return "done"


@pytest.fixture
def runs(engine: Engine, clean: None) -> Iterator[Engine]:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS lease_runs (job_id bigint, what text)"))
        conn.execute(text("TRUNCATE lease_runs"))
    RUNS_URL[:] = [libpq_url(engine.url)]
    yield engine


def _starts(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(r[0]): int(r[1]) for r in conn.execute(text(
            "SELECT job_id, count(*) FROM lease_runs WHERE what = 'start' GROUP BY job_id"))}


class Rescuer:
    """A second worker that drains over and over: it runs whatever the first one loses."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with Session(self.engine) as s:
            q = JobQueue(s, fast_mode=True, registry=reg, lease=LEASE)
            while not self.stop.is_set():
                q.drain()
                time.sleep(0.1)

    def __enter__(self) -> Rescuer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


#: The workers' lease. The heartbeat beats at a third of it: 2 s leaves a loaded 2-core machine
#: (make test runs modules side by side) time to schedule the heartbeat's thread; at 1 s a
#: starved beat got a worker presumed dead and its job rescued.
LEASE = 2.0
#: Workers of the running test, stopped when it ends (one whose job was rescued never reaches
#: its count, and would work on in the next test's database).
_workers: list[tuple[Worker, threading.Thread]] = []


@pytest.fixture(autouse=True)
def _stop_workers() -> Iterator[None]:
    yield
    while _workers:
        worker, thread = _workers.pop()
        worker.stopper.request("the test is over")
        thread.join(30)


def _work(engine: Engine, count: int, batch: int) -> threading.Thread:
    session = Session(engine)
    worker = JobQueue(session, fast_mode=True, registry=reg, lease=LEASE,
                      batch_size=batch)._worker(count=count, batch=batch)

    def run() -> None:
        try:
            worker.run()
        finally:
            session.close()

    t = threading.Thread(target=run)
    _workers.append((worker, t))
    t.start()
    return t


def test_the_heartbeat_keeps_a_job_longer_than_its_lease(runs: Engine) -> None:
    """Without the heartbeat the job's lease (2 s) ends while it runs (6 s): the rescuer takes
    it and it runs twice."""
    with Session(runs) as s:
        job_id = JobQueue(s, registry=reg).enqueue(slow, 3 * LEASE).id
        s.commit()
    worker = _work(runs, 1, 1)
    with Rescuer(runs):
        worker.join(30)
    assert _starts(runs) == {job_id: 1}
    with runs.connect() as conn:
        assert conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                            {"i": job_id}).scalar() == "ok"


def test_a_row_locked_by_the_app_stalls_neither_the_heartbeat_nor_the_batch(runs: Engine) -> None:
    """Two jobs of 4 s in one batch of one worker, a lease of 2 s, and an application
    transaction that holds the first job's row locked for the whole time: each job still runs
    exactly once (a heartbeat that waited for that lock would let the second job's lease end,
    and the rescuer would run it too)."""
    with Session(runs) as s:
        q = JobQueue(s, registry=reg)
        first = q.enqueue(slow, 2 * LEASE).id
        second = q.enqueue(slow, 2 * LEASE).id
        s.commit()
    worker = _work(runs, 2, 2)
    deadline = time.monotonic() + 10
    while first not in _starts(runs) and time.monotonic() < deadline:
        time.sleep(0.02)
    with runs.connect() as conn:  # one worker holds both, the first one running
        assert conn.execute(text("SELECT count(*) FROM postjob.jobs "
                                 "WHERE status = 'processing'")).scalar() == 2
    with runs.connect() as app, Rescuer(runs):
        app.begin()
        app.execute(text("SELECT 1 FROM postjob.postjobs WHERE id = :i FOR UPDATE"), {"i": first})
        time.sleep(3.5 * LEASE)  # the first job ends meanwhile; the second runs on
        app.rollback()
        worker.join(30)
    assert _starts(runs) == {first: 1, second: 1}
    with runs.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status::text FROM postjob.jobs")).all())
    assert statuses == {first: "ok", second: "ok"}


def test_checkout_in_the_callers_transaction_locks_only_what_it_hands_out(
    engine: Engine, clean: None
) -> None:
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True, registry=reg, lease=0.1)
        abandoned = q.enqueue(slow, 0).id
        s.commit()
        q.checkout(limit=1)  # checked out, then abandoned: its lease ends in 0.1 s
        s.commit()
        time.sleep(0.3)
        waiting = q.enqueue(slow, 0).id
        s.commit()
        (taken,) = q.checkout(limit=1)  # the caller's transaction stays open
        assert taken.id == waiting
        with engine.connect() as other:  # the expired job was neither reaped nor locked
            other.execute(text("SET lock_timeout = '100ms'"))
            row = other.execute(text(
                "SELECT lease_token IS NOT NULL FROM postjob.unfinished WHERE job_id = :i "
                "FOR UPDATE NOWAIT"), {"i": abandoned}).scalar()
            assert row is True  # still held under its expired lease
            other.rollback()
        s.rollback()
    with Session(engine) as s:
        assert JobQueue(s, registry=reg).reap() == 1  # reaping is reap()'s and the workers' job
        s.commit()


def test_a_job_on_a_live_worker_is_never_reaped_whatever_its_lease_says(runs: Engine) -> None:
    """The worker's row beats; the job's own lease is past (as when another transaction held
    its row while the heartbeat came): reap() leaves it, and it runs once."""
    with Session(runs) as s:
        job_id = JobQueue(s, registry=reg).enqueue(slow, 1.5).id
        s.commit()
    worker = _work(runs, 1, 1)
    deadline = time.monotonic() + 10
    while job_id not in _starts(runs) and time.monotonic() < deadline:
        time.sleep(0.02)
    with runs.begin() as conn:
        conn.execute(text("UPDATE postjob.unfinished SET lease_expires_at = now() - interval '5 s' "
                          "WHERE job_id = :i"), {"i": job_id})
    with Session(runs) as s:
        assert JobQueue(s).reap() == 0
        s.commit()
    worker.join(30)
    assert _starts(runs) == {job_id: 1}
    with runs.connect() as conn:
        assert conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                            {"i": job_id}).scalar() == "ok"
