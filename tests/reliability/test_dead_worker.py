"""A worker whose connection is gone is dead: its jobs are rescued within seconds, not after
its lease. A worker that is merely late to beat (its process stopped, its connection alive)
keeps its job, and a worker behind a pooler (its connection says nothing of it) keeps the
lease rule.

Every worker here runs with a 60 s lease (15 s for the pooled one): a rescue within
RESCUE_BOUND can only come from the dead connection."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for

pytestmark = pytest.mark.both_drivers

OTHER = "tests.reliability.rel_other"
RESCUE_BOUND = 10.0
#: how long a worker that must keep its job is watched (longer than a rescue of a dead one
#: takes: about two seconds)
WATCH = 8.0


def _start_waiting(engine: Engine, workers: Callable[..., WorkerProcess], url: URL,
                   *args: str) -> WorkerProcess:
    """A worker started and idle (a pooled one polls: it is never marked waiting)."""
    count = ("SELECT count(*) FROM postjob.workers" if "--pooled" in args else
             "SELECT count(*) FROM postjob.workers WHERE waiting_since IS NOT NULL")
    before = int(scalar(engine, count))
    proc = workers(url, "--import", OTHER, *args)

    def ready() -> bool:
        assert proc.alive(), proc.log()
        return int(scalar(engine, count)) > before

    wait_for(ready, 60, "the worker waiting")
    return proc


def _started_by(engine: Engine, job_id: int, pid: int) -> bool:
    return bool(scalar(engine, "SELECT count(*) FROM rel_runs WHERE job_id = :id "
                               "AND pid = :pid AND what = 'start'", id=job_id, pid=pid))


def _held_by(engine: Engine, workers: Callable[..., WorkerProcess], url: URL, seconds: float,
             *args: str) -> tuple[WorkerProcess, int, int]:
    """A worker running a long job: (the worker, the job, its lease token)."""
    holder = _start_waiting(engine, workers, url, *args)
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("rel.long_first", seconds).id
        s.commit()
    wait_for(lambda: _started_by(engine, job_id, holder.pid), 30, "the job started")
    token = scalar(engine, "SELECT lease_token FROM postjob.unfinished WHERE job_id = :id",
                   id=job_id)
    assert token is not None
    return holder, job_id, int(token)


def _lease(engine: Engine, job_id: int) -> int | None:
    value = scalar(engine, "SELECT lease_token FROM postjob.unfinished WHERE job_id = :id",
                   id=job_id)
    return None if value is None else int(value)


def test_a_killed_workers_job_is_rescued_in_seconds(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    holder, job_id, _ = _held_by(runs, workers, db_url, 600, "--lease", "60")
    rescuer = _start_waiting(runs, workers, db_url, "--lease", "60")
    holder.kill()
    killed = time.monotonic()
    wait_for(lambda: scalar(runs, "SELECT status::text FROM postjob.jobs WHERE id = :id",
                            id=job_id) == "ok", RESCUE_BOUND, "the killed worker's job rescued")
    took = time.monotonic() - killed
    report(f"dead worker: job rescued and done {took:.1f} s after kill -9 (lease 60 s)")
    assert _started_by(runs, job_id, rescuer.pid)


def test_a_worker_late_to_beat_keeps_its_job(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    """Its process stopped (SIGSTOP): no heartbeat, the connection alive."""
    holder, job_id, token = _held_by(runs, workers, db_url, 3 + WATCH, "--lease", "60")
    rescuer = _start_waiting(runs, workers, db_url, "--lease", "60")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        time.sleep(WATCH)
        assert _lease(runs, job_id) == token
        assert not _started_by(runs, job_id, rescuer.pid)
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    wait_for(lambda: scalar(runs, "SELECT status::text FROM postjob.jobs WHERE id = :id",
                            id=job_id) == "ok", 60, "the job done by its worker")
    assert not _started_by(runs, job_id, rescuer.pid)


def test_a_pooled_worker_keeps_the_lease_rule(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    holder, job_id, token = _held_by(runs, workers, db_url, 600, "--pooled", "--lease", "15")
    rescuer = _start_waiting(runs, workers, db_url, "--lease", "60")
    holder.kill()
    time.sleep(WATCH)
    assert _lease(runs, job_id) == token  # its connection says nothing: the lease holds
    wait_for(lambda: _started_by(runs, job_id, rescuer.pid), 15 + 30 - WATCH,
             "the job rescued once the lease ended")
