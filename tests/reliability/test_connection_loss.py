"""The worker loses its connection in the middle of a batch: the batch runs to its end, each
job once, its outcomes are recorded (by the keeper, on a connection of its own), and the worker
reconnects for its next checkout; no job is held (and heartbeat-extended) for ever."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening


def test_unrun_jobs_of_a_batch_are_released_when_the_connection_drops(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    proc = workers(db_url, "--batch", "5", "--lease", "1.5", "--fast")
    wait_listening(engine, 1, [proc])
    base = datetime.now(UTC) - timedelta(seconds=1)
    with Session(engine) as s:
        q = JobQueue(s)
        # one checkout takes all five, in this order: the first cuts the worker's connection;
        # the second outlasts the flush delay, so the outcomes are recorded while three jobs
        # of the batch have not run
        cut = q.enqueue("rel.cut", 0.0, run_at=base).id
        slow = q.enqueue("rel.slow", 0.2, "s", run_at=base + timedelta(milliseconds=1)).id
        others = [q.enqueue("rel.record", k, run_at=base + timedelta(milliseconds=2 + k)).id
                  for k in range(3)]
        s.commit()
    try:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs "
                                        "WHERE status <> 'ok'") == 0, 10, "all jobs ok")
    except AssertionError:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, workflow, status::text, failed_attempts, "
                                     "lease_expires_at FROM postjob.jobs ORDER BY id")).all()
        raise AssertionError(f"{rows}\n{proc.log()}") from None
    with engine.connect() as conn:
        runs_per_job = dict(conn.execute(text(
            "SELECT job_id, count(*) FROM rel_runs GROUP BY job_id")).all())
        attempts = conn.execute(text("SELECT sum(failed_attempts) FROM postjob.jobs")).scalar()
    assert runs_per_job == {cut: 1, slow: 2, **{i: 1 for i in others}}  # slow: start, end  # nothing ran twice either
    assert attempts == 0  # released, not reaped as zombies
    assert "database unreachable" in proc.log()
    assert proc.alive()
    report("connection loss mid-batch: the unrun jobs were released and each ran once")
