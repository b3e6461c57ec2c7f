"""Reset and the run's lease: a job whose run has ended resets at once; a job ended from outside
while its run still executes is refused, with a reason, until that run is over.

The lease of a run is what tells the database a run may still be executing: it outlives the
job's status when the job is cancelled under it. A worker that stops must end the leases of
the runs it finished, or every reset of those jobs is skipped until the lease expires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidJobState, JobQueue, NonRecoverable, Registry
from postjob_sa.worker.loop import Worker

pytestmark = pytest.mark.both_drivers

reg = Registry()
release = threading.Event()
started = threading.Event()


@postjob_sa.workflow(name="resetrun.fails", registry=reg)
def fails(seconds: float) -> None:
    time.sleep(seconds)
    raise NonRecoverable("no")


@postjob_sa.workflow(name="resetrun.held", registry=reg)
def held() -> str:
    started.set()
    assert release.wait(30)
    return "done"


_workers: list[tuple[Worker, threading.Thread]] = []


@pytest.fixture(autouse=True)
def _stop_workers() -> Iterator[None]:
    yield
    release.set()
    while _workers:
        worker, thread = _workers.pop()
        worker.stopper.request("the test is over")
        thread.join(30)


def _leases(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM postjob.unfinished WHERE lease_token IS NOT NULL")).scalar_one())


@pytest.mark.parametrize("seconds", [0.0, 1.5])
def test_a_job_whose_run_ended_resets_at_once_after_its_worker_stopped(
    engine: Engine, clean: None, seconds: float
) -> None:
    """The worker records the failure in its last cycle and stops: the run's lease must end
    with it (it did not: the lease lived on for its 60 s, and reset skipped the job)."""
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        job_id = q.enqueue(fails, seconds).id
        s.commit()
        assert q.work(1) == 1
        assert _leases(engine) == 0
        assert q.reset(job_id) == [job_id]
        s.commit()


def test_reset_of_a_job_cancelled_while_its_run_executes_waits_for_the_run(
    engine: Engine, clean: None
) -> None:
    release.clear()
    started.clear()
    with Session(engine) as s:
        job_id = JobQueue(s, registry=reg).enqueue(held).id
        s.commit()
    session = Session(engine)
    worker = JobQueue(session, registry=reg, lease=2.0)._worker(count=1, batch=1)
    thread = threading.Thread(target=worker.run)
    _workers.append((worker, thread))
    thread.start()
    assert started.wait(30)
    with Session(engine) as s:
        q = JobQueue(s, registry=reg)
        assert q.cancel(job_id) == [job_id]
        s.commit()
        # the run goes on: a reset now would let a second run start beside it
        with pytest.raises(InvalidJobState) as caught:
            q.reset(job_id)
        assert str(caught.value) == (
            f"job {job_id} was ended while its run went on, and that run has not stopped yet: "
            "reset it once it has (its worker notices within a heartbeat)")
        assert s.execute(text("SELECT 1")).scalar() == 1  # the transaction is usable
        s.rollback()
        release.set()
        thread.join(30)
        session.close()
        assert q.reset(job_id) == [job_id]
        s.commit()
        status = s.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :i"),
                           {"i": job_id}).scalar()
    assert status == "ready"
