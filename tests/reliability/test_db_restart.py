"""Database restart under running workers, on a cluster this test owns (never the shared one):
the workers log the outage, reconnect with back-off, finish every job; no job stays in
processing beyond its lease; no worker exits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import JobQueue
from tests.reliability.conftest import (
    WorkerProcess,
    create_runs_table,
    report,
    scalar,
    wait_for,
    wait_listening,
)
from tests.reliability.scratch_server import ScratchServer

JOBS = 1500
LEASE = 5.0
OUTAGE = 2.0
#: The longest back-off step is 5 s; a worker reconnects at most that long after the server
#: is back, plus a connect and a job.
RECONNECT_BOUND = 5.0 + 3.0


@pytest.fixture(scope="module")
def server() -> Iterator[ScratchServer]:
    try:
        srv = ScratchServer()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"cannot create a scratch PostgreSQL cluster: {exc}")
    try:
        srv.start()
        yield srv
    finally:
        srv.destroy()


@pytest.fixture
def scratch_engine(server: ScratchServer) -> Iterator[Engine]:
    postjob_sa.migrate(server.url.render_as_string(hide_password=False))
    engine = create_engine(server.url, pool_pre_ping=True)
    create_runs_table(engine)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE postjob.postjobs, postjob.tokens RESTART IDENTITY CASCADE"))
    yield engine
    engine.dispose()


def test_workers_survive_a_database_restart(
    server: ScratchServer, scratch_engine: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = scratch_engine
    procs = [workers(server.url, "--lease", str(LEASE), "--fast", "--batch", b)
             for b in ("1", "1", "10")]
    wait_listening(engine, len(procs), procs)
    with Session(engine) as s:
        JobQueue(s).enqueue_many("rel.tick", [[k] for k in range(JOBS)])
        s.commit()
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM rel_runs") >= JOBS // 5, 30,
             "work under way before the restart")

    stopping = time.monotonic()
    server.stop("fast")  # terminates every backend, like a crash-restart or failover
    time.sleep(OUTAGE)
    server.start()
    outage = time.monotonic() - stopping
    engine.dispose()
    up_at = scalar(engine, "SELECT clock_timestamp()")
    done_before = scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'")

    overdue_seen = 0

    def finished() -> bool:
        nonlocal overdue_seen
        for p in procs:
            assert p.alive(), f"worker {p.pid} exited:\n{p.log()}"
        with engine.connect() as conn:
            overdue, open_jobs = conn.execute(text(
                "SELECT count(*) FILTER (WHERE status = 'processing' "
                "  AND lease_expires_at < clock_timestamp() - interval '1 second'), "
                "count(*) FILTER (WHERE status <> 'ok') FROM postjob.jobs")).one()
        overdue_seen = max(overdue_seen, overdue)
        return bool(open_jobs == 0)

    wait_for(finished, 60, "every job ok after the restart", interval=0.1)
    with engine.connect() as conn:
        statuses = dict(conn.execute(text(
            "SELECT status::text, count(*) FROM postjob.jobs GROUP BY 1")).all())
        retried = conn.execute(text(
            "SELECT count(*) FROM postjob.jobs WHERE failed_attempts > 0")).scalar()
        back = dict(conn.execute(text(
            "SELECT pid, EXTRACT(EPOCH FROM min(at) - :up) FROM rel_runs WHERE at > :up "
            "GROUP BY pid"), {"up": up_at}).all())
    assert statuses == {"ok": JOBS}
    assert overdue_seen == 0, "a job stayed in processing beyond its lease"
    for p in procs:
        log = p.log()
        assert "database unreachable" in log and "reconnecting in" in log, log
        assert p.pid in back, f"worker {p.pid} did no job after the restart:\n{log}"
        assert back[p.pid] <= RECONNECT_BOUND, (back, log)
    codes = [p.stop() for p in procs]
    assert codes == [0] * len(procs), [p.log() for p in procs]
    delays = ", ".join(f"{back[p.pid]:.2f}" for p in procs)
    report(f"restart: outage {outage:.2f} s with {done_before}/{JOBS} jobs done; workers took "
           f"their first job {delays} s after the server was back; {retried} job(s) retried "
           f"(their body's own write failed in the outage); all {JOBS} ok, none overdue")
