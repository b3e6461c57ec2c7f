"""A worker whose own direct connection is gone is dead: the reap rescues its jobs at once,
whatever their lease. Its connection is its server process as pg_stat_activity shows it, the
pid and when that process started (a new process under the same pid is not the worker's); a
worker that recorded no connection (behind a pooler) keeps the lease rule."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from postjob_sa import JobQueue

pytestmark = pytest.mark.both_drivers


@pytest.fixture
def direct(engine: Engine, clean: None) -> Iterator[Engine]:
    """Connections that close for real when closed (no pool)."""
    own = create_engine(engine.url, poolclass=NullPool)
    yield own
    own.dispose()


def _hold(worker: Connection, engine: Engine, *, attach: bool) -> tuple[int, int]:
    """Register a worker on ``worker`` (attached to it or not), let it check out a job with a
    60 s lease: (the job, its lease token)."""
    worker_id = worker.execute(text(
        "SELECT postjob.register_worker_v2('test:1', 60, 'pj0011', ARRAY['dead.job'], "
        "ARRAY[''], NULL)")).scalar_one()
    if attach:
        worker.execute(text("SELECT postjob.worker_attach_v1(:w)"), {"w": worker_id})
    worker.commit()
    with Session(engine) as s:
        JobQueue(s).enqueue("dead.job")
        s.commit()
    job_id, token = worker.execute(text(
        "SELECT id, lease_token FROM postjob.checkout_v4(:w, NULL, ARRAY['dead.job'], "
        "ARRAY[''], NULL, 1, 60, false, false, true)"), {"w": worker_id}).one()
    worker.commit()
    return int(job_id), int(token)


def _reap(engine: Engine) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text("SELECT postjob.reap_v4()")).scalar_one())


def _lease(engine: Engine, job_id: int) -> int | None:
    with engine.connect() as conn:
        token = conn.execute(text("SELECT lease_token FROM postjob.unfinished "
                                  "WHERE job_id = :id"), {"id": job_id}).scalar()
    return None if token is None else int(token)


def _gone(engine: Engine, pid: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            if not conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                                {"p": pid}).scalar():
                return
        assert time.monotonic() < deadline, f"backend {pid} still there"
        time.sleep(0.05)


def test_a_live_connection_keeps_the_job_and_a_closed_one_gives_it_back(
    engine: Engine, direct: Engine
) -> None:
    worker = direct.connect()
    pid = int(worker.execute(text("SELECT pg_backend_pid()")).scalar_one())
    job_id, token = _hold(worker, engine, attach=True)
    assert _reap(engine) == 0
    assert _lease(engine, job_id) == token
    worker.close()
    _gone(engine, pid)
    assert _reap(engine) == 1
    assert _lease(engine, job_id) is None
    with engine.connect() as conn:
        error, expired = conn.execute(text(
            "SELECT j.error_message, w.expires_at <= now() FROM postjob.jobs j, postjob.workers w "
            "WHERE j.id = :id"), {"id": job_id}).one()
    assert "connection of worker test:1 is gone" in error
    assert expired  # no longer counted alive: not woken, not shown up


def test_another_process_under_the_same_pid_is_not_the_worker(
    engine: Engine, direct: Engine
) -> None:
    with direct.connect() as worker:
        job_id, _ = _hold(worker, engine, attach=True)
        with engine.begin() as conn:  # as if the pid had been given to a new process
            conn.execute(text("UPDATE postjob.workers "
                              "SET backend_start = backend_start - interval '1 second'"))
        assert _reap(engine) == 1
        assert _lease(engine, job_id) is None


def test_a_worker_with_no_connection_recorded_keeps_the_lease_rule(
    engine: Engine, direct: Engine
) -> None:
    worker = direct.connect()
    pid = int(worker.execute(text("SELECT pg_backend_pid()")).scalar_one())
    job_id, token = _hold(worker, engine, attach=False)  # pooled: it never attaches
    worker.close()
    _gone(engine, pid)
    assert _reap(engine) == 0
    assert _lease(engine, job_id) == token
