"""The dashboard's reads (those of jobs: postjob_sa.web.job_queries): named statements (noun
first) and the functions that run them. Values travel as bound parameters only; optional filters are
``(CAST(:x AS …) IS NULL OR …)``, which the planner folds away when the value is NULL.

What serves each statement at 1,000,000 jobs (bench/web.py measures it):

* unfinished jobs (ready, err, sleep, manual steps, running): the narrow
  ``postjob.unfinished`` table, which holds nothing else;
* failed, timed-out and cancelled jobs: ``postjobs_errors_idx`` (each of them has an error),
  in a list of those statuses only, and in the counts, which count the newest
  :data:`ERRORED_COUNT_CAP` of them (newest first by that index), never all of history;
* the throughput of the last hour: the per-minute counts the outcomes keep
  (``postjob.settled_counts``), at most 60 minutes of rows a queue and status, whatever the
  number of jobs settled in it;
* ok jobs are counted up to :data:`OK_COUNT_CAP` and estimated beyond it;
* lists page by id (keyset, newest first) inside a bounded window of ids, so a filter that
  matches nothing still reads at most :data:`LIST_WINDOW` rows per page;
* a tree is its root (primary key) plus ``postjobs_tree_idx``.

* the hot tables' sizes and vacuum history: the catalog and the statistics
  (``postjob_sa._hot_tables``), never the tables;
* schedules and queue limits are small tables of their own, read whole (the same statements
  as ``postjob schedules`` and ``postjob queue list``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from postjob_sa import _hot_tables, _session_sql

#: ok jobs are counted exactly up to this many; beyond it the table's statistics estimate.
OK_COUNT_CAP = 50_000
#: The overview counts the newest this many failed, timed-out and cancelled jobs (exact while
#: there are fewer): what it reads does not grow with history.
ERRORED_COUNT_CAP = 2_000
STATEMENT_TIMEOUT_MS = 10_000
MANUAL = "__manual__"

# -- session ---------------------------------------------------------------------------------

READ_ONLY_BEGIN = text("SET TRANSACTION READ ONLY")
STATEMENT_TIMEOUT_SET = text("SELECT set_config('statement_timeout', :ms, true)")
DB_NOW = text("SELECT now()")

# -- overview --------------------------------------------------------------------------------

#: Jobs per queue and status except ok: the unfinished ones (waiting as ready, err or sleep,
#: or running: their rows hold a lease) from postjob.unfinished, and of the :cap newest jobs
#: that ended badly (postjobs_errors_idx newest first: each of them carries an error), how
#: many per queue and status. The index holds only ids, so counting every such job would read
#: each one's page (113,157 buffers at 10,000,000 jobs, 1 % failed). The fence (OFFSET 0)
#: keeps the status out of the ordered scan, as in JOBS_PAGE_ERRORED: with it inside, the
#: planner may read every errored job of a range and sort them.
QUEUE_STATUS_COUNTS = text(
    "SELECT queue, CASE WHEN lease_token IS NOT NULL THEN 'processing' ELSE status::text END "
    "AS status, count(*) AS jobs, "
    "count(*) FILTER (WHERE lease_token IS NULL AND run_at <= now()) AS due "
    "FROM postjob.unfinished WHERE status IN ('ready', 'err', 'sleep') GROUP BY 1, 2 "
    "UNION ALL "
    "SELECT queue, status::text, count(*), 0 FROM (SELECT e.queue, e.status FROM ("
    "  SELECT r.id, r.queue, r.status FROM postjob.postjobs r WHERE r.error IS NOT NULL "
    "  ORDER BY r.id DESC OFFSET 0) e "
    "WHERE e.status IN ('failed', 'timeout', 'cancelled') ORDER BY e.id DESC LIMIT :cap) b "
    "GROUP BY 1, 2"
)
#: The statuses whose counts QUEUE_STATUS_COUNTS bounds.
ENDED_BADLY = frozenset({"failed", "timeout", "cancelled"})

#: ok jobs, counted up to :cap.
OK_COUNT_CAPPED = text(
    "SELECT count(*) FROM (SELECT 1 FROM postjob.postjobs WHERE status = 'ok' LIMIT :cap) c"
)

#: The planner's row count of the record: its ranges' (kept by VACUUM and ANALYZE; the
#: partitioned table has none of its own).
JOBS_ESTIMATE = text(
    "SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint FROM pg_inherits i "
    "JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = CAST('postjob.postjobs' AS regclass)"
)

#: Settled jobs per minute of the last hour (0 = the current minute), queue and status: the
#: counts the outcomes keep (postjob.settled_counts, a few rows a minute), not the jobs.
THROUGHPUT_LAST_HOUR = text(
    "SELECT floor((extract(epoch FROM now()) - extract(epoch FROM minute)) / 60)::int "
    "AS minutes_ago, queue, status::text AS status, sum(n)::bigint AS jobs "
    "FROM postjob.settled_counts WHERE minute > now() - interval '60 minutes' GROUP BY 1, 2, 3"
)

#: Per queue (of :queues), the job that has been due the longest (postjob.unfinished holds
#: only unfinished jobs, so this reads no finished one). Manual steps wait for a person.
QUEUE_OLDEST_DUE = text(
    "SELECT o.queue, o.id, o.workflow, o.status, o.next_run_at "
    "FROM unnest(CAST(:queues AS text[])) AS q(name) CROSS JOIN LATERAL ("
    "  SELECT w.queue, w.job_id AS id, w.workflow, w.status::text AS status, "
    "  w.run_at AS next_run_at FROM postjob.unfinished w WHERE w.queue = q.name "
    "  AND w.run_at <= now() AND w.workflow <> '__manual__' AND w.lease_token IS NULL "
    "  ORDER BY w.run_at, w.job_id LIMIT 1) o ORDER BY o.queue"
)

#: Manual steps waiting for their token, oldest first.
MANUAL_STEPS_OPEN = text(
    "SELECT j.id, j.root_id, j.args, j.created_at FROM postjob.unfinished w "
    "JOIN postjob.postjobs j ON j.id = w.job_id WHERE w.workflow = '__manual__' "
    "ORDER BY w.job_id LIMIT :limit"
)

MANUAL_STEPS_OPEN_COUNT = text(
    "SELECT count(*) FROM postjob.unfinished WHERE workflow = '__manual__' "
    "AND status IN ('ready', 'err', 'sleep')"
)

#: Worker connections: a worker names its connection "postjob worker host:pid".
WORKERS_CONNECTED = text(
    "SELECT substr(application_name, 16) AS identifier, pid, client_addr::text AS client_addr, "
    "backend_start, state, state_change FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE 'postjob worker %' "
    "ORDER BY 1, pid"
)

#: Registered workers and their heartbeats (what a pooled worker, whose connections the pooler
#: names, is seen by); a row whose heartbeat expired is a worker gone without unregistering.
WORKERS_REGISTERED = text(
    "SELECT identifier, started_at, heartbeat_at, expires_at > now() AS alive, workflows, queues "
    "FROM postjob.workers ORDER BY identifier, id"
)

#: What each worker holds now, by the identifier it checked the jobs out under.
WORKERS_BUSY = text(
    "SELECT COALESCE(u.holder, w.identifier, '?') AS identifier, "
    "count(*) AS jobs, min(u.started_at) AS since, "
    "min(greatest(w.expires_at, u.lease_expires_at)) AS lease_expires_at "
    "FROM postjob.unfinished u LEFT JOIN postjob.workers w ON w.id = u.worker_id "
    "WHERE u.lease_token IS NOT NULL GROUP BY 1 ORDER BY 1"
)

#: Jobs no running worker seems able to run: due for longer than :grace seconds while no
#: job of the same workflow (and version) is running. Grouped, oldest first.
JOBS_STRANDED = text(
    "SELECT s.queue, s.workflow, s.workflow_version, count(*) AS jobs, "
    "min(s.run_at) AS due_since, min(s.job_id) AS example_id FROM postjob.unfinished s "
    "WHERE s.workflow <> '__manual__' AND s.lease_token IS NULL "
    "AND s.run_at <= now() - make_interval(secs => :grace) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.unfinished r "
    "  WHERE r.lease_token IS NOT NULL AND r.workflow = s.workflow "
    "  AND (s.workflow_version = '' OR r.workflow_version = s.workflow_version)) "
    "GROUP BY 1, 2, 3 ORDER BY min(s.run_at) LIMIT :limit"
)

@dataclass
class Row:
    """One result row as attributes (``row.id``), for the templates."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def _rows(conn: Connection, stmt: Any, params: dict[str, Any] | None = None) -> list[Row]:
    return [Row(dict(m)) for m in conn.execute(stmt, params or {}).mappings()]


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction with a statement timeout, rolled back at the end."""
    with engine.connect() as conn:
        conn.execute(READ_ONLY_BEGIN)
        conn.execute(STATEMENT_TIMEOUT_SET, {"ms": str(STATEMENT_TIMEOUT_MS)})
        try:
            yield conn
        finally:
            conn.rollback()


def db_now(conn: Connection) -> datetime:
    value: datetime = conn.execute(DB_NOW).scalar_one()
    return value


# -- overview --------------------------------------------------------------------------------


@dataclass
class OkCount:
    jobs: int
    exact: bool


def queue_status_counts(conn: Connection) -> list[Row]:
    """Per queue and status (ok apart); failed, timed-out and cancelled jobs are the newest
    :data:`ERRORED_COUNT_CAP` of them (see :func:`ended_badly_exact`)."""
    return _rows(conn, QUEUE_STATUS_COUNTS, {"cap": ERRORED_COUNT_CAP})


def ended_badly_exact(counts: list[Row]) -> bool:
    """Whether the counts hold every failed, timed-out and cancelled job (fewer than the cap)."""
    return sum(int(r.jobs) for r in counts if r.status in ENDED_BADLY) < ERRORED_COUNT_CAP


def ok_count(conn: Connection, others: int) -> OkCount:
    """ok jobs: exact up to :data:`OK_COUNT_CAP`, else the table's row estimate less the
    ``others`` (the jobs of every other status)."""
    counted = int(conn.execute(OK_COUNT_CAPPED, {"cap": OK_COUNT_CAP}).scalar_one())
    if counted < OK_COUNT_CAP:
        return OkCount(counted, True)
    estimate = int(conn.execute(JOBS_ESTIMATE).scalar_one() or 0) - others
    return OkCount(max(estimate, counted), False)


def throughput(conn: Connection) -> list[Row]:
    return _rows(conn, THROUGHPUT_LAST_HOUR)


def oldest_due(conn: Connection, queues: list[str]) -> list[Row]:
    return _rows(conn, QUEUE_OLDEST_DUE, {"queues": queues})


def manual_steps(conn: Connection, limit: int = 10) -> tuple[int, list[Row]]:
    count = int(conn.execute(MANUAL_STEPS_OPEN_COUNT).scalar_one())
    return count, _rows(conn, MANUAL_STEPS_OPEN, {"limit": limit})


def workers_connected(conn: Connection) -> list[Row]:
    return _rows(conn, WORKERS_CONNECTED)


def workers_registered(conn: Connection) -> list[Row]:
    return _rows(conn, WORKERS_REGISTERED)


def workers_busy(conn: Connection) -> list[Row]:
    return _rows(conn, WORKERS_BUSY)


def stranded(conn: Connection, grace: float, limit: int = 20) -> list[Row]:
    return _rows(conn, JOBS_STRANDED, {"grace": grace, "limit": limit})


def hot_tables(conn: Connection) -> list[_hot_tables.Relation]:
    return _hot_tables.read(conn)


# -- schedules and limits --------------------------------------------------------------------


def schedules(conn: Connection) -> list[Row]:
    return _rows(conn, _session_sql.SCHEDULES_LIST)


def queue_limits(conn: Connection) -> list[Row]:
    return _rows(conn, _session_sql.QUEUE_LIMITS_REPORT)
