"""Crash rescue: a worker SIGKILLed mid-job; its job is rescued by another worker within
lease + 5 s, its late write is fenced off, and a killed parent's child is not duplicated."""

from __future__ import annotations

import json
from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.conftest import finish_ok
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening

LEASE = 2.0
# no --fast: a rescued zombie is retried at once (its worker vanished; the job did not fail),
# so the rescue time is the lease expiry plus the hand-over
ARGS = ("--lease", str(LEASE))


def _rows(engine: Engine, job_id: int) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(r[0], r[1]) for r in conn.execute(
            text("SELECT pid, what FROM rel_runs WHERE job_id = :j ORDER BY at"), {"j": job_id})]


def _by_pid(procs: list[WorkerProcess], pid: int) -> WorkerProcess:
    return next(p for p in procs if p.pid == pid)


def test_killed_workers_job_is_rescued_and_its_late_write_rejected(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    procs = [workers(db_url, *ARGS) for _ in range(2)]
    wait_listening(engine, 2, procs)
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue("rel.slow", 1.5, "done").id
        s.commit()
    wait_for(lambda: _rows(engine, job_id), 10, "the job started")
    victim = _by_pid(procs, _rows(engine, job_id)[0][0])
    with engine.connect() as conn:
        old_token = conn.execute(text(
            "SELECT lease_token FROM postjob.jobs WHERE id = :j AND status = 'processing'"),
            {"j": job_id}).scalar_one()
        killed_at = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    victim.kill()

    def rescued() -> bool:
        return len(_rows(engine, job_id)) >= 2
    wait_for(rescued, LEASE + 5, "another worker started the job again")
    with engine.connect() as conn:
        rescue_at = conn.execute(text(
            "SELECT max(at) FROM rel_runs WHERE job_id = :j AND what = 'start'"), {"j": job_id}
        ).scalar_one()
        # the killed run's late result, while the rescue runs under a new token: rejected
        accepted = finish_ok(conn, job_id, old_token)
        conn.commit()
        assert accepted is False
        assert conn.execute(text("SELECT status::text FROM postjob.jobs WHERE id = :j"),
                            {"j": job_id}).scalar_one() == "processing"
    rescue = (rescue_at - killed_at).total_seconds()
    assert rescue <= LEASE + 5

    wait_for(lambda: scalar(engine, "SELECT status::text FROM postjob.jobs WHERE id = :j",
                            j=job_id) == "ok", 10, "the rescued job finished")
    with engine.connect() as conn:
        # and after it finished, a late batch write is rejected too
        taken = finish_ok(conn, job_id, old_token)
        conn.commit()
        row = conn.execute(text(
            "SELECT status::text, results, failed_attempts, lease_token FROM postjob.jobs "
            "WHERE id = :j"), {"j": job_id}).one()
    assert taken is False
    assert row == ("ok", ["done"], 1, None)  # one attempt lost to the crash, then ok
    rows = _rows(engine, job_id)
    survivor = next(p for p in procs if p is not victim)
    assert rows == [(victim.pid, "start"), (survivor.pid, "start"), (survivor.pid, "end")]
    assert survivor.alive(), survivor.log()
    report(f"crash: job rescued {rescue:.2f} s after SIGKILL (lease {LEASE:g} s, bound "
           f"{LEASE + 5:g} s); late writes with the old fencing token rejected")


def test_a_killed_parent_finds_its_child_again(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    procs = [workers(db_url, *ARGS) for _ in range(2)]
    wait_listening(engine, 2, procs)
    with Session(engine) as s:
        parent_id = JobQueue(s).enqueue("rel.parent", 4, 2.0).id
        s.commit()
    wait_for(lambda: _rows(engine, parent_id), 10, "the parent spawned its child")
    pid, what = _rows(engine, parent_id)[0]
    child_id = int(what.split()[1])
    _by_pid(procs, pid).kill()

    wait_for(lambda: scalar(engine, "SELECT status::text FROM postjob.jobs WHERE id = :j",
                            j=parent_id) == "ok", LEASE + 5 + 2 * 2.0 + 5, "the parent finished")
    with engine.connect() as conn:
        children = conn.execute(text(
            "SELECT id, status::text, results FROM postjob.jobs WHERE parent_id = :p"),
            {"p": parent_id}).all()
        result = conn.execute(text("SELECT results FROM postjob.jobs WHERE id = :p"),
                              {"p": parent_id}).scalar_one()
    spawned = [w for _, w in _rows(engine, parent_id)]
    assert children == [(child_id, "ok", [40])]  # one child, the same one
    assert spawned == [f"spawned {child_id}"] * len(spawned) and len(spawned) >= 2
    assert [w for _, w in _rows(engine, child_id)] == ["child"]  # the child ran once
    assert result == [41]
    report(f"crash: killed parent re-ran {len(spawned) - 1} time(s), found child {child_id} "
           f"again each time ({json.dumps(spawned)})")
