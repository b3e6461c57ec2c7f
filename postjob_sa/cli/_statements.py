"""The statements the CLI runs, named noun first. Values travel as bound parameters only:
tag filters are ``tags @> CAST(:tags AS jsonb)``, status filters ``= ANY(CAST(:statuses …))``.
An optional filter is ``(CAST(:x AS …) IS NULL OR …)``: the planner folds the unused branch
away (psycopg2 binds the literal; psycopg 3 binds a parameter, and a custom plan for its value
does the same), so the GIN index still serves a tag filter."""

from __future__ import annotations

from sqlalchemy import text

# Every statement is one literal: nothing is composed with f-strings, % or .format() (a test
# parses the package to hold that). ROOT_JOBS_LIST and JOB_SUBTREES share their column list
# (what ``ps`` shows of a job, plus the database's clock: ages are measured on the server)
# and their filters; keep the two in step. A sleeping job that an event woke is due: the
# view's next_run_at is its row's run_at, since when (the record's still holds the wait's
# timeout).

ROOT_JOBS_LIST = text(
    "SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_version, j.args, j.status::text AS status, "
    "j.next_run_at, "
    "j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message, "
    "j.workflow_status, j.tags, j.processing_client, j.processing_client_identifier, "
    "j.processing_started_at, j.processing_max_duration, j.lease_expires_at, now() AS db_now "
    "FROM postjob.jobs j WHERE j.parent_id IS NULL AND "
    "(CAST(:tags AS jsonb) IS NULL OR j.tags @> CAST(:tags AS jsonb)) "
    "AND (CAST(:statuses AS text[]) IS NULL OR j.status::text = ANY(CAST(:statuses AS text[]))) "
    "ORDER BY j.id DESC LIMIT :limit"
)

#: ROOT_JOBS_LIST when only final statuses that carry an error are asked for (failed,
#: timeout, cancelled): the record's jobs with an error, newest first through
#: postjobs_errors_idx (a final job's status is the record's), filtered as they come, then
#: those jobs from the view. Same columns and filters. The fence (OFFSET 0) keeps the filters
#: out of the ordered scan (the planner would expect a few rows and sort them all).
ROOT_JOBS_LIST_ERRORED = text(
    "SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_version, j.args, j.status::text AS status, "
    "j.next_run_at, "
    "j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message, "
    "j.workflow_status, j.tags, j.processing_client, j.processing_client_identifier, "
    "j.processing_started_at, j.processing_max_duration, j.lease_expires_at, now() AS db_now "
    "FROM (SELECT e.id FROM ("
    "    SELECT r.id, r.status, r.parent_id, r.tags FROM postjob.postjobs r "
    "    WHERE r.error IS NOT NULL ORDER BY r.id DESC OFFSET 0) e "
    "  WHERE e.parent_id IS NULL AND e.status::text = ANY(CAST(:statuses AS text[])) "
    "  AND (CAST(:tags AS jsonb) IS NULL OR e.tags @> CAST(:tags AS jsonb)) "
    "  ORDER BY e.id DESC LIMIT :limit) f "
    "JOIN postjob.jobs j ON j.id = f.id ORDER BY j.id DESC"
)

#: The subtrees under the given jobs (each job and its descendants), filtered. A job by its id,
#: its descendants by the tree index of each range after it (one join with an OR of the two
#: scanned every range of the record: 1.3 s at 10,000,000 jobs).
JOB_SUBTREES = text(
    "SELECT DISTINCT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, "
    "j.workflow, j.workflow_version, j.args, j.status::text AS status, "
    "j.next_run_at, "
    "j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message, "
    "j.workflow_status, j.tags, j.processing_client, j.processing_client_identifier, "
    "j.processing_started_at, j.processing_max_duration, j.lease_expires_at, now() AS db_now "
    "FROM postjob.postjobs a "
    "CROSS JOIN LATERAL (SELECT a.id AS id UNION ALL "
    "  SELECT d.id FROM postjob.postjobs d WHERE d.root_id = a.root_id "
    "  AND d.parent_id IS NOT NULL AND d.id > a.id AND d.full_id LIKE a.full_id || '.%') t "
    "JOIN postjob.jobs j ON j.id = t.id "
    "WHERE a.id = ANY(CAST(:ids AS bigint[])) AND "
    "(CAST(:tags AS jsonb) IS NULL OR j.tags @> CAST(:tags AS jsonb)) "
    "AND (CAST(:statuses AS text[]) IS NULL OR j.status::text = ANY(CAST(:statuses AS text[]))) "
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
    "AND j.status NOT IN ('ok', 'failed', 'timeout', 'cancelled') ORDER BY j.id"
)

