"""Harness of the durable tests: the side table ``rel_runs`` (what job bodies did, written on
connections of their own), a worker loop in a thread of the test (LISTEN, heartbeat, the real
cycle), and readers of the job's rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue, Registry
from postjob_sa.registry import default_registry
from postjob_sa.worker.loop import Worker
from postjob_sa.worker.options import WorkerOptions
from tests.conftest import libpq_url
from tests.durable import durable_app  # noqa: F401  (its workflows)
from tests.reliability.conftest import create_runs_table


@pytest.fixture
def side(engine: Engine, clean: None, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """An empty queue and an empty ``rel_runs``, which the job bodies write to."""
    monkeypatch.setenv("REL_APP_URL", libpq_url(engine.url))
    create_runs_table(engine)
    return engine


class BackgroundWorker:
    """``JobQueue.work()``'s loop in a thread: started by ``with``, stopped at the end."""

    def __init__(self, engine: Engine, registry: Registry | None = None, **options: Any):
        opts = {"fast_mode": True, "handle_signals": False, "lease": 5.0, **options}
        self.worker = Worker(engine, registry or default_registry, WorkerOptions(**opts))
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> BackgroundWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stopper.request("the test is over")
        self.thread.join(30)
        assert not self.thread.is_alive()


def records(engine: Engine, what: str | None = None, job_id: int | None = None) -> int:
    """How many rows of rel_runs say ``what`` (of the job ``job_id``)."""
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM rel_runs WHERE (CAST(:w AS text) IS NULL OR what = :w) "
            "AND (CAST(:j AS bigint) IS NULL OR job_id = :j)"), {"w": what, "j": job_id}
        ).scalar_one())


def job(engine: Engine, job_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT status::text AS status, results, error, error_message, failed_attempts, "
            "next_run_at, lease_token, trace_context FROM postjob.jobs WHERE id = :j"),
            {"j": job_id}).mappings().one())


def waiting(engine: Engine, job_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT status::text AS status, run_at, due FROM postjob.unfinished WHERE job_id = :j"),
            {"j": job_id}).mappings().first()
    return None if found is None else dict(found)


def steps(engine: Engine, job_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT kind, name, digest, result, error, wake_at FROM postjob.steps "
            "WHERE job_id = :j ORDER BY kind, name"), {"j": job_id}).mappings()]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)


def status_is(engine: Engine, job_id: int, status: str) -> Callable[[], bool]:
    return lambda: job(engine, job_id)["status"] == status





def enqueue(engine: Engine, workflow: object, *args: object) -> int:
    """Enqueue one job and commit; its id."""
    with Session(engine) as s:
        job_id = JobQueue(s).enqueue(workflow, *args).id  # type: ignore[arg-type]
        s.commit()
    return int(job_id)


def drain(engine: Engine, *, transactional: bool = False) -> int:
    """Run what is due now in this process (fast mode): lease mode's drain, or one
    transactional step."""
    with Session(engine) as s:
        if transactional:
            return 1 if JobQueue(s, fast_mode=True).step(transactional=True) else 0
        return JobQueue(s, fast_mode=True).drain()
