"""A worker process running several jobs at once (``--jobs-per-process``): killed mid-batch,
every job is rescued once; stopped by SIGTERM, its running jobs finish; stopped by a second
signal, they are handed back."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from sqlalchemy import URL, Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from tests.reliability.conftest import WorkerProcess, report, scalar, wait_for, wait_listening

JOBS = 4


def _runs(engine: Engine, what: str) -> dict[int, list[int]]:
    """job id -> the pids that recorded ``what`` for it."""
    out: dict[int, list[int]] = {}
    with engine.connect() as conn:
        for job_id, pid in conn.execute(text(
                "SELECT job_id, pid FROM rel_runs WHERE what = :w ORDER BY at"), {"w": what}):
            out.setdefault(int(job_id), []).append(int(pid))
    return out


def _enqueue_slow(engine: Engine, n: int, seconds: float) -> list[int]:
    with Session(engine) as s:
        ids = JobQueue(s).enqueue_many("rel.slow", [[seconds, str(i)] for i in range(n)])
        s.commit()
    return ids


def _statuses(engine: Engine) -> dict[int, tuple[str, int]]:
    with engine.connect() as conn:
        return {int(r[0]): (str(r[1]), int(r[2])) for r in conn.execute(text(
            "SELECT id, status::text, failed_attempts FROM postjob.jobs"))}


def test_a_killed_worker_running_several_jobs_has_each_rescued_once(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    victim = workers(db_url, "--jobs-per-process", str(JOBS), "--lease", "2")
    wait_listening(engine, 1, [victim])
    ids = _enqueue_slow(engine, JOBS, 3.0)
    wait_for(lambda: len(_runs(engine, "start")) == JOBS, 10, "all jobs started at once")
    assert {p for pids in _runs(engine, "start").values() for p in pids} == {victim.pid}
    victim.kill()
    killed = time.monotonic()
    rescuer = workers(db_url, "--jobs-per-process", str(JOBS), "--lease", "2")
    wait_for(lambda: len(_runs(engine, "end")) == JOBS, 20, "every job rescued and finished")
    rescued_in = time.monotonic() - killed
    ends = _runs(engine, "end")
    assert ends == {i: [rescuer.pid] for i in ids}  # each finished once, by the rescuer
    wait_for(lambda: {s for s, _ in _statuses(engine).values()} == {"ok"}, 10, "all ok")
    report(f"worker with {JOBS} jobs at once killed: all {JOBS} rescued once, last one done "
           f"{rescued_in:.1f} s after the kill (lease 2 s, jobs of 3 s)")


def test_sigterm_lets_the_running_jobs_finish_and_starts_no_more(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    proc = workers(db_url, "--jobs-per-process", "3")
    wait_listening(engine, 1, [proc])
    running = _enqueue_slow(engine, 3, 1.5)
    wait_for(lambda: len(_runs(engine, "start")) == 3, 10, "three jobs running")
    waiting = _enqueue_slow(engine, 2, 0.1)
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(timeout=15) == 0, proc.log()
    statuses = _statuses(engine)
    assert [statuses[i] for i in running] == [("ok", 0)] * 3
    assert [statuses[i] for i in waiting] == [("ready", 0)] * 2
    assert scalar(engine, "SELECT count(*) FROM postjob.workers") == 0


def test_a_second_signal_hands_the_running_jobs_back(
    db_url: URL, runs: Engine, workers: Callable[..., WorkerProcess]
) -> None:
    engine = runs
    proc = workers(db_url, "--jobs-per-process", "3")
    wait_listening(engine, 1, [proc])
    running = _enqueue_slow(engine, 3, 30.0)
    wait_for(lambda: len(_runs(engine, "start")) == 3, 10, "three jobs running")
    proc.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(timeout=10) == 0, proc.log()
    statuses = _statuses(engine)
    assert [statuses[i] for i in running] == [("ready", 0)] * 3  # handed back, no attempt
    assert "handing back 3 running job(s)" in proc.log()
