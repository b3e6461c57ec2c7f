"""Durable sleep: the job holds no worker and no lease while it sleeps (status sleep, a waiting
row that is not due), runs again when the time has come, and the sleep call then returns;
what ran before it as a step does not run again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import InvalidArgument, JobQueue
from tests.durable import durable_app
from tests.durable.conftest import (
    BackgroundWorker,
    drain,
    enqueue,
    job,
    records,
    status_is,
    steps,
    wait_until,
    waiting,
)

pytestmark = pytest.mark.both_drivers


def _leases(engine: Engine) -> int:
    """Jobs whose rows hold a lease."""
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM postjob.unfinished WHERE lease_token IS NOT NULL")).scalar_one())


def test_a_sleeping_job_holds_nothing_and_wakes_on_time(side: Engine) -> None:
    job_id = enqueue(side, durable_app.nap, 1.5)
    with BackgroundWorker(side):
        wait_until(status_is(side, job_id, "sleep"), 10, "asleep")
        asleep = job(side, job_id)
        assert asleep["lease_token"] is None and _leases(side) == 0
        row = waiting(side, job_id)
        assert row is not None and row["due"] is False and row["run_at"] == asleep["next_run_at"]
        (stored,) = [s for s in steps(side, job_id) if s["kind"] == "sleep"]
        assert stored["name"] == "1" and stored["wake_at"] <= asleep["next_run_at"]
        wait_until(status_is(side, job_id, "ok"), 10, "woken")
    with side.connect() as conn:
        after = conn.execute(text("SELECT at FROM rel_runs WHERE job_id = :j AND what = 'after'"),
                             {"j": job_id}).scalar_one()
    late = (after - stored["wake_at"]).total_seconds()
    assert 0 <= late < 5.0, late  # woken for its time (a 30 s idle wait otherwise; 5 s: load)
    assert records(side, "charge", job_id) == 1  # the step before the sleep ran once
    assert records(side, "after", job_id) == 1


def test_a_rerun_before_the_time_sleeps_on_for_what_is_left(side: Engine) -> None:
    job_id = enqueue(side, durable_app.nap, 1.0)
    drain(side)
    wake_at = [s["wake_at"] for s in steps(side, job_id) if s["kind"] == "sleep"]
    with Session(side) as s:
        JobQueue(s).reset(job_id)  # runs now: the sleep is not over
        s.commit()
    drain(side)
    assert job(side, job_id)["status"] == "sleep"
    assert [s["wake_at"] for s in steps(side, job_id) if s["kind"] == "sleep"] == wake_at
    assert job(side, job_id)["next_run_at"] >= wake_at[0]
    assert records(side, "charge", job_id) == 1
    wait_until(lambda: (drain(side), job(side, job_id)["status"] == "ok")[1], 10, "woken")


def test_force_ends_a_durable_sleep(side: Engine) -> None:
    job_id = enqueue(side, durable_app.nap, 3600)
    drain(side)
    with Session(side) as s:
        JobQueue(s).force(job_id)
        s.commit()
    drain(side)
    assert job(side, job_id)["results"] == ["woke"]


def test_sleep_until_and_async_and_transactional_sleeps(side: Engine) -> None:
    # 3 s: long enough that a loaded machine still finds each job asleep on its first run
    when = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    ids = [enqueue(side, durable_app.nap_until, when), enqueue(side, durable_app.nap_async, 3)]
    tx = enqueue(side, durable_app.nap_tx, 3)
    drain(side)
    drain(side, transactional=True)
    assert [job(side, j)["status"] for j in [*ids, tx]] == ["sleep"] * 3

    def all_woke() -> bool:
        drain(side)
        drain(side, transactional=True)
        return [job(side, j)["results"] for j in [*ids, tx]] == [["woke"]] * 3

    wait_until(all_woke, 20, "all three woken")
    assert [len(steps(side, j)) for j in [*ids, tx]] == [1, 1, 1]  # tx: committed with it


def test_a_sleep_of_zero_returns_at_once(side: Engine) -> None:
    job_id = enqueue(side, durable_app.nap, 0)
    drain(side)
    assert job(side, job_id)["results"] == ["woke"]


def test_bad_sleeps_are_refused() -> None:
    from postjob_sa.durable import sleeping

    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(InvalidArgument):
            sleeping._seconds(bad)
    with pytest.raises(InvalidArgument):
        sleeping._when(datetime.now())  # naive
