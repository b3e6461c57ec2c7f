"""What a run's end does to its job: ok, retries with back-off, failure, timeouts, zombies,
fencing of late writes, reset, force and reap."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import postjob_sa
from postjob_sa import InvalidJobState, Job, JobNotFound, JobQueue, Registry, Status
from tests.conftest import finish_ok

pytestmark = pytest.mark.both_drivers

reg = Registry()
calls: list[str] = []


@postjob_sa.workflow(name="out.ok", version="1.2", registry=reg)
def ok(x: object) -> object:
    return {"echo": x}


@postjob_sa.workflow(name="out.flaky", max_attempts=3, registry=reg)
def flaky() -> None:
    calls.append("flaky")
    raise RuntimeError("boom")


@postjob_sa.workflow(name="out.fatal", registry=reg)
def fatal() -> None:
    raise postjob_sa.NonRecoverable("hopeless")


@postjob_sa.workflow(name="out.weird_result", registry=reg)
def weird_result() -> object:
    return {1, 2}


@postjob_sa.workflow(name="out.nan_result", registry=reg)
def nan_result() -> float:
    return float("nan")


@postjob_sa.workflow(name="out.none", registry=reg)
def none() -> None:
    return None


def _q(session: Session, **kw: object) -> JobQueue:
    return JobQueue(session, registry=reg, **kw)  # type: ignore[arg-type]


def _job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    assert job is not None
    session.refresh(job)
    return job


def test_ok_stores_the_result_as_a_one_element_array_and_stamps_the_version(session: Session) -> None:
    q = _q(session, fast_mode=True)
    job = q.enqueue(ok, [1, "a"])
    nothing = q.enqueue(none)
    session.commit()
    assert q.drain() == 2
    job, nothing = _job(session, job.id), _job(session, nothing.id)
    assert job.status is Status.ok and job.results == [{"echo": [1, "a"]}]
    assert job.workflow_version == "1.2" and job.next_run_at is None
    assert job.processing_started_at is None and job.lease_token is None
    assert nothing.status is Status.ok and nothing.results == [None]


def _delay(job: Job) -> float:
    assert job.next_run_at is not None
    return (job.next_run_at - job.updated_at).total_seconds()


def test_recoverable_errors_back_off_by_the_default_then_fail(session: Session) -> None:
    """The seed's back-off, computed by the worker: 10 s, then 1.5 times longer each time."""
    q = _q(session)  # normal mode: base 10 s
    job = q.enqueue(flaky)
    session.commit()
    assert q.step() == job.id
    job = _job(session, job.id)
    assert job.status is Status.err and job.failed_attempts == 1
    assert job.error == "RuntimeError" and job.error_message == "boom"
    assert job.error_backtrace and any("in flaky" in f for f in job.error_backtrace)
    assert _delay(job) == pytest.approx(10, abs=0.01)
    # make it due and run again: the second delay is 10 * 1.5
    q.force(job.id)
    session.commit()
    assert q.step() == job.id
    job = _job(session, job.id)
    assert job.failed_attempts == 2
    assert _delay(job) == pytest.approx(10 * 1.5, abs=0.01)
    q.force(job.id)
    session.commit()
    assert q.step() == job.id
    job = _job(session, job.id)
    assert job.status is Status.failed and job.failed_attempts == 3 and job.next_run_at is None


attempts_seen: list[int] = []


def _linear(attempt: int) -> float:
    attempts_seen.append(attempt)
    return 42.0 * attempt


@postjob_sa.workflow(name="out.own_backoff", max_attempts=3, backoff=_linear, registry=reg)
def own_backoff() -> None:
    raise RuntimeError("again")


@postjob_sa.workflow(name="out.broken_backoff", backoff=lambda attempt: 1 / 0, registry=reg)
def broken_backoff() -> None:
    raise RuntimeError("again")


