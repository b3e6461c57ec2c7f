"""The overview's counts of failed, timed-out and cancelled jobs per queue read a bounded
number of them, not every job that ever ended badly (issue 37 item 8: at 10,000,000 jobs
they read 113,157 buffers, 2.2-2.7 s)."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import Engine, text
from werkzeug.test import Client

from postjob_sa.web import create_app, queries

pytestmark = pytest.mark.both_drivers

ENDED_BADLY = ("failed", "timeout", "cancelled")

#: Buffers this transaction read so far in the postjob schema (tables and indexes).
BLOCKS = text(
    "SELECT COALESCE(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint "
    "FROM pg_class c WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i')")

#: Root jobs with ids from :first to :last that ended badly, in two queues and the three
#: statuses by turn (each carries its error, as every job that ends so does).
ENDED = text(
    "INSERT INTO postjob.postjobs (id, root_id, full_id, workflow, args, queue, status, "
    "error, error_message, queued) "
    "SELECT i, i, i::text, 'app.job', '[]', CAST(:prefix AS text) || CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, "
    "CAST((ARRAY['failed', 'timeout', 'cancelled'])[1 + i % 3] AS postjob.statuses), "
    "'ConnectionError', 'refused', true "
    "FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) i")

#: The record's newest :n jobs that ended badly, by queue and status.
RECORD_NEWEST = text(
    "SELECT queue, status::text AS status, count(*) AS jobs FROM (SELECT queue, status "
    "FROM postjob.postjobs WHERE status IN ('failed', 'timeout', 'cancelled') "
    "ORDER BY id DESC LIMIT :n) e GROUP BY 1, 2")


def end_badly(engine: Engine, first: int, last: int, prefix: str = "") -> None:
    with engine.begin() as conn:
        conn.execute(ENDED, {"first": first, "last": last, "prefix": prefix})
        conn.execute(text("ANALYZE postjob.postjobs"))


def counted(engine: Engine) -> tuple[Counter[tuple[str, str]], int]:
    """(the overview's counts of the statuses that ended badly, the buffers they read)."""
    with engine.connect() as conn:
        before = int(conn.execute(BLOCKS).scalar_one())
        rows = queries.queue_status_counts(conn)
        after = int(conn.execute(BLOCKS).scalar_one())
        conn.rollback()
    shown = Counter({(r.queue, r.status): int(r.jobs) for r in rows if r.status in ENDED_BADLY})
    return shown, after - before


def record(engine: Engine, newest: int) -> Counter[tuple[str, str]]:
    with engine.connect() as conn:
        return Counter({(r.queue, r.status): int(r.jobs)
                        for r in conn.execute(RECORD_NEWEST, {"n": newest})})


def test_the_counts_read_no_more_as_more_jobs_end_badly(engine: Engine, clean: None) -> None:
    """Past the cap, the counts read the same buffers above 3,000 such jobs as above
    33,000: they count the newest :data:`queries.ERRORED_COUNT_CAP`."""
    cap = getattr(queries, "ERRORED_COUNT_CAP", 2_000)  # main has none: it counts them all
    assert cap < 3_000
    end_badly(engine, 1, 3_000)
    small_counts, small = counted(engine)
    end_badly(engine, 3_001, 33_000, prefix="later-")
    large_counts, large = counted(engine)
    assert large <= small + 10, (small, large)
    assert sum(large_counts.values()) == cap
    assert large_counts == record(engine, cap)
    assert {queue for queue, _ in large_counts} == {"later-even", "later-odd"}  # the newest


def test_below_the_cap_the_counts_are_exact(engine: Engine, clean: None) -> None:
    end_badly(engine, 1, 300)
    shown, _ = counted(engine)
    assert sum(shown.values()) == 300
    assert shown == record(engine, 300)
    page = Client(create_app(engine)).get("/").get_data(as_text=True)
    assert "newest" not in page[page.index('data-fragment="queues"'):
                                page.index('data-fragment="throughput"')]


def test_past_the_cap_the_page_says_what_it_counted(
        engine: Engine, clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "ERRORED_COUNT_CAP", 100)
    end_badly(engine, 1, 300)
    shown, _ = counted(engine)
    assert shown == record(engine, 100)
    page = Client(create_app(engine)).get("/").get_data(as_text=True)
    queues = page[page.index('data-fragment="queues"'):page.index('data-fragment="throughput"')]
    assert "the newest 100 jobs that ended so" in queues


#: Root jobs with ids from :first to :last, one in a hundred failed (with its error), the rest ok.
MIXED = text(
    "INSERT INTO postjob.postjobs (id, root_id, full_id, workflow, args, queue, status, "
    "error, error_message, queued) "
    "SELECT i, i, i::text, 'app.job', '[]', 'mixed', "
    "CAST(CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'ok' END AS postjob.statuses), "
    "CASE WHEN i % 100 = 0 THEN 'ConnectionError' END, CASE WHEN i % 100 = 0 THEN 'refused' END, "
    "true FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) i")


def test_a_newer_range_that_holds_little_does_not_make_them_read_every_one(
        engine: Engine, clean: None) -> None:
    """As after a rotation made the next range (1,000,000 jobs in bench/history.py): the
    planner, given the status inside the ordered scan, read every failed job of the full
    range and sorted them. The counts read the same buffers above 2,400 failed jobs as above
    7,200."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE postjob.postjobs_from_1000000 PARTITION OF "
                          "postjob.postjobs FOR VALUES FROM (1000000) TO (2000000)"))
    try:
        with engine.begin() as conn:
            conn.execute(MIXED, {"first": 1_000_001, "last": 1_000_001})  # ok
            conn.execute(MIXED, {"first": 1, "last": 240_000})
            conn.execute(text("ANALYZE postjob.postjobs"))
        _, small = counted(engine)
        with engine.begin() as conn:
            conn.execute(MIXED, {"first": 240_001, "last": 720_000})
            conn.execute(text("ANALYZE postjob.postjobs"))
        shown, large = counted(engine)
        assert sum(shown.values()) == queries.ERRORED_COUNT_CAP
        assert large <= small + 10, (small, large)
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE postjob.postjobs_from_1000000"))
