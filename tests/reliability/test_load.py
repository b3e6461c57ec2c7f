"""Exactly once under load: 4 worker processes, 5,000 jobs."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening

JOBS = 5000
WORKERS = 4


def test_every_job_runs_exactly_once_and_the_work_is_shared(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    # two workers take one job per round trip, two take batches: both paths under load
    procs = [workers(db_url, "--batch", "1" if n < 2 else "10") for n in range(WORKERS)]
    wait_listening(engine, WORKERS, procs)

    with Session(engine) as s:
        ids = JobQueue(s).enqueue_many("rel.record", [[k] for k in range(JOBS)])
        s.commit()
    started = time.monotonic()
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'")
             == JOBS, 90, f"{JOBS} jobs ok", interval=0.1)
    took = time.monotonic() - started

    with engine.connect() as conn:
        statuses = dict(conn.execute(text(
            "SELECT status::text, count(*) FROM postjob.jobs GROUP BY 1")).all())
        per_job = conn.execute(text(
            "SELECT count(*), count(DISTINCT job_id), max(n) FROM "
            "(SELECT job_id, count(*) AS n FROM rel_runs GROUP BY job_id) x")).one()
        recorded = {r[0] for r in conn.execute(text("SELECT DISTINCT job_id FROM rel_runs"))}
        shares = dict(conn.execute(text("SELECT pid, count(*) FROM rel_runs GROUP BY pid")).all())
        results = conn.execute(text(
            "SELECT count(*) FROM postjob.jobs WHERE results = jsonb_build_array(args->0) "
            "AND failed_attempts = 0")).scalar()
    assert statuses == {"ok": JOBS}
    assert per_job == (JOBS, JOBS, 1), "some job ran twice or not at all"
    assert recorded == set(ids)
    assert results == JOBS  # each result is its own job's, no retries happened
    assert set(shares) == {p.pid for p in procs}, "a worker did nothing"
    fair = JOBS / WORKERS
    assert min(shares.values()) >= fair / 4, f"unfair spread: {shares}"
    for p in procs:
        assert p.alive(), p.log()
    codes = [p.stop() for p in procs]
    assert codes == [0] * WORKERS, [p.log() for p in procs]
    spread = ", ".join(str(shares[p.pid]) for p in procs)
    report(f"load: {JOBS} jobs on {WORKERS} workers in {took:.2f} s "
           f"({JOBS / took:.0f} jobs/s), each exactly once; per worker: {spread}")
