"""The dashboard's reads of jobs: the lists (filters, keyset pages inside a bounded window of
ids), one job, and a tree. Named statements (noun first), values as bound parameters only;
rows come back as :class:`postjob_sa.web.queries.Row`, in the read-only transaction
``queries.reading`` opens. What serves each read is in ``queries``' docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from postjob_sa._schema_base import errored_only
from postjob_sa.web.queries import Row, _rows

#: A list page reads at most this many ids below its cursor before it stops looking.
LIST_WINDOW = 100_000
#: At most this many jobs of one tree are shown.
TREE_LIMIT = 2_000

# -- jobs list -------------------------------------------------------------------------------

#: One page of jobs, newest first, below the cursor :before and at or above :floor; the
#: start of each job's args, or (:whole) all of them, for the dashboard's redact to see.
JOBS_PAGE = text(
    "SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_version, j.status::text AS status, j.next_run_at, "
    "j.failed_attempts, j.max_attempts, j.error, j.error_message, j.workflow_status, j.tags, "
    "CASE WHEN :whole THEN j.args::text ELSE left(j.args::text, 160) END AS args_text "
    "FROM postjob.jobs j "
    "WHERE j.id < :before AND j.id >= :floor "
    "AND (CAST(:statuses AS postjob.statuses[]) IS NULL "
    "     OR j.status = ANY(CAST(:statuses AS postjob.statuses[]))) "
    "AND (CAST(:queue AS text) IS NULL OR j.queue = CAST(:queue AS text)) "
    "AND (CAST(:workflow AS text) IS NULL OR j.workflow = CAST(:workflow AS text)) "
    "AND (CAST(:tags AS jsonb) IS NULL OR j.tags @> CAST(:tags AS jsonb)) "
    "ORDER BY j.id DESC LIMIT :limit"
)

#: The same page when only final statuses that carry an error are asked for (failed, timeout,
#: cancelled): the record's jobs with an error, newest first through postjobs_errors_idx (a
#: final job's status is the record's), filtered as they come until the page is full, then
#: those jobs from the view: a page reads the jobs with an error above it, not every job.
#: The fence (OFFSET 0) keeps the filters out of the ordered scan: the planner, taking the
#: error and the status for independent, expects a few rows and would sort them all.
JOBS_PAGE_ERRORED = text(
    "SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_version, j.status::text AS status, j.next_run_at, "
    "j.failed_attempts, j.max_attempts, j.error, j.error_message, j.workflow_status, j.tags, "
    "left(j.args::text, 160) AS args_text FROM ("
    "  SELECT e.id FROM ("
    "    SELECT r.id, r.status, r.queue, r.workflow, r.tags FROM postjob.postjobs r "
    "    WHERE r.error IS NOT NULL AND r.id < :before AND r.id >= :floor "
    "    ORDER BY r.id DESC OFFSET 0) e "
    "  WHERE e.status = ANY(CAST(:statuses AS postjob.statuses[])) "
    "  AND (CAST(:queue AS text) IS NULL OR e.queue = CAST(:queue AS text)) "
    "  AND (CAST(:workflow AS text) IS NULL OR e.workflow = CAST(:workflow AS text)) "
    "  AND (CAST(:tags AS jsonb) IS NULL OR e.tags @> CAST(:tags AS jsonb)) "
    "  ORDER BY e.id DESC LIMIT :limit) f "
    "JOIN postjob.jobs j ON j.id = f.id ORDER BY j.id DESC"
)

JOB_ID_RANGE = text("SELECT min(id), max(id) FROM postjob.postjobs")

#: The first job at or after an id (a step of the search for the id created at a time).
JOB_AT_OR_AFTER = text(
    "SELECT id, created_at FROM postjob.postjobs WHERE id >= :id ORDER BY id LIMIT 1"
)

# -- one job ---------------------------------------------------------------------------------

JOB_BY_ID = text(
    "SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_method, j.workflow_version, j.args, j.status::text AS status, "
    "j.next_run_at, j.timeout, j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, "
    "j.error, j.error_message, j.error_backtrace, j.workflow_status, j.tags, j.awaiting_id, "
    "j.processing_client, j.processing_client_identifier, j.processing_started_at, "
    "j.processing_max_duration, j.lease_expires_at, j.lease_token, t.token::text AS token "
    "FROM postjob.jobs j LEFT JOIN postjob.tokens t ON t.postjob_id = j.id WHERE j.id = :id"
)

#: A whole tree: the root by its primary key, its descendants by postjobs_tree_idx (args and
#: results whole with :whole, as in JOBS_PAGE).
JOB_TREE = text(
    "SELECT j.id, j.parent_id, j.full_id, j.queue, j.workflow, j.workflow_version, "
    "j.status::text AS status, "
    "CASE WHEN :whole THEN j.args::text ELSE left(j.args::text, 200) END AS args_text, "
    "CASE WHEN :whole THEN j.results::text ELSE left(j.results::text, 200) END AS results_text, "
    "j.error, j.error_message, j.awaiting_id, "
    "j.workflow_status, j.next_run_at, j.failed_attempts, j.max_attempts, j.updated_at, "
    "t.token::text AS token FROM postjob.jobs j "
    "LEFT JOIN postjob.tokens t ON t.postjob_id = j.id "
    "WHERE j.id = :root OR (j.root_id = :root AND j.parent_id IS NOT NULL) "
    "ORDER BY j.id LIMIT :limit"
)


# -- jobs list -------------------------------------------------------------------------------


@dataclass
class JobFilter:
    """The list's filters; None means any."""

    statuses: list[str] | None = None
    queue: str | None = None
    workflow: str | None = None
    tags_json: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass
