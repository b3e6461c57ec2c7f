"""Workflows the reliability tests run in real ``postjob run`` processes
(``--import tests.reliability.rel_app``).

Job bodies record what they do in the side table ``rel_runs`` through a connection of their
own (``$REL_APP_URL``, with the driver the tests run on: ``$POSTJOB_TEST_DRIVER``, default
psycopg 3), never the worker's: a record is evidence that the body ran. The module works with
the released postjob_sa too (the rolling-upgrade test imports it into workers of that code).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any

import postjob_sa

_driver: Any = importlib.import_module(os.environ.get("POSTJOB_TEST_DRIVER") or "psycopg")
_local = threading.local()  # a connection per thread: jobs may run several at once


def _connection() -> Any:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _driver.connect(os.environ["REL_APP_URL"])
        conn.autocommit = True
        if hasattr(conn, "prepare_threshold"):  # psycopg 3: the URL may go through PgBouncer
            conn.prepare_threshold = None
        _local.conn = conn
    return conn


def record(what: str, job_id: int | None = None) -> None:
    """Insert (job id, pid, what, clock_timestamp()) into rel_runs; reconnects after an outage
    (the failed insert raises, so the job is retried)."""
    conn = _connection()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO rel_runs (job_id, pid, what) VALUES (%s, %s, %s)",
                (postjob_sa.current_job().id if job_id is None else job_id, os.getpid(), what),
            )
    except _driver.Error:
        conn.close()
        _local.conn = None
        raise


@postjob_sa.workflow(name="rel.record")
def record_run(key: int) -> int:
    """One execution, one row."""
    record("run")
    return key


@postjob_sa.workflow(name="rel.stamp")
def stamp(key: int) -> int:
    """Records when the body started (CLOCK_MONOTONIC is system-wide on Linux)."""
    record(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
    return key


@postjob_sa.workflow(name="rel.tick")
def tick(key: int) -> int:
    """A little work, then one row (used while the server restarts)."""
    time.sleep(0.005)
    record("run")
    return key


@postjob_sa.workflow(name="rel.slow")
def slow(seconds: float, tag: str) -> str:
    record("start")
    time.sleep(seconds)
    record("end")
    return tag


@postjob_sa.workflow(name="rel.child")
def child(key: int) -> int:
    record("child")
    return key * 10


@postjob_sa.workflow(name="rel.parent")
def parent(key: int, seconds: float) -> int:
    """Spawns its child (written at once by ``.id``), records the child it got, sleeps
    (the test kills it here), then waits for the child."""
    handle = child.spawn(key)
    record(f"spawned {handle.id}")
    time.sleep(seconds)
    return int(handle.result()) + 1


@postjob_sa.workflow(name="rel.cut")
def cut(seconds: float) -> str:
    """Terminates the worker's own main connection (an outage as seen by one worker), then
    works on for longer than the worker's flush interval."""
    record("cut")
    with _connection().cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND (query LIKE '%%postjob.checkout_v4%%' OR query LIKE '%%postjob.finish_v4%%' "
            "OR query LIKE 'EXECUTE postjob_%%')"
        )
    time.sleep(seconds)
    return "cut"


@postjob_sa.workflow(name="rel.catcher")
def catcher() -> str:
    """Waits for a manual step and tells how it ended, failed or cancelled alike."""
    step = postjob_sa.manual("approve")
    try:
        return str(step.result())
    except postjob_sa.ChildFailed as exc:
        record(f"child {exc.status}")
        return f"child {exc.status}"
