"""The statements the CLI runs, named noun first. Values travel as bound parameters only:
tag filters are ``tags @> CAST(:tags AS jsonb)``, status filters ``= ANY(CAST(:statuses …))``.
An optional filter is ``(CAST(:x AS …) IS NULL OR …)``: psycopg2 binds the literal, so the
planner folds the unused branch away and the GIN index still serves a tag filter."""

from __future__ import annotations

from sqlalchemy import text

#: What ``ps`` shows of a job, plus the database's clock (ages are measured on the server).
_PS_COLUMNS = (
    "j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_version, j.args, j.status::text AS status, j.next_run_at, "
    "j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message, "
    "j.workflow_status, j.tags, j.processing_client, j.processing_client_identifier, "
    "j.processing_started_at, j.processing_max_duration, j.lease_expires_at, now() AS db_now"
)

_FILTERS = (
    "(CAST(:tags AS jsonb) IS NULL OR j.tags @> CAST(:tags AS jsonb)) "
    "AND (CAST(:statuses AS text[]) IS NULL OR j.status::text = ANY(CAST(:statuses AS text[])))"
)

ROOT_JOBS_LIST = text(
    f"SELECT {_PS_COLUMNS} FROM postjob.postjobs j "  # noqa: S608 - constant fragments
    f"WHERE j.parent_id IS NULL AND {_FILTERS} "
    "ORDER BY j.id DESC LIMIT :limit"
)

#: The subtrees under the given jobs (each job and its descendants), filtered.
JOB_SUBTREES = text(
    f"SELECT DISTINCT {_PS_COLUMNS} FROM postjob.postjobs a "  # noqa: S608 - constant fragments
    "JOIN postjob.postjobs j ON j.root_id = a.root_id "
    "AND (j.id = a.id OR j.full_id LIKE a.full_id || '.%') "
    f"WHERE a.id = ANY(CAST(:ids AS bigint[])) AND {_FILTERS} "
    "ORDER BY j.root_id DESC, j.id LIMIT :limit"
)

JOBS_EXISTING = text("SELECT id FROM postjob.postjobs WHERE id = ANY(CAST(:ids AS bigint[]))")

TOKENS_OF_JOBS = text(
    "SELECT postjob_id, token::text FROM postjob.tokens "
    "WHERE postjob_id = ANY(CAST(:ids AS bigint[]))"
)

#: Tokens of the unfinished manual jobs in one tree.
MANUAL_TOKENS_OF_TREE = text(
    "SELECT j.id, t.token::text FROM postjob.postjobs j "
    "JOIN postjob.tokens t ON t.postjob_id = j.id "
    "WHERE j.root_id = :root_id AND j.workflow = '__manual__' "
    "AND j.status NOT IN ('ok', 'failed', 'timeout') ORDER BY j.id"
)

TOKEN_EXISTS = text("SELECT 1 FROM postjob.tokens WHERE token = CAST(:token AS uuid)")

#: The cut-off of a prune, on the server's clock, fixed once for all its batches.
PRUNE_CUTOFF = text("SELECT now() - make_interval(secs => :seconds)")

#: Finished root jobs last changed before the cut-off whose whole tree is final.
_PRUNABLE_ROOTS = (
    "SELECT r.id FROM postjob.postjobs r "
    "WHERE r.parent_id IS NULL AND r.updated_at < :cutoff "
    "AND r.status::text = ANY(CAST(:statuses AS text[])) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.postjobs d WHERE d.root_id = r.id "
    "                AND d.status NOT IN ('ok', 'failed', 'timeout'))"
)

PRUNABLE_COUNT = text(
    "SELECT count(DISTINCT v.id), count(j.id) "  # noqa: S608 - constant fragments
    f"FROM ({_PRUNABLE_ROOTS}) v JOIN postjob.postjobs j ON j.root_id = v.id"
)

#: One batch of a prune: up to :batch trees (roots locked, SKIP LOCKED), deleted whole.
#: Returns (roots deleted, jobs deleted).
PRUNE_BATCH = text(
    f"WITH victims AS ({_PRUNABLE_ROOTS} "  # noqa: S608 - constant fragments
    "  ORDER BY r.id LIMIT :batch FOR UPDATE OF r SKIP LOCKED), "
    "gone AS (DELETE FROM postjob.postjobs j USING victims v WHERE j.root_id = v.id "
    "         RETURNING j.parent_id) "
    "SELECT count(*) FILTER (WHERE parent_id IS NULL), count(*) FROM gone"
)
