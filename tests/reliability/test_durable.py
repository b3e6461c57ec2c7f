"""Durable workflows in real ``postjob run`` processes: sleeping jobs hold no worker and no
lease and wake on time, once, with four workers; a worker SIGKILLed during a step, or while
a sleep's outcome is being recorded, loses nothing and repeats nothing that was stored."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening

LEASE = 2.0
ARGS = ("--lease", str(LEASE), "--import", "tests.durable.durable_app")


def _count(engine: Engine, what: str, job_id: int | None = None) -> int:
    return int(scalar(engine, "SELECT count(*) FROM rel_runs WHERE what = :w "
                      "AND (CAST(:j AS bigint) IS NULL OR job_id = :j)", w=what, j=job_id))


def _status(engine: Engine, job_id: int) -> str:
    return str(scalar(engine, "SELECT status::text FROM postjob.jobs WHERE id = :j", j=job_id))


def test_sleeping_jobs_hold_no_worker_and_wake_on_time_once(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    procs = [workers(db_url, *ARGS) for _ in range(4)]
    wait_listening(engine, 4, procs)
    with Session(engine) as s:
        ids = [JobQueue(s).enqueue("dur.nap", 3.0).id for _ in range(40)]
        s.commit()
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs "
                            "WHERE status = 'sleep'") == 40, 10, "all asleep")
    # asleep: no job processing, no lease, every worker idle on LISTEN, nothing due
    assert scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'processing' "
                          "OR lease_token IS NOT NULL") == 0
    assert scalar(engine, "SELECT count(*) FROM postjob.unfinished "
                          "WHERE lease_token IS NOT NULL") == 0
    assert scalar(engine, "SELECT count(*) FROM postjob.unfinished WHERE due") == 0
    wait_listening(engine, 4, procs)
    wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.jobs WHERE status = 'ok'")
             == 40, 15, "all woke and finished")
    with engine.connect() as conn:
        late = conn.execute(text(
            "SELECT max(EXTRACT(EPOCH FROM r.at - s.wake_at)), min(EXTRACT(EPOCH FROM r.at - s.wake_at)) "
            "FROM rel_runs r JOIN postjob.steps s ON s.job_id = r.job_id AND s.kind = 'sleep' "
            "WHERE r.what = 'after'")).one()
        per_job = conn.execute(text(
            "SELECT job_id, count(*) FILTER (WHERE what = 'after'), "
            "count(*) FILTER (WHERE what = 'charge') FROM rel_runs GROUP BY job_id")).all()
    assert sorted(per_job) == [(j, 1, 1) for j in sorted(ids)]  # woke once, charged once
    # on time: never before, and within seconds (a loaded machine; the idle wait is 30 s)
    assert 0 <= float(late[1]) and float(late[0]) < 5.0, late
    report(f"durable sleep: 40 jobs slept 3 s on 4 workers with no lease held; woke "
           f"{float(late[1]) * 1000:.0f} to {float(late[0]) * 1000:.0f} ms after their time, once each")


def test_a_worker_killed_during_a_step_repeats_only_that_step(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    procs = [workers(db_url, *ARGS) for _ in range(2)]
    wait_listening(engine, 2, procs)
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("dur.killed_step", 60.0).id
        s.commit()
    wait_for(lambda: _count(engine, "step started", job_id), 10, "the slow step started")
    pid = scalar(engine, "SELECT pid FROM rel_runs WHERE job_id = :j AND what = 'step started'",
                 j=job_id)
    victim = next(p for p in procs if p.pid == pid)
    victim.kill()
    wait_for(lambda: _status(engine, job_id) == "ok", LEASE + 10, "rescued and finished")
    assert scalar(engine, "SELECT results FROM postjob.jobs WHERE id = :j", j=job_id) == ["1 slow"]
    assert _count(engine, "charge", job_id) == 1  # the stored step did not run again
    assert _count(engine, "step started", job_id) == 2  # the one it was killed in did
    assert _count(engine, "step ended", job_id) == 1
    report("durable: a worker killed in a step; the rescue re-ran that step only")


def test_a_worker_killed_while_its_sleep_is_recorded_loses_nothing(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    """The sleep is stored (its wake time), its outcome is on its way (held back by a share
    lock of the test's on the job's row, which the store does not mind and the outcome
    does), and the worker dies with its connection: the rescue finds the stored sleep and
    sleeps for what is left of it, without charging again."""
    engine = runs
    procs = [workers(db_url, *ARGS) for _ in range(2)]
    wait_listening(engine, 2, procs)
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("dur.nap_gated", 6.0).id  # waits for our go to sleep
        s.commit()
    wait_for(lambda: _count(engine, "charge", job_id), 10, "the run started")
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM postjob.unfinished WHERE job_id = :j FOR SHARE"),
                       {"j": job_id})
        with engine.begin() as gate:  # the lock is ours: now let the run go on to its sleep
            gate.execute(text("INSERT INTO rel_runs (job_id, pid, what) VALUES (:j, 0, 'go')"),
                         {"j": job_id})
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM postjob.steps WHERE job_id = :j "
                                "AND kind = 'sleep'", j=job_id), 10, "the sleep stored")
        blocked = wait_for(lambda: scalar(
            engine, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'postjob worker %' AND wait_event_type = 'Lock'"),
            10, "the outcome waiting for the lock")
        pid = scalar(engine, "SELECT pid FROM rel_runs WHERE job_id = :j AND what = 'charge'",
                     j=job_id)
        victim = next(p for p in procs if p.pid == pid)
        victim.kill()
        scalar(engine, "SELECT pg_terminate_backend(:p)", p=blocked)  # its machine is gone too
        holder.rollback()
    wake_at = scalar(engine, "SELECT wake_at FROM postjob.steps WHERE job_id = :j "
                     "AND kind = 'sleep'", j=job_id)
    wait_for(lambda: _status(engine, job_id) == "sleep", LEASE + 10, "rescued, asleep again")
    assert scalar(engine, "SELECT failed_attempts FROM postjob.jobs WHERE id = :j",
                  j=job_id) == 1  # the lost run counts as an attempt (a zombie)
    wait_for(lambda: _status(engine, job_id) == "ok", 15, "woke and finished")
    with engine.connect() as conn:
        after = conn.execute(text("SELECT at FROM rel_runs WHERE job_id = :j AND what = 'after'"),
                             {"j": job_id}).scalar_one()
        sleeps = conn.execute(text("SELECT wake_at FROM postjob.steps WHERE job_id = :j "
                                   "AND kind = 'sleep'"), {"j": job_id}).scalars().all()
    assert sleeps == [wake_at]  # the same sleep, not a new one from the rescue
    # woken for its time, not by the 30 s idle cap (5 s: a loaded machine is slow, not that slow)
    assert 0 <= (after - wake_at).total_seconds() < 5.0
    assert _count(engine, "charge", job_id) == 1
    report("durable: a worker killed while its sleep's outcome was recorded; the rescue slept "
           "to the stored wake time, charging nothing again")