def test_a_workflow_backs_off_by_its_own_function(session: Session) -> None:
    """@workflow(backoff=fn): fn(attempt) seconds after the attempt-th failure, fast mode or
    not (no migration: the worker hands the delay to the database)."""
    attempts_seen.clear()
    q = _q(session, fast_mode=True)
    job = q.enqueue(own_backoff)
    session.commit()
    assert q.step() == job.id
    assert _delay(_job(session, job.id)) == pytest.approx(42, abs=0.01)
    q.force(job.id)
    session.commit()
    assert q.step() == job.id
    assert _delay(_job(session, job.id)) == pytest.approx(84, abs=0.01)
    assert attempts_seen == [1, 2]


def test_a_back_off_that_raises_falls_back_to_the_default(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    q = _q(session)
    job = q.enqueue(broken_backoff)
    session.commit()
    assert q.step() == job.id
    job = _job(session, job.id)
    assert job.status is Status.err and _delay(job) == pytest.approx(10, abs=0.01)
    assert "its backoff(1) raised ZeroDivisionError" in caplog.text


def test_fail_through_the_api_backs_off_by_the_workflow(session: Session) -> None:
    q = _q(session)
    job = q.enqueue(own_backoff)
    session.commit()
    [held] = q.checkout(["out.own_backoff"])
    q.fail(held, RuntimeError("by hand"))
    session.commit()
    assert _delay(_job(session, job.id)) == pytest.approx(42, abs=0.01)


def test_fast_mode_retries_until_max_attempts(session: Session) -> None:
    calls.clear()
    q = _q(session, fast_mode=True)
    job = q.enqueue(flaky)
    session.commit()
    deadline = time.monotonic() + 10
    while _job(session, job.id).status is not Status.failed and time.monotonic() < deadline:
        q.drain()
        time.sleep(0.02)
    assert _job(session, job.id).status is Status.failed
    assert calls == ["flaky"] * 3


def test_non_recoverable_fails_at_once(session: Session) -> None:
    q = _q(session, fast_mode=True)
    job = q.enqueue(fatal, max_attempts=5)
    session.commit()
    q.drain()
    job = _job(session, job.id)
    assert job.status is Status.failed and job.failed_attempts == 1
    assert job.error == "postjob_sa.errors.NonRecoverable" and job.error_message == "hopeless"


@pytest.mark.parametrize("wf", [weird_result, nan_result])
def test_a_result_that_is_not_json_fails_the_job_clearly(session: Session, wf: postjob_sa.Workflow) -> None:  # type: ignore[type-arg]
    q = _q(session, fast_mode=True)
    job = q.enqueue(wf)
    session.commit()
    q.drain()
    job = _job(session, job.id)
    assert job.status is Status.failed and job.error == "postjob_sa.errors.ResultNotJSON"
    assert "not JSON" in (job.error_message or "")


def test_timeout_is_reaped_before_the_job_would_run(session: Session) -> None:
    q = _q(session, fast_mode=True)
    job = q.enqueue(ok, 1, timeout=0.05)
    session.commit()
    time.sleep(0.1)
    assert q.drain() == 0
    job = _job(session, job.id)
    assert job.status is Status.timeout and job.error == "Timeout" and job.failed_attempts == 1


def test_reap_without_a_worker(session: Session) -> None:
    q = _q(session, fast_mode=True)
    job = q.enqueue(ok, 1, timeout=0.01)
    session.commit()
    time.sleep(0.05)
    assert q.reap() == 1
    session.commit()
    assert _job(session, job.id).status is Status.timeout
    assert q.reap() == 0


def test_an_expired_lease_is_reaped_as_a_zombie_and_the_late_write_is_rejected(
    engine: Engine, session: Session
) -> None:
    q = _q(session, fast_mode=True, lease=0.05)
    job = q.enqueue(ok, 1)
    session.commit()
    (stale,) = q.checkout()
    old_token = stale.lease_token
    session.commit()
    time.sleep(0.1)
    assert q.reap() == 1
    session.commit()
    job = _job(session, job.id)
    assert job.status is Status.err and job.error == "Zombie" and job.failed_attempts == 1
    # the job runs again under a new lease ...
    time.sleep(0.05)
    (fresh,) = q.checkout()
    assert fresh.lease_token != old_token
    session.commit()
    # ... and the original worker's late result is fenced off
    with engine.begin() as conn:
        assert finish_ok(conn, job.id, old_token) is False
    assert _job(session, job.id).status is Status.processing
    q.complete(fresh, "fresh")
    session.commit()
    assert _job(session, job.id).result() == "fresh"


def test_heartbeat_keeps_a_long_job_alive(session: Session) -> None:
    seen: list[float] = []

    def long_job() -> str:
        time.sleep(0.5)
        return "done"

    r = Registry()
    r.add(postjob_sa.Workflow(long_job, name="out.long"))
    q = JobQueue(session, fast_mode=True, lease=0.2, registry=r)
    job = q.enqueue("out.long")
    session.commit()
    assert q.drain() == 1
    job = _job(session, job.id)
    assert job.status is Status.ok and job.failed_attempts == 0, (job.error, seen)


def test_reset_gives_a_timed_out_job_a_fresh_deadline(session: Session) -> None:
    q = _q(session, fast_mode=True)
    job = q.enqueue(ok, 1, timeout=60)
    session.commit()
    # its deadline passes (by the database's clock, whatever the machine's load): the job's
    # record and its row in postjob.unfinished, which the reaper reads
    for table, key in (("postjobs", "id"), ("unfinished", "job_id")):
        session.execute(text(f"UPDATE postjob.{table} SET timing_out_at = now() - interval '1 s' "
                             f"WHERE {key} = :id"), {"id": job.id})
    session.commit()
    q.reap()
    session.commit()
    assert _job(session, job.id).status is Status.timeout
    assert q.reset(job.id) == [job.id]
    session.commit()
    job = _job(session, job.id)
    assert job.status is Status.ready and job.failed_attempts == 0 and job.error is None
    assert job.timing_out_at is not None and job.timing_out_at > job.updated_at
    assert job.timing_out_at - job.updated_at == timedelta(seconds=60)
    assert q.drain() == 1
    assert _job(session, job.id).status is Status.ok


def test_reset_and_force_reject_unknown_ids_and_leave_the_session_usable(session: Session) -> None:
    q = _q(session, fast_mode=True)
    job = q.enqueue(ok, 1)
    with pytest.raises(JobNotFound, match="999"):
        q.reset(job.id, 999)
    with pytest.raises(JobNotFound):
        q.force(999)
    with pytest.raises(postjob_sa.InvalidArgument):
        q.reset()
    with pytest.raises(postjob_sa.InvalidArgument):
        q.force(-1)
    session.commit()
    assert _job(session, job.id).status is Status.ready


def test_force_runs_a_waiting_job_now(session: Session) -> None:
    q = _q(session, fast_mode=True)
    later = q.enqueue(ok, 1, run_at=__import__("datetime").datetime.now(__import__("datetime").timezone.utc) + timedelta(hours=1))
    session.commit()
    assert q.drain() == 0
    q.force(later.id)
    session.commit()
    assert q.drain() == 1
    with pytest.raises(InvalidJobState, match="ok"):
        q.force(later.id)


#: Updates of the job record: of its ranges (a partitioned table counts none of its own).
RECORD_UPDATES = (
    "SELECT sum(n_tup_upd) FROM pg_stat_user_tables WHERE relid IN "
    "(SELECT inhrelid FROM pg_inherits WHERE inhparent = 'postjob.postjobs'::regclass)")


def test_a_run_writes_the_record_once_when_it_ends(engine: Engine, session: Session) -> None:
    """The checkout writes the job's row in postjob.unfinished only; the record is written
    when the run ends."""
    q = _q(session, fast_mode=True)
    job = q.enqueue(ok, 1)
    session.commit()
    engine.dispose()  # pooled connections flush their statistics when they close
    time.sleep(0.3)
    with engine.connect() as conn:
        before = conn.execute(text(RECORD_UPDATES)).scalar()
    q.drain()
    time.sleep(0.6)  # statistics are flushed asynchronously
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        after = conn.execute(text(RECORD_UPDATES)).scalar()
    assert _job(session, job.id).status is Status.ok
    assert after - before == 1  # the result


@postjob_sa.workflow(name="out.welcome", registry=reg)
def welcome(email: str) -> str:
    calls.append(email)
    return email


@postjob_sa.workflow(name="out.type_error", max_attempts=2, registry=reg)
def raises_type_error(x: int) -> None:
    calls.append("type_error")
    raise TypeError("a bug of the workflow's own")


def test_a_run_whose_args_do_not_fit_the_workflow_fails_at_once(engine: Engine, session: Session) -> None:
    """A job enqueued where the workflow's function was not known (by name, from another
    process): retrying cannot make its args fit, so its first run fails it."""
    calls.clear()
    session.add(Job(workflow="out.welcome", args=["a", "b"]))
    session.add(Job(workflow="out.welcome", args=[]))
    session.add(Job(workflow="out.type_error", args=[1]))
    session.commit()
    _q(session).drain()
    rows = {tuple(r[0]): r[1:] for r in session.execute(text(
        "SELECT args, status::text, failed_attempts, error, error_message "
        "FROM postjob.postjobs WHERE workflow = 'out.welcome'"))}
    assert rows == {
        ("a", "b"): ("failed", 1, "postjob_sa.errors.ArgumentMismatch",
                     'the args ["a", "b"] do not fit workflow \'out.welcome\' (email): '
                     "too many positional arguments"),
        (): ("failed", 1, "postjob_sa.errors.ArgumentMismatch",
             "the args [] do not fit workflow 'out.welcome' (email): "
             "missing a required argument: 'email'"),
    }
    assert calls == ["type_error"]  # their functions never ran
    # a TypeError the workflow raises itself is an error like any other: retried
    status, attempts = session.execute(text(
        "SELECT status::text, failed_attempts FROM postjob.postjobs "
        "WHERE workflow = 'out.type_error'")).one()
    assert (status, attempts) == ("err", 1)


def test_a_worker_logs_each_job_it_rescues_from_a_dead_worker(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    """The job, its workflow, the worker that held it and when that one's lease ended: a
    rescue is an event an operator wants to see (a crash, a kill, a machine gone)."""
    gone = _q(session, fast_mode=True, lease=0.05, identifier="host-a:4242")
    retried, last = gone.enqueue(ok, 1), gone.enqueue(fatal)
    session.execute(text("UPDATE postjob.postjobs SET max_attempts = 1 WHERE id = :i"),
                    {"i": last.id})
    session.commit()
    held = gone.checkout(limit=2)  # and then its worker dies: nobody beats for the lease
    expires = session.execute(text("SELECT min(lease_expires_at) FROM postjob.unfinished")).scalar_one()
    session.commit()
    assert {j.id for j in held} == {retried.id, last.id}
    time.sleep(0.1)
    with caplog.at_level(logging.WARNING, logger="postjob_sa.worker"):
        _q(session, fast_mode=True).drain()
    lines = [r.getMessage() for r in caplog.records if "rescued" in r.getMessage()]
    at = expires.astimezone().strftime("%H:%M:%S")
    assert lines == [
        f"job {retried.id} (out.ok) rescued from worker host-a:4242, whose lease expired at "
        f"{at}: to be retried (attempt 2 of 5)",
        f"job {last.id} (out.fatal) rescued from worker host-a:4242, whose lease expired at "
        f"{at}: failed (no attempts left)",
    ]
    assert _job(session, retried.id).status is Status.ok  # the retry ran
    assert _job(session, last.id).status is Status.failed
