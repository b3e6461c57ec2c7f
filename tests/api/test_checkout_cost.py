"""A checkout, and an idle worker's wait, cost the same whatever lies beside the jobs it takes
that it cannot take now: finished jobs, manual steps, jobs of workflows it does not run, jobs
due later at many priorities, jobs in a durable sleep or waiting for an event, a queue it does
not serve, a limited queue at its cap.

Counted, not timed: the buffers a call reads (every relation of the schema, tables and
indexes, from the transaction's own statistics), for a worker's checkout of 1 and of 100, the
same through the API (which takes a counted path of its own) and for the idle wait, against the same call with nothing beside. Each call runs in a transaction rolled
back, so every one finds the same jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, TextClause, text

W, OTHER, Q = "cost.w", "cost.other", "q"

#: Buffers read in this transaction so far, in the postjob schema.
BLOCKS = text(
    "SELECT COALESCE(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint "
    "FROM pg_class c WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i')"
)
#: A worker's checkout (it makes due first what has come due) and its idle wait.
CHECKOUT = text(
    "SELECT id FROM postjob.checkout_v4(NULL, NULL, ARRAY[:w], ARRAY[''], "
    "CAST(:queues AS text[]), :limit, 60, false, false, true)"
)
#: A checkout through the API (JobQueue.checkout: it names its holder, and takes the jobs whose
#: time has come that no worker made due).
CHECKOUT_API = text(
    "SELECT id FROM postjob.checkout_v4(NULL, 'app', ARRAY[:w], ARRAY[''], "
    "CAST(:queues AS text[]), :limit, 60, true, false, false)"
)
IDLE = text("SELECT postjob.worker_idle_v2(NULL, ARRAY[:w], ARRAY[''], CAST(:queues AS text[]), "
            "false)")

#: The jobs every table has: 5,000 due jobs of the served workflow in the served queue (enough
#: for the indexes to have the depth they keep up to a few hundred thousand rows: a checkout's
#: cost grows with the depth of a B-tree, by a buffer per job and level, whatever the rows).
DUE = ("INSERT INTO postjob.postjobs (workflow, queue, next_run_at) "
       "SELECT 'cost.w', 'q', now() - interval '1 hour' + g * interval '1 ms' "
       "FROM generate_series(1, 5000) g")

#: What lies beside them, shape by shape (the issue's sizes, or a fifth of them where a
#: million rows would make the test slow and the cost does not depend on the number).
BESIDE: dict[str, list[str]] = {
    "nothing": [],
    "200,000 finished jobs": [
        "INSERT INTO postjob.postjobs (workflow, queue, status, results) "
        "SELECT 'cost.w', 'q', 'ok', '[1]' FROM generate_series(1, 200000)"],
    "100,000 manual steps": [
        "INSERT INTO postjob.postjobs (workflow, queue) "
        "SELECT '__manual__', 'q' FROM generate_series(1, 100000)"],
    "100,000 jobs of a workflow not run": [
        "INSERT INTO postjob.postjobs (workflow, queue, next_run_at) "
        "SELECT 'cost.other', 'q', now() - interval '2 hours' FROM generate_series(1, 100000)"],
    "2,000 priority levels due later": [
        "INSERT INTO postjob.postjobs (workflow, queue, priority, next_run_at) "
        "SELECT 'cost.w', 'q', g, now() + interval '1 day' FROM generate_series(1, 2000) g"],
    # as a durable sleep's outcome leaves them (finish_v4: status sleep, an unfinished row
    # with its wake time, not due), and as a wait for an event does (no time)
    "100,000 jobs in a durable sleep": [
        "INSERT INTO postjob.postjobs (workflow, queue, status) "
        "SELECT 'cost.w', 'q', 'sleep' FROM generate_series(1, 100000)",
        "UPDATE postjob.unfinished SET run_at = now() + interval '1 day' WHERE status = 'sleep'"],
    "100,000 jobs waiting for an event": [
        "INSERT INTO postjob.postjobs (workflow, queue, status) "
        "SELECT 'cost.w', 'q', 'sleep' FROM generate_series(1, 100000)",
        "INSERT INTO postjob.event_waits (job_id, seq, key) "
        "SELECT job_id, 1, 'key-' || job_id FROM postjob.unfinished WHERE status = 'sleep'"],
    "a queue not served": [
        "INSERT INTO postjob.postjobs (workflow, queue, priority, next_run_at) "
        "SELECT 'cost.w', 'elsewhere', 10, now() - interval '2 hours' "
        "FROM generate_series(1, 20000)"],
    "a limited queue at its cap": [
        "INSERT INTO postjob.queue_limits (queue, concurrency) VALUES ('capped', 0)",
        "INSERT INTO postjob.postjobs (workflow, queue, priority, next_run_at) "
        "SELECT 'cost.w', 'capped', 10, now() - interval '2 hours' "
        "FROM generate_series(1, 20000)"],
}
#: The worker serves only its queue in this shape (else every queue).
SERVES_ONE_QUEUE = {"a queue not served"}


@pytest.fixture(scope="module")
def tables(engine: Engine) -> Iterator[Callable[[str], None]]:
    """Fill the jobs of one shape (emptying the table first)."""

    def fill(shape: str) -> None:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE postjob.postjobs, postjob.queue_limits CASCADE"))
            conn.execute(text(DUE))
            for statement in BESIDE[shape]:
                conn.execute(text(statement))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in conn.execute(text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'postjob'")).scalars():
                conn.execute(text(f'VACUUM ANALYZE postjob."{table}"'))

    yield fill


def _blocks(conn: Connection, statement: TextClause, params: dict[str, Any]) -> int:
    """The buffers one statement reads (the statement that counts reads none: catalog only)."""
    before = int(conn.execute(BLOCKS).scalar_one())
    conn.execute(statement, params).all()
    return int(conn.execute(BLOCKS).scalar_one()) - before


def _costs(engine: Engine, shape: str) -> dict[str, int]:
    queues = [Q] if shape in SERVES_ONE_QUEUE else None
    out: dict[str, int] = {}
    for name, statement, limit in (("checkout 1", CHECKOUT, 1), ("checkout 100", CHECKOUT, 100),
                                   ("API checkout 1", CHECKOUT_API, 1),
                                   ("API checkout 100", CHECKOUT_API, 100),
                                   ("idle wait", IDLE, 0)):
        with engine.connect() as conn:
            conn.execute(CHECKOUT, {"w": W, "queues": queues, "limit": 1})  # plans cached
            conn.rollback()
            try:
                out[name] = _blocks(conn, statement, {"w": W, "queues": queues, "limit": limit})
            finally:
                conn.rollback()
    return out


def test_checkout_and_the_idle_wait_cost_the_same_whatever_they_cannot_take(
    engine: Engine, tables: Callable[[str], None]
) -> None:
    costs = {}
    for shape in BESIDE:
        tables(shape)
        costs[shape] = _costs(engine, shape)
    alone = costs["nothing"]
    too_dear = {f"{shape}: {call}": f"{blocks} buffers against {alone[call]}"
                for shape, by_call in costs.items() for call, blocks in by_call.items()
                if blocks > 1.3 * alone[call]}
    assert not too_dear, (too_dear, costs)
