"""Steps: a step's function runs once for its job and name, whatever wakes the job; its result
is stored at once (with the job's writes in transactional mode); a step that raises is stored
only when the error is non-recoverable; names are one per run; a re-run with other arguments
is reported; a run that lost its job stores nothing."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.durable import durable_app
from tests.durable.conftest import drain, enqueue, job, records, steps, wait_until

pytestmark = pytest.mark.both_drivers


def _drain_until(engine: Engine, job_id: int, status: str, timeout: float = 10) -> None:
    def done() -> bool:
        drain(engine)
        return job(engine, job_id)["status"] == status

    wait_until(done, timeout, f"job {job_id} {status}")


def test_a_step_runs_once_across_a_parent_woken_many_times(side: Engine) -> None:
    parent = enqueue(side, durable_app.charge_once, 5)
    drain(side)
    assert job(side, parent)["results"] == [42 + 0 + 10 + 20 + 30 + 40]
    assert records(side, "parent run", parent) == 6  # woken by each of its 5 children
    assert records(side, "charge", parent) == 1  # but charged once
    (stored,) = steps(side, parent)
    assert (stored["kind"], stored["name"], stored["result"]) == ("step", "charge", [42])


def test_step_async_runs_once_too(side: Engine) -> None:
    parent = enqueue(side, durable_app.charge_once_async, 3)
    drain(side)
    assert job(side, parent)["results"] == [42 + 0 + 10 + 20]
    assert records(side, "charge", parent) == 1


def test_a_step_in_a_transactional_job_rolls_back_with_it(side: Engine) -> None:
    job_id = enqueue(side, durable_app.tx_step, True)
    with Session(side) as s:
        JobQueue(s, fast_mode=True).step(transactional=True)  # attempt 1: the step, then fails
    assert job(side, job_id)["status"] == "err"
    assert steps(side, job_id) == []  # the step went with the failed attempt's writes
    assert records(side, "tx", job_id) == 0
    _drain_until(side, job_id, "ok")
    assert job(side, job_id)["results"] == [7]
    assert records(side, "tx", job_id) == 1
    assert [s["result"] for s in steps(side, job_id)] == [[7]]


def test_a_step_that_raises_is_not_stored_and_runs_again(side: Engine) -> None:
    job_id = enqueue(side, durable_app.flaky_step)
    _drain_until(side, job_id, "ok")
    assert records(side, "attempt", job_id) == 2
    assert [s["result"] for s in steps(side, job_id)] == [["done"]]


def test_a_non_recoverable_step_error_is_stored_and_raised_again(side: Engine) -> None:
    job_id = enqueue(side, durable_app.declined, 0.2)
    drain(side)
    assert job(side, job_id)["status"] == "sleep"
    _drain_until(side, job_id, "ok")
    # the re-run after the sleep took the same branch, without charging again
    assert job(side, job_id)["results"] == ["declined: insufficient funds"]
    assert records(side, "charge", job_id) == 1
    charge = next(s for s in steps(side, job_id) if s["kind"] == "step")
    assert charge["error"] == "tests.durable.durable_app:CardDeclined"


def test_a_name_used_twice_in_one_run_fails_the_job(side: Engine) -> None:
    job_id = enqueue(side, durable_app.twice)
    drain(side)
    row = job(side, job_id)
    assert row["status"] == "failed"
    assert row["error"] == "postjob_sa.errors.DuplicateStep"
    assert "'same' is used twice in one run" in row["error_message"]


def test_a_rerun_with_other_arguments_gets_the_stored_result_and_a_warning(
    side: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = enqueue(side, durable_app.with_args, 5)
    drain(side)
    assert job(side, job_id)["results"] == [5]
    with side.begin() as conn:  # the job runs again with other args (as if the code changed)
        conn.execute(text("UPDATE postjob.postjobs SET args = '[6]' WHERE id = :j"), {"j": job_id})
    with Session(side) as s:
        JobQueue(s).reset(job_id)
        s.commit()
    with caplog.at_level(logging.WARNING, logger="postjob_sa.durable"):
        drain(side)
    assert job(side, job_id)["results"] == [5]
    assert records(side, "charge", job_id) == 1
    assert "step 'charge' is called with other arguments" in caplog.text


def test_a_run_that_lost_its_job_stores_no_step(side: Engine) -> None:
    """The fence: the job is cancelled while its step's function runs; the step's result is
    not stored (and the run ends there)."""
    job_id = enqueue(side, durable_app.blocking_step, 1.0)
    worker = threading.Thread(target=drain, args=(side,))
    worker.start()
    wait_until(lambda: records(side, "step started", job_id), 10, "the step started")
    with Session(side) as s:
        JobQueue(s).cancel(job_id)
        s.commit()
    worker.join(30)
    assert records(side, "step ended", job_id) == 1  # the function ran to its end
    assert [s["name"] for s in steps(side, job_id)] == ["first"]  # but 'slow' was not stored
    assert job(side, job_id)["status"] == "cancelled"


def test_reset_tries_a_stored_failure_again_and_keeps_what_succeeded(side: Engine) -> None:
    job_id = enqueue(side, durable_app.twice)  # fails with 'same' stored
    drain(side)
    assert [s["result"] for s in steps(side, job_id)] == [[1]]
    with side.begin() as conn:
        conn.execute(text(
            "INSERT INTO postjob.steps (job_id, kind, name, error, error_message) "
            "VALUES (:j, 'step', 'other', 'x:Y', 'failed')"), {"j": job_id})
    with Session(side) as s:
        JobQueue(s).reset(job_id)
        s.commit()
    assert [s["name"] for s in steps(side, job_id)] == ["same"]


def test_steps_go_with_their_job(side: Engine) -> None:
    job_id = enqueue(side, durable_app.with_args, 1)
    drain(side)
    assert steps(side, job_id)
    with side.begin() as conn:
        conn.execute(text("DELETE FROM postjob.postjobs WHERE id = :j"), {"j": job_id})
    assert steps(side, job_id) == []
