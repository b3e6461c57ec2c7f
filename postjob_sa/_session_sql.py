"""The statements of the Session-bound API (``JobQueue``, ``AsyncJobQueue``, the operator's
commands, the dashboard's and the CLI's settings), named noun first.

They are ``text()`` constructs run through the caller's Session or Connection, so they join the
caller's transaction. The worker's statements are in ``postjob_sa._sql``. No statement is ever
built from user input: values travel as bound parameters only.

JSON travels as text, cast to jsonb in the statement (``CAST(:args AS text)::jsonb``), never as
a jsonb parameter: a driver that types its parameters (asyncpg) would hand a jsonb one to the
application's own jsonb codec, if it set one, and such a codec expects the application's values,
not our JSON text.
"""

from __future__ import annotations

from sqlalchemy import text

from postjob_sa._sql import HISTORY_ROTATE_SQL

# -- jobs: enqueue, checkout in the caller's transaction, the operator's commands ------------

#: A root job, queued by one call (postjob.enqueue_v1, see postjob_sa/sql/jobs.sql): its id,
#: or NULL when an unfinished job holds the unique key (see JOB_BY_UNIQUE_KEY).
JOB_ENQUEUE = text(
    "SELECT postjob.enqueue_v1(:workflow, CAST(:args AS text)::jsonb, :queue, :max_attempts, "
    ":timeout, :version, CAST(:tags AS text)::jsonb, CAST(:run_at AS timestamptz), :priority, "
    ":unique_key, CAST(:trace_context AS text)::jsonb) AS id"
)

#: Enqueues of children of one parent, one transaction at a time (the record is partitioned:
#: no unique index keeps a parent's children one per workflow and args; a spawn is kept so by
#: the parent's lease).
JOB_CHILDREN_LOCK = text("SELECT pg_advisory_xact_lock(1886023987, hashint8(:parent_id))")

#: A child job (the parent's ids and trace context are the trigger's to fill in), or nothing
#: when the parent has this child already (see JOB_CHILD_BY_KEY) or an unfinished job holds
#: the unique key.
JOB_ENQUEUE_CHILD = text(
    "INSERT INTO postjob.postjobs (workflow, args, queue, max_attempts, timeout, "
    "workflow_version, tags, parent_id, next_run_at, priority, unique_key, trace_context) "
    "SELECT :workflow, CAST(:args AS text)::jsonb, :queue, :max_attempts, :timeout, :version, "
    "CAST(:tags AS text)::jsonb, :parent_id, COALESCE(CAST(:run_at AS timestamptz), now()), "
    ":priority, :unique_key, CAST(:trace_context AS text)::jsonb "
    "WHERE (CAST(:unique_key AS varchar) IS NULL OR NOT EXISTS ("
    "  SELECT 1 FROM postjob.unfinished WHERE unique_key = CAST(:unique_key AS varchar))) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.postjobs e "
    "  WHERE e.parent_id = CAST(:parent_id AS bigint) AND e.id > CAST(:parent_id AS bigint) "
    "  AND e.workflow = CAST(:workflow AS varchar) AND e.workflow_method = 'run' "
    "  AND md5(e.args::text) = md5(CAST(:args AS text)::jsonb::text)) "
    "ON CONFLICT DO NOTHING "
    "RETURNING id, root_id, full_id"
)

#: The unfinished job that holds a unique key.
JOB_BY_UNIQUE_KEY = text(
    "SELECT job_id FROM postjob.unfinished WHERE unique_key = :unique_key"
)

JOB_CHILD_BY_KEY = text(
    "SELECT id FROM postjob.postjobs WHERE parent_id = :parent_id AND id > :parent_id "
    "AND workflow = :workflow "
    "AND workflow_method = 'run' AND md5(args::text) = md5(CAST(:args AS text)::jsonb::text)"
)

