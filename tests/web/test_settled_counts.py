"""The overview's "settled in the last hour": counted per minute as outcomes are recorded
(issue 37 item 8), never by reading the jobs settled in the hour."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from postjob_sa import JobQueue
from postjob_sa._db import Conn
from postjob_sa.web import queries
from postjob_sa.worker.options import WorkerOptions
from postjob_sa.worker.upkeep import Upkeep
from tests.web_data import APPROVERS, flaky, noop, order

pytestmark = pytest.mark.both_drivers

FINAL = ("ok", "failed", "timeout", "cancelled")
#: What the record says settled in the last hour, by queue and status.
RECORD_LAST_HOUR = text(
    "SELECT queue, status::text AS status, count(*) AS jobs FROM postjob.postjobs "
    "WHERE status IN ('ok', 'failed', 'timeout', 'cancelled') "
    "AND updated_at > now() - interval '60 minutes' GROUP BY 1, 2")


def shown(engine: Engine) -> Counter[tuple[str, str]]:
    with queries.reading(engine) as conn:
        rows = queries.throughput(conn)
    assert all(0 <= r.minutes_ago < 60 for r in rows)
    out: Counter[tuple[str, str]] = Counter()
    for r in rows:
        out[(r.queue, r.status)] += int(r.jobs)
    return out


def recorded(engine: Engine) -> Counter[tuple[str, str]]:
    with engine.connect() as conn:
        return Counter({(r.queue, r.status): int(r.jobs) for r in conn.execute(RECORD_LAST_HOUR)})


def test_every_way_a_job_settles_is_counted(engine: Engine, clean: None) -> None:
    """ok (a root, children, a manual step resolved, a job forced), failed, timeout (the
    reaper, and the descendants of a cancelled tree) and cancelled: the overview's counts
    equal what the record says settled in the last hour."""
    APPROVERS.clear()
    with Session(engine) as s:
        q = JobQueue(s, fast_mode=True)
        q.enqueue(noop, 1, queue="plain")
        q.enqueue(flaky, "the mail server", queue="plain")
        tree = q.enqueue(order, 7, queue="trees").id  # children ok, then waits for a person
        doomed = q.enqueue(order, 8, queue="trees").id  # cancelled while it waits
        tomorrow = datetime.now(UTC) + timedelta(days=1)
        late = q.enqueue(noop, 2, queue="late", timeout=3600, run_at=tomorrow).id
        later = q.enqueue(noop, 3, queue="late", run_at=tomorrow).id
        s.commit()
        q.drain()
        assert len(APPROVERS) == 2
        q.resolve(APPROVERS[0], "bob")  # the manual step of the first order: ok
        s.commit()
        q.drain()  # the order ends ok
        q.cancel(doomed)  # the second order and its manual step: cancelled
        s.commit()
        q.force(later)  # due now, then run: ok
        s.commit()
        q.drain()
        s.execute(text("UPDATE postjob.unfinished SET timing_out_at = now() - interval '1 second' "
                       "WHERE job_id = :id"), {"id": late})
        s.execute(text("SELECT postjob.reap_v4()"))  # past its deadline: timeout
        s.commit()
    assert {status for _, status in recorded(engine)} == set(FINAL)
    assert shown(engine) == recorded(engine)
    with engine.connect() as conn:
        statuses = dict(conn.execute(text(
            "SELECT id, status::text FROM postjob.postjobs WHERE id IN (:a, :b)"),
            {"a": tree, "b": doomed}).all())
    assert statuses == {tree: "ok", doomed: "cancelled"}


def overview_buffers(engine: Engine) -> int:
    """The shared buffers the overview's last-hour statement reads (hit or read)."""
    with engine.connect() as conn:
        plan = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                 + str(queries.THROUGHPUT_LAST_HOUR))).scalar_one()
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def settle_many(engine: Engine, n: int) -> None:
    """n finished jobs settled a minute ago, as a worker's batches settle them (checked out
    through the API, recorded by postjob.finish_v4)."""
    with Session(engine) as s:
        q = JobQueue(s)
        q.enqueue_many(noop, [[i] for i in range(n)], queue="bulk")
        s.commit()
        while True:
            jobs = q.checkout(["web.noop"], limit=500)
            if not jobs:
                break
            s.execute(text(
                "SELECT count(*) FROM postjob.finish_v4(CAST(:ids AS bigint[]), "
                "CAST(:tokens AS bigint[]), array_fill(CAST('[null]' AS jsonb), ARRAY[:n]), "
                "array_fill(''::text, ARRAY[:n]), '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', "
                "'{}', '{}', '{}')"),
                {"ids": [j.id for j in jobs], "tokens": [j.lease_token for j in jobs],
                 "n": len(jobs)})
            s.commit()


def test_the_last_hour_reads_no_more_as_more_jobs_settle(engine: Engine, clean: None) -> None:
    """The overview's count of the last hour reads what does not grow with the jobs settled
    in it: the same buffers after 500 jobs and after 5,000."""
    settle_many(engine, 500)
    small = overview_buffers(engine)
    settle_many(engine, 4500)
    large = overview_buffers(engine)
    assert shown(engine)[("bulk", "ok")] == 5000
    assert large <= small + 3, (small, large)


def test_the_upkeep_folds_closed_minutes_and_drops_old_ones_waiting_for_no_row(
        engine: Engine, clean: None) -> None:
    """Closed minutes become one row per queue and status (shard 0), the minutes past two
    hours go, the minute under way is left to its writers, and a row another transaction
    holds is left for the next fold: the fold waits for none, and the hour reads the same."""
    with engine.begin() as conn:
        now = conn.execute(text(
            "SELECT to_timestamp(floor(extract(epoch FROM now()) / 60) * 60)")).scalar_one()
        conn.execute(text(
            "INSERT INTO postjob.settled_counts (minute, queue, status, shard, n) "
            "SELECT CAST(:now AS timestamptz) - m * interval '1 minute', 'a', "
            "CAST(s AS postjob.statuses), shard, n FROM (VALUES (0, 'ok', 101, 1), "
            "(3, 'ok', 101, 2), (3, 'ok', 102, 3), (3, 'failed', 103, 4), (4, 'ok', 104, 5), "
            "(180, 'ok', 0, 6), (180, 'ok', 105, 7)) AS v(m, s, shard, n)"), {"now": now})
    before = shown(engine)
    assert before == Counter({("a", "ok"): 11, ("a", "failed"): 4})
    upkeep = Upkeep(engine, WorkerOptions(identifier="fold-test"))
    holder = engine.connect()
    try:
        holder.execute(text("SELECT 1 FROM postjob.settled_counts WHERE shard = 104 FOR UPDATE"))
        conn = Conn.open(engine, name="fold test")
        try:
            conn.rows("SET lock_timeout = '5s'")  # a fold that waited would fail: left unfolded
            upkeep.look(conn)
        finally:
            conn.close()
    finally:
        holder.rollback()
        holder.close()
    with engine.connect() as c:
        rows = sorted((int(r.ago), r.status, int(r.shard), int(r.n)) for r in c.execute(text(
            "SELECT extract(epoch FROM CAST(:now AS timestamptz) - minute) / 60 AS ago, "
            "status::text AS status, shard, n FROM postjob.settled_counts"), {"now": now}))
    assert rows == [(0, "ok", 101, 1), (3, "failed", 0, 4), (3, "ok", 0, 5), (4, "ok", 104, 5)]
    assert shown(engine) == before