class Page:
    rows: list[Row]
    before: int  # the cursor this page was read below
    floor: int  # the lowest id this page looked at
    next_before: int | None  # the cursor of the next (older) page, None at the end
    full: bool  # the page holds as many rows as asked


def first_id_created_at_or_after(conn: Connection, when: datetime) -> int | None:
    """The first id whose job was created at or after ``when``, by bisecting the primary
    key (ids are handed out in creation order); None when every job is older."""
    low, high = conn.execute(JOB_ID_RANGE).one()
    if low is None:
        return None
    lo, hi = int(low), int(high) + 1
    while lo < hi:  # find the smallest x whose first job at or after x is new enough
        mid = (lo + hi) // 2
        row = conn.execute(JOB_AT_OR_AFTER, {"id": mid}).first()
        if row is None or row.created_at >= when:
            hi = mid
        else:
            lo = mid + 1
    row = conn.execute(JOB_AT_OR_AFTER, {"id": lo}).first()
    return None if row is None else int(row.id)


def _bounds(conn: Connection, flt: JobFilter, before: int | None) -> tuple[int, int]:
    """The id range [floor, before) the filter's age allows below the cursor."""
    top = int(conn.execute(JOB_ID_RANGE).one()[1] or 0) + 1
    upper = top if before is None else min(before, top)
    floor = 0
    if flt.created_before is not None:
        cut = first_id_created_at_or_after(conn, flt.created_before)
        if cut is not None:
            upper = min(upper, cut)
    if flt.created_after is not None:
        cut = first_id_created_at_or_after(conn, flt.created_after)
        floor = upper if cut is None else cut
    return floor, upper


def _windowed(flt: JobFilter) -> bool:
    """Whether a page must stop after :data:`LIST_WINDOW` ids. Filters on statuses other
    than ok are served by partial indexes; everything else walks the primary key."""
    narrowed = flt.statuses or flt.queue or flt.workflow or flt.tags_json
    indexed = flt.statuses is not None and "ok" not in flt.statuses
    return bool(narrowed) and not indexed


def jobs_page(conn: Connection, flt: JobFilter, before: int | None, limit: int,
              whole: bool = False) -> Page:
    """A page of jobs below the cursor ``before`` (newest first); ``whole``: all of the args."""
    floor, upper = _bounds(conn, flt, before)
    if _windowed(flt):
        floor = max(floor, upper - LIST_WINDOW)
    rows = _rows(
        conn,
        JOBS_PAGE_ERRORED if errored_only(flt.statuses) else JOBS_PAGE,
        {
            "before": upper, "floor": floor, "statuses": flt.statuses, "queue": flt.queue,
            "workflow": flt.workflow, "tags": flt.tags_json, "limit": limit, "whole": whole,
        },
    )
    full = len(rows) == limit
    if full:
        next_before: int | None = int(rows[-1].id)
    else:
        low = conn.execute(JOB_ID_RANGE).one()[0]
        next_before = floor if low is not None and floor > int(low) else None
    return Page(rows, upper, floor, next_before, full)


# -- one job ---------------------------------------------------------------------------------


def job(conn: Connection, job_id: int) -> Row | None:
    rows = _rows(conn, JOB_BY_ID, {"id": job_id})
    return rows[0] if rows else None


def tree(conn: Connection, root_id: int, whole: bool = False) -> list[Row]:
    return _rows(conn, JOB_TREE, {"root": root_id, "limit": TREE_LIMIT + 1, "whole": whole})