#: Root jobs, one per element of :args, queued by the same statement.
JOB_ENQUEUE_MANY = text(
    "WITH n AS (SELECT nextval('postjob.postjobs_id_seq') AS id, a.args, "
    "  COALESCE(CAST(:run_at AS timestamptz), statement_timestamp()) AS run_at, "
    "  statement_timestamp() + CAST(:timeout AS float8) * interval '1 second' AS timing_out_at "
    "  FROM jsonb_array_elements(CAST(:args AS text)::jsonb) AS a(args)), "
    "u AS (INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, queue, "
    "  priority, run_at, due, timing_out_at) "
    "  SELECT n.id, 'ready', :workflow, :version, :queue, :priority, n.run_at, "
    "  n.run_at <= statement_timestamp(), n.timing_out_at FROM n), "
    "j AS (INSERT INTO postjob.postjobs (id, root_id, full_id, queue, workflow, "
    "  workflow_version, args, tags, max_attempts, timeout, timing_out_at, next_run_at, "
    "  priority, trace_context, queued) "
    "  SELECT n.id, n.id, n.id::text, :queue, :workflow, :version, n.args, "
    "  CAST(:tags AS text)::jsonb, :max_attempts, :timeout, n.timing_out_at, n.run_at, :priority, "
    "  CAST(:trace_context AS text)::jsonb, true FROM n RETURNING id), "
    "w AS (SELECT postjob._wake_for(count(*)::integer, CAST(:workflow AS varchar), "
    "  CAST(:version AS varchar), CAST(:queue AS varchar)) FROM j) "
    "SELECT j.id FROM j, w ORDER BY j.id"
)

JOB_EXISTS = text("SELECT status::text FROM postjob.jobs WHERE id = :id")

#: The statuses of these jobs, locked for an operator's change (reset).
#: The jobs to reset, locked: their status, and whether a run of theirs may still execute (the
#: job was ended from outside while it ran, and that run's lease has not ended).
JOBS_STATUS_LOCKED = text(
    "SELECT j.id, CASE WHEN u.lease_token IS NOT NULL AND u.status IN ('ready', 'err', 'sleep') "
    "THEN 'processing' ELSE j.status::text END AS status, "
    "u.lease_token IS NOT NULL AND u.status NOT IN ('ready', 'err', 'sleep') AS run_goes_on "
    "FROM postjob.postjobs j LEFT JOIN postjob.unfinished u ON u.job_id = j.id "
    "WHERE j.id = ANY(CAST(:ids AS bigint[])) ORDER BY j.id"
)

#: The jobs checked out in the caller's transaction, in the order handed out: their ids
#: first (see JobQueue.checkout), then the columns a worker runs them with (RunningJob's). It
#: makes nothing due (a row it made due would stay locked until the caller commits); it takes
#: the jobs whose time has come anyway, and names its holder in their records.
JOB_CHECKOUT = text(
    "SELECT id, lease_token, workflow, workflow_version, args, queue, root_id, full_id, "
    "parent_id, attempt, max_attempts FROM postjob.checkout_v4(CAST(:worker_id AS bigint), "
    "CAST(:identifier AS varchar), CAST(:workflows AS text[]), CAST(:versions AS text[]), "
    "CAST(:queues AS text[]), CAST(:limit AS integer), CAST(:lease AS float8), true, false, "
    "false)"
)

#: Record outcomes (as WORKER_CYCLE takes them): rows for the outcomes not recorded ('lost')
#: and the sleeps woken at once ('woken').
JOB_FINISH = text(
    "SELECT kind, id FROM postjob.finish_v4(CAST(:ok_ids AS bigint[]), "
    "CAST(:ok_tokens AS bigint[]), CAST(:ok_results AS text[])::jsonb[], "
    "CAST(:ok_versions AS text[]), "
    "CAST(:ids AS bigint[]), CAST(:tokens AS bigint[]), CAST(:kinds AS text[]), "
    "CAST(:errors AS text[]), CAST(:messages AS text[]), CAST(:backtraces AS text[])::jsonb[], "
    "CAST(:versions AS text[]), CAST(:awaiting AS bigint[]), CAST(:delays AS float8[]), "
    "CAST(:stopped AS bigint[]), CAST(:stopped_tokens AS bigint[]))"
)

TOKEN_JOB = text(
    "SELECT j.id, j.workflow, j.status::text AS status FROM postjob.tokens t "
    "JOIN postjob.postjobs j ON j.id = t.postjob_id WHERE t.token = CAST(:token AS uuid)"
)

JOB_RESOLVE = text(
    "SELECT postjob.resolve(CAST(:token AS uuid), CAST(:result AS text)::jsonb, "
    "CAST(:error AS varchar), CAST(:message AS varchar))"
)

JOBS_RESET = text("SELECT postjob.reset_jobs(CAST(:ids AS bigint[]))")

