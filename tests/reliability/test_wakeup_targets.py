"""A new job wakes an idle worker that can run it: with one worker per queue (what
docs/operations.md recommends) or workers that import different workflows, the job must not
wake a worker that cannot take it while the one that can sleeps on until its idle wait ends.

Each test starts the worker that cannot run the job first, so that it is the one that has
waited longest (the one an untargeted wake-up picks), then times the job from its enqueue to
its end: well under the idle wait (a heartbeat interval, 20 s with the default lease)."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, scalar, wait_for

#: generous on a loaded 2-core machine; a missed wake-up waits 20 s or more
WAKE_BOUND = 6.0
OTHER = "tests.reliability.rel_other"


def _waiting(engine: Engine) -> int:
    return int(scalar(engine, "SELECT count(*) FROM postjob.workers "
                              "WHERE waiting_since IS NOT NULL"))


def _start_waiting(engine: Engine, workers: Callable[..., WorkerProcess], url: URL,
                   *args: str) -> WorkerProcess:
    """A worker started and idle: marked waiting in postjob.workers."""
    before = _waiting(engine)
    proc = workers(url, "-vv", *args)

    def ready() -> bool:
        assert proc.alive(), proc.log()
        return _waiting(engine) > before

    wait_for(ready, 60, "the worker waiting")
    return proc


def _time_to_ok(engine: Engine, workflow: str, *, queue: str | None = None) -> float:
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue(workflow, 1, queue=queue).id
        s.commit()
    start = time.monotonic()
    wait_for(lambda: scalar(engine, "SELECT status::text FROM postjob.jobs WHERE id = :id",
                            id=job_id) == "ok", 60, f"job {job_id} ok")
    return time.monotonic() - start


def test_a_job_wakes_the_idle_worker_of_its_queue(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    a = _start_waiting(runs, workers, db_url, "--queue", "a")
    b = _start_waiting(runs, workers, db_url, "--queue", "b")
    took = _time_to_ok(runs, "rel.record", queue="b")
    assert took < WAKE_BOUND, (took, a.log(), b.log())
    took = _time_to_ok(runs, "rel.record", queue="a")  # and the other way round
    assert took < WAKE_BOUND, (took, a.log(), b.log())


def test_a_job_wakes_the_idle_worker_that_imports_its_workflow(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    plain = _start_waiting(runs, workers, db_url)
    other = _start_waiting(runs, workers, db_url, "--import", OTHER)
    took = _time_to_ok(runs, "rel.other")
    assert took < WAKE_BOUND, (took, plain.log(), other.log())


#: A job due on queue b that no wake-up announced (what enqueue_v1 writes, without its _wake).
SILENT_JOB = (
    "WITH u AS (INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, "
    "queue, priority, run_at, due) VALUES (nextval('postjob.postjobs_id_seq'), 'ready', "
    "'rel.record', '', 'b', 0, now(), true) RETURNING job_id) "
    "INSERT INTO postjob.postjobs (id, root_id, full_id, workflow, args, queue, next_run_at, "
    "queued) SELECT job_id, job_id, job_id::text, 'rel.record', '[1]', 'b', now(), true FROM u "
    "RETURNING id"
)


def test_a_worker_that_cannot_use_its_wake_up_passes_it_on(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    """A wake-up that reached the queue-a worker while a job waits on queue b (as one for a
    job another worker took first, with a job of b's nobody announced): the a worker finds
    nothing and passes it on to the b worker, which was waiting when it was sent."""
    a = _start_waiting(runs, workers, db_url, "--queue", "a")
    b = _start_waiting(runs, workers, db_url, "--queue", "b")
    with runs.begin() as conn:
        job_id = int(conn.execute(text(SILENT_JOB)).scalar_one())
    with runs.begin() as conn:
        worker_a = conn.execute(text(
            "UPDATE postjob.workers SET waiting_since = NULL WHERE queues = ARRAY['a'] "
            "RETURNING id")).scalar_one()
        conn.execute(text("SELECT pg_notify('postjob_worker_' || :id, "
                          "extract(epoch FROM statement_timestamp())::text)"), {"id": worker_a})
    start = time.monotonic()
    wait_for(lambda: scalar(runs, "SELECT status::text FROM postjob.jobs WHERE id = :id",
                            id=job_id) == "ok", 60, f"job {job_id} ok")
    took = time.monotonic() - start
    assert took < WAKE_BOUND, (took, a.log(), b.log())