#: The cut-off of a prune, on the server's clock, fixed once for all its batches.
#: The database's clock (the schedules' last and next runs are shown relative to it).
DB_NOW = text("SELECT now()")

PRUNE_CUTOFF = text("SELECT now() - make_interval(secs => :seconds)")

# The prunable roots: finished root jobs last changed before the cut-off whose whole tree is
# final. PRUNABLE_COUNT and PRUNE_BATCH spell the same query out; keep the two in step.

PRUNABLE_COUNT = text(
    "SELECT count(DISTINCT v.id), count(j.id) FROM ("
    "SELECT r.id FROM postjob.postjobs r "
    "WHERE r.parent_id IS NULL AND r.updated_at < :cutoff "
    "AND r.status::text = ANY(CAST(:statuses AS text[])) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.postjobs d WHERE d.root_id = r.id "
    "                AND d.status NOT IN ('ok', 'failed', 'timeout', 'cancelled')) "
    ") v JOIN postjob.postjobs j ON j.root_id = v.id"
)

#: One batch of a prune: up to :batch trees (roots locked, SKIP LOCKED; none of whose jobs
#: is held by a run: a run of a job cancelled while it ran may still execute),
#: deleted whole. Returns (roots deleted, jobs deleted).
PRUNE_BATCH = text(
    "WITH victims AS ("
    "SELECT r.id FROM postjob.postjobs r "
    "WHERE r.parent_id IS NULL AND r.updated_at < :cutoff "
    "AND r.status::text = ANY(CAST(:statuses AS text[])) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.postjobs d WHERE d.root_id = r.id "
    "                AND d.status NOT IN ('ok', 'failed', 'timeout', 'cancelled')) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.postjobs d JOIN postjob.unfinished u ON u.job_id = d.id "
    "                WHERE d.root_id = r.id AND u.lease_token IS NOT NULL) "
    "  ORDER BY r.id LIMIT :batch FOR UPDATE OF r SKIP LOCKED), "
    "gone AS (DELETE FROM postjob.postjobs j USING victims v WHERE j.root_id = v.id "
    "         RETURNING j.parent_id) "
    "SELECT count(*) FILTER (WHERE parent_id IS NULL), count(*) FROM gone"
)

# -- least privilege (``postjob db grant ROLE``) ---------------------------------------------

#: Whether a role exists (the name is a bound value here, never SQL text).
ROLE_EXISTS = text("SELECT rolsuper FROM pg_roles WHERE rolname = :name")

#: What a worker and an enqueuing application need, and nothing more: no ownership, no DDL,
#: no TRUNCATE, no REFERENCES or TRIGGER. The server writes each statement: the role name is a
#: bound value that ``format('%I')`` quotes as an identifier (PostgreSQL's quote_ident, the same
#: for either driver). Returns the quoted role, then the statements in the order to run them.
ROLE_GRANTS = text(
    "SELECT format('%I', CAST(:role AS text)) AS role, ARRAY["
    "format('GRANT USAGE ON SCHEMA postjob TO %I', CAST(:role AS text)), "
    "format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE postjob.postjobs, postjob.tokens, "
    "postjob.workers, postjob.queue_limits, postjob.schedules, postjob.unfinished, "
    "postjob.waiting, postjob.leases, postjob.queue_slots, postjob.queue_starts, postjob.steps, "
    "postjob.events, postjob.event_waits, postjob.event_keys, postjob.wakeups, "
    "postjob.history_settings, postjob.history_partitions, postjob.settled_counts TO %I', "
    "CAST(:role AS text)), "
    "format('GRANT SELECT ON TABLE postjob.jobs TO %I', CAST(:role AS text)), "
    "format('GRANT USAGE ON SEQUENCE postjob.postjobs_id_seq, postjob.tokens_id_seq, "
    "postjob.workers_id_seq, postjob.lease_tokens, postjob.events_id_seq TO %I', "
    "CAST(:role AS text)), "
    "format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA postjob TO %I', CAST(:role AS text))"
    "] AS statements"
)