#: Why a reset of these jobs was refused: a finished job among them (or among the descendants
#: reset brings back) whose unique key a newer unfinished job holds, with that holder.
JOB_RESET_KEY_HOLDER = text(
    "SELECT j.id, j.unique_key, h.job_id AS holder FROM postjob.postjobs j "
    "JOIN postjob.unfinished h ON h.unique_key = j.unique_key AND h.job_id <> j.id "
    "WHERE j.unique_key IS NOT NULL AND j.status NOT IN ('ready', 'processing', 'sleep', 'err') "
    "AND (j.id = ANY(CAST(:ids AS bigint[])) OR EXISTS (SELECT 1 FROM postjob.postjobs a "
    "WHERE a.id = ANY(CAST(:ids AS bigint[])) AND j.root_id = a.root_id "
    "AND j.full_id LIKE a.full_id || '.%')) "
    "ORDER BY j.id, h.job_id LIMIT 1"
)

#: The ids cancelled: these jobs and their unfinished descendants.
JOBS_CANCEL = text("SELECT postjob.cancel_jobs(CAST(:ids AS bigint[]))")

JOB_FORCE = text("SELECT postjob.force_job(CAST(:id AS bigint))")

JOBS_REAP = text("SELECT postjob.reap_v4()")


# -- events (postjob_sa/sql/durable.sql) -------------------------------------------------------

#: Record an event in the caller's transaction and wake its waiters; the event's id.
EVENT_EMIT = text(
    "SELECT postjob.emit_event_v1(CAST(:key AS varchar), CAST(:payload AS text)::jsonb)")

#: Delete the events emitted more than ``seconds`` ago (``postjob event prune``).
EVENTS_PRUNE = text(
    "WITH gone AS (DELETE FROM postjob.events "
    "WHERE created_at < now() - CAST(:seconds AS float8) * interval '1 second' RETURNING 1) "
    "SELECT count(*) FROM gone"
)


# -- the workers a worker sees (postjob_sa.worker.unknown) -----------------------------------

#: The workflows each live worker has registered (one row per worker).
WORKERS_LIVE = text("SELECT workflows FROM postjob.workers WHERE expires_at > now()")


# -- queue limits and the schedules' list ----------------------------------------------------

#: Set a queue's limits (the rate's record of recent starts is kept).
QUEUE_LIMITS_SET = text(
    "INSERT INTO postjob.queue_limits (queue, concurrency, rate, period) "
    "VALUES (:queue, :concurrency, :rate, :period) "
    "ON CONFLICT (queue) DO UPDATE SET concurrency = EXCLUDED.concurrency, "
    "rate = EXCLUDED.rate, period = EXCLUDED.period, updated_at = now()"
)

QUEUE_LIMITS_DELETE = text("DELETE FROM postjob.queue_limits WHERE queue = :queue")

#: Each limited queue with its jobs running (under the leases of their checkouts) and its
#: starts in the last period.
QUEUE_LIMITS_REPORT = text(
    "SELECT l.queue, l.concurrency, l.rate, l.period, "
    "(SELECT count(*) FROM postjob.unfinished u "
    " WHERE u.queue = l.queue AND u.lease_token IS NOT NULL) AS processing, "
    "(SELECT count(*) FROM postjob.queue_starts s WHERE s.queue = l.queue "
    " AND s.started_at > now() - postjob._period(l.period)) AS started "
    "FROM postjob.queue_limits l ORDER BY l.queue"
)

SCHEDULES_LIST = text(
    "SELECT s.name, s.cron, s.timezone, s.every, s.skip_missed, s.last_tick_at, s.next_tick_at, "
    "s.last_run_at, s.last_job_id, j.status::text AS last_status, s.registered_at "
    "FROM postjob.schedules s LEFT JOIN postjob.postjobs j ON j.id = s.last_job_id "
    "ORDER BY s.name"
)


# -- history (postjob_sa/sql/history.sql) ------------------------------------------------------

HISTORY_SET = text(
    "INSERT INTO postjob.history_settings (id, keep, partition_size, updated_at) "
    "VALUES (true, CAST(:keep AS interval), :partition_size, now()) "
    "ON CONFLICT (id) DO UPDATE SET keep = EXCLUDED.keep, "
    "partition_size = EXCLUDED.partition_size, updated_at = EXCLUDED.updated_at")

HISTORY_SETTINGS = text("SELECT keep, partition_size FROM postjob._history_settings()")

HISTORY_ROTATE = text(HISTORY_ROTATE_SQL)

ISOLATION_LEVEL = text("SELECT current_setting('transaction_isolation')")

HISTORY_STATUS = text(
    "SELECT name, from_id, to_id, jobs, bytes, newest_settle, pinned_by "
    "FROM postjob.history_status()")
