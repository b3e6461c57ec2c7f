"""Many workers, as if on two hosts: two supervisors with three worker processes each (two jobs
at once per process), all working through one PgBouncer in transaction mode and listening on
one direct connection per supervisor. Every job runs exactly once, and the server connections
stay within the pool (bench/scale.py does the same at 64 processes and measures it)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.conftest import url_string
from tests.pgbouncer import (
    PgBouncer,
    bouncer_fixture,  # noqa: F401 (the fixture "bouncer")
)
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for

JOBS = 600
HOSTS = 2
PROCESSES = 3


def test_two_supervisors_through_pgbouncer_run_every_job_exactly_once(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess], bouncer: PgBouncer
) -> None:
    engine = runs
    pooled = bouncer.url(db_url)
    sups = [workers(pooled, "--processes", str(PROCESSES), "--jobs-per-process", "2",
                    "--pooled", "--wakeup-url", url_string(db_url)) for _ in range(HOSTS)]
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.workers")
             == HOSTS * PROCESSES, 30, "every worker registered")
    listening = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND application_name LIKE 'postjob supervisor%'")
    with Session(engine) as s:  # in several transactions, while the workers run
        for chunk in range(0, JOBS, 100):
            JobQueue(s).enqueue_many("rel.record", [[k] for k in range(chunk, chunk + 100)])
            s.commit()
    peak = [0]

    def done() -> bool:
        pools = [p for p in bouncer.show("POOLS") if p["database"] == db_url.database]
        peak[0] = max(peak[0], sum(int(p[k]) for p in pools  # type: ignore[call-overload]
                                   for k in ("sv_active", "sv_idle", "sv_used")))
        return bool(scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'")
                    == JOBS)

    wait_for(done, 50, f"{JOBS} jobs ok", interval=0.1)
    with engine.connect() as conn:
        per_job = conn.execute(text(
            "SELECT count(*) FROM rel_runs WHERE what = 'run' GROUP BY job_id")).scalars().all()
        pids = conn.execute(text("SELECT count(DISTINCT pid) FROM rel_runs")).scalar()
        direct = conn.execute(listening).scalar()
    for sup in sups:
        assert sup.alive(), sup.log()
    assert len(per_job) == JOBS and set(per_job) == {1}  # every job, exactly once
    assert direct == HOSTS  # one direct connection per host, for the wake-ups
    assert 0 < peak[0] <= 3  # the pool's size: pgbouncer never opened more
    report(f"{HOSTS} supervisors x {PROCESSES} processes x 2 jobs through PgBouncer: {JOBS} jobs "
           f"once each, run by {pids} processes, {peak[0]} server connections through the "
           f"pooler and {direct} direct")
