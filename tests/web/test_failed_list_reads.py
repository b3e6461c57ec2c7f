"""The failed list (the dashboard's and ``postjob ps --status failed``) reads the jobs that
carry an error, not every job newer than the page (issue 37 item 8: at 10,000,000 jobs they
walked 173,000 roots newest first, past the live ones, which have none failed)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Connection, Engine, text

from postjob_sa.cli import _query
from postjob_sa.web import job_queries

pytestmark = pytest.mark.both_drivers

#: Buffers this transaction read so far in the postjob schema (tables and indexes).
BLOCKS = text(
    "SELECT COALESCE(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint "
    "FROM pg_class c WHERE c.relnamespace = 'postjob'::regnamespace AND c.relkind IN ('r', 'i')")

#: Settled root jobs with ids from :first to :last: failed ones (with their error), or ok.
SETTLED = text(
    "INSERT INTO postjob.postjobs (id, root_id, full_id, workflow, args, status, results, "
    "error, error_message, queued) "
    "SELECT i, i, i::text, 'app.job', '[]', CAST(:status AS postjob.statuses), "
    "CASE WHEN :status = 'ok' THEN CAST('[null]' AS jsonb) END, "
    "CASE WHEN :status = 'failed' THEN 'ConnectionError' END, "
    "CASE WHEN :status = 'failed' THEN 'refused' END, true "
    "FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) i")


def settle(engine: Engine, status: str, first: int, last: int) -> None:
    with engine.begin() as conn:
        conn.execute(SETTLED, {"status": status, "first": first, "last": last})
        conn.execute(text("ANALYZE postjob.postjobs"))


def buffers(engine: Engine, read: Callable[[Connection], int]) -> tuple[int, int]:
    """(rows, buffers) of one read in a new transaction."""
    with engine.connect() as conn:
        before = int(conn.execute(BLOCKS).scalar_one())
        rows = read(conn)
        after = int(conn.execute(BLOCKS).scalar_one())
        conn.rollback()
    return rows, after - before


def dashboard_failed(conn: Connection) -> int:
    page = job_queries.jobs_page(conn, job_queries.JobFilter(statuses=["failed"]), None, 50)
    assert {r.status for r in page.rows} == {"failed"}
    return len(page.rows)


def ps_failed(conn: Connection) -> int:
    listing = _query.list_jobs(conn, statuses=["failed"], limit=100)
    assert {r["status"] for r in listing.rows} == {"failed"}
    return len(listing.rows)


@pytest.mark.parametrize("read", [dashboard_failed, ps_failed], ids=["dashboard", "ps"])
def test_the_failed_list_reads_no_more_as_newer_jobs_end_ok(
        engine: Engine, clean: None, read: Callable[[Connection], int]) -> None:
    """30 failed jobs, then ok ones: the list reads the same buffers above 2,000 ok jobs as
    above 20,000."""
    settle(engine, "failed", 1, 30)
    settle(engine, "ok", 31, 2_030)
    rows, small = buffers(engine, read)
    settle(engine, "ok", 2_031, 20_030)
    rows_then, large = buffers(engine, read)
    assert rows == rows_then == 30
    assert large <= small + 5, (small, large)
