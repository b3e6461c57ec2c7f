"""Every statement postjob_sa runs at runtime, named noun first.

The worker's statements (plain strings) run on its own autocommit connections through
:class:`postjob_sa._db.Conn`; their ``%(name)s`` placeholders suit both psycopg drivers, and every
parameter is cast, so psycopg 3's server-side binding never has to guess a type. The others are
``text()`` constructs run through the caller's Session or Connection. No statement is ever built
from user input: values travel as bound parameters only.
"""

from __future__ import annotations

from sqlalchemy import text

# -- the worker ----------------------------------------------------------------------------------

WORKER_REGISTER = (
    "SELECT postjob.register_worker(%(identifier)s::varchar, %(lease)s::float8, "
    "%(revision)s::varchar, %(workflows)s::text[], %(queues)s::text[])"
)

#: A stopping worker's last word: the leases of the runs it ended since its last cycle end
#: with it (left, they would outlive the runs until they expired, and reset would skip those
#: jobs as maybe still running).
WORKER_UNREGISTER = (
    "WITH ended AS (DELETE FROM postjob.leases l WHERE l.token = ANY(%(done)s::bigint[])) "
    "SELECT postjob.unregister_worker(%(worker_id)s::bigint)"
)

#: The held jobs that are no longer this worker's; NULL when the worker's row is gone.
WORKER_HEARTBEAT = (
    "SELECT postjob.worker_heartbeat(%(worker_id)s::bigint, %(lease)s::float8, "
    "%(ids)s::bigint[], %(leases)s::bigint[])"
)

#: Record outcomes (the ok ones as arrays, the others as one JSON array: see
#: postjob_sa/sql/outcomes.sql), release the leases whose jobs have all ended, reap and make
#: due what has come due when asked, and check out the next jobs (rows of kind 'job', the
#: columns of RunningJob after the kind): the whole cycle in one round trip. Rows of kind
#: 'lost' name outcomes not recorded, 'woken' sleeps whose child had ended. The arrays come as
#: text literals (see postjob_sa.worker.executor: cheaper to build than adapted lists).
WORKER_CYCLE = (
    "SELECT kind, id, lease_token, workflow, workflow_version, args, queue, root_id, full_id, "
    "parent_id, attempt, max_attempts FROM postjob.worker_cycle_v3(%(worker_id)s::bigint, "
    "%(identifier)s::varchar, %(ok_ids)s::bigint[], %(ok_tokens)s::bigint[], "
    "%(ok_results)s::jsonb[], %(ok_versions)s::text[], %(outcomes)s::jsonb, "
    "%(done)s::bigint[], %(workflows)s::text[], %(versions)s::text[], %(queues)s::text[], "
    "%(limit)s::integer, %(lease)s::float8, %(reap)s::boolean, %(promote)s::boolean)"
)

#: The jobs a reap now would rescue: held under an expired lease whose worker is gone (as
#: reap_v3 picks them), with who held them and when the lease ended (worker/rescues.py).
JOBS_OF_GONE_WORKERS = (
    "SELECT j.id, j.workflow, j.lease_token, j.failed_attempts, l.expires_at, "
    "COALESCE(j.processing_client_identifier, j.processing_client) AS holder "
    "FROM postjob.leases l CROSS JOIN LATERAL unnest(l.job_ids) AS h(id) "
    "JOIN postjob.postjobs j ON j.id = h.id AND j.lease_token = l.token "
    "WHERE l.expires_at <= statement_timestamp() AND NOT EXISTS ("
    "SELECT 1 FROM postjob.workers w WHERE w.id = l.worker_id "
    "AND w.expires_at > statement_timestamp()) ORDER BY j.id LIMIT 1000"
)
#: Of those, the ones a reap rescued: no longer under that lease, with the attempt it cost
#: counted (the same statement may have checked a retried one out again already).
JOBS_RESCUED = (
    "SELECT j.id, j.status::text AS status, j.failed_attempts, j.max_attempts "
    "FROM postjob.postjobs j JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[], "
    "%(attempts)s::integer[]) AS h(id, token, attempts) ON j.id = h.id "
    "WHERE j.lease_token IS DISTINCT FROM h.token AND j.failed_attempts > h.attempts "
    "ORDER BY j.id"
)

#: Before an idle wait: reap now and then, make due what has come due, and the seconds until
#: there may be work (0 or less: now; NULL: nothing in sight).
WORKER_IDLE = (
    "SELECT postjob.worker_idle(%(workflows)s::text[], %(versions)s::text[], "
    "%(queues)s::text[], %(reap)s::boolean)"
)

#: Make due the waiting jobs of these workflows whose time has come (a transactional worker,
#: on its own connection, before the transaction of its next job).
WORKER_PROMOTE = "SELECT postjob._promote(%(workflows)s::text[], %(versions)s::text[])"

#: Why these runs lost their jobs: the jobs' statuses now.
JOBS_STATUS_NOW = (
    "SELECT id, status::text FROM postjob.postjobs WHERE id = ANY(%(ids)s::bigint[])"
)

WORKER_LISTEN = "LISTEN postjob_notifications"
#: The probe for a pooler in transaction mode (worker/pooler.py): a channel nobody notifies.
POOLER_PROBE_LISTEN = "LISTEN postjob_pooler_probe"
POOLER_PROBE_LISTENING = "SELECT 'postjob_pooler_probe' = ANY(ARRAY(SELECT pg_listening_channels()))"
POOLER_PROBE_UNLISTEN = "UNLISTEN postjob_pooler_probe"

#: How a worker's connections show in pg_stat_activity: "postjob worker host:pid".
WORKER_NAME_SET = "SELECT set_config('application_name', %(name)s::text, false)"

# -- the running job's context (the worker's connection, or the transactional job's) ----------

#: Insert the children spawned by a run and return every child of the job; fenced on the lease.
CHILDREN_SPAWN = (
    "SELECT id, workflow, args, status, results, error, error_message "
    "FROM postjob.spawn_children(%(parent_id)s::bigint, %(lease_token)s::bigint, "
    "%(queues)s::text[], %(workflows)s::text[], %(args)s::jsonb[], %(max_attempts)s::integer[], "
    "%(timeouts)s::float8[])"
)

CHILD_BY_KEY = (
    "SELECT id, workflow, args, status::text AS status, results, error, error_message "
    "FROM postjob.postjobs WHERE parent_id = %(parent_id)s::bigint "
    "AND workflow = %(workflow)s::varchar AND workflow_method = 'run' AND args = %(args)s::jsonb"
)

MANUAL_TOKEN = "SELECT postjob.manual_token(%(job_id)s::bigint)::text AS token"

#: False when the run no longer holds the job's lease.
WORKFLOW_STATUS_SET = (
    "SELECT postjob.set_workflow_status(%(job_id)s::bigint, %(lease_token)s::bigint, "
    "%(status)s::varchar) AS accepted"
)

# -- durable workflows (postjob_sa.durable; postjob_sa/sql/durable.sql) ------------------------

#: Every step of a job (its runs' steps, sleeps and event waits), with the seconds until each
#: sleep's wake time: a run loads them once.
STEPS_LOAD = (
    "SELECT kind, name, digest, result, error, error_message, "
    "EXTRACT(EPOCH FROM wake_at - statement_timestamp())::float8 AS wake_in "
    "FROM postjob.steps WHERE job_id = %(job_id)s::bigint"
)

#: Record a step of a running job (kept as it is when recorded already); the step as stored.
#: Fenced on the lease.
STEP_RECORD = (
    "SELECT result, error, error_message, wake_in FROM postjob.record_step_v1("
    "%(job_id)s::bigint, %(lease_token)s::bigint, %(kind)s::varchar, %(name)s::varchar, "
    "%(digest)s::varchar, %(result)s::jsonb, %(error)s::varchar, %(message)s::varchar, "
    "%(wake_in)s::float8, %(wake_at)s::timestamptz)"
)

#: The seq-th wait of a running job for an event: 'event' (its payload), 'timeout', or 'wait'
#: (recorded; the seconds left until its deadline). Fenced on the lease.
EVENT_WAIT = (
    "SELECT state, payload, wake_in FROM postjob.wait_event_v1(%(job_id)s::bigint, "
    "%(lease_token)s::bigint, %(seq)s::integer, %(key)s::varchar, %(timeout)s::float8)"
)

#: Record an event in the caller's transaction and wake its waiters; the event's id.
EVENT_EMIT = text("SELECT postjob.emit_event_v1(CAST(:key AS varchar), CAST(:payload AS jsonb))")

#: Delete the events emitted more than ``seconds`` ago (``postjob event prune``).
EVENTS_PRUNE = text(
    "WITH gone AS (DELETE FROM postjob.events "
    "WHERE created_at < now() - CAST(:seconds AS float8) * interval '1 second' RETURNING 1) "
    "SELECT count(*) FROM gone"
)

#: The trace context a job was enqueued with (read when a tracer provider is set).
JOB_TRACE_CONTEXT = (
    "SELECT trace_context FROM postjob.postjobs WHERE id = %(job_id)s::bigint"
)
#: A job's trace context, stored by a run (its first, when the job had none; or the run that
#: is about to spawn, so that the children inherit its context: see postjob_sa._tracing).
JOB_TRACE_CONTEXT_SET = (
    "UPDATE postjob.postjobs SET trace_context = %(trace_context)s::jsonb "
    "WHERE id = %(job_id)s::bigint"
)

# -- schema checks (the worker, the CLI and migrate) --------------------------------------------

SCHEMA_EXISTS = (
    "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = 'postjob' AND p.proname = 'schema_version'"
)
SCHEMA_REVISION = "SELECT postjob.schema_version()"
SCHEMA_OLDEST_SERVED_EXISTS = (
    "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = 'postjob' AND p.proname = 'oldest_served_code'"
)
SCHEMA_OLDEST_SERVED = "SELECT postjob.oldest_served_code()"
#: How many jobs are unfinished: what dropping the schema would lose (the guard of a host's
#: downgrade, postjob_sa.migrations). The one place that says which jobs those are.
JOBS_UNFINISHED_COUNT = (
    "SELECT count(*) FROM postjob.postjobs WHERE status IN ('ready','processing','sleep','err')"
)

# -- the Session-bound API -------------------------------------------------------------------

#: A job, or nothing when an unfinished job holds the unique key, or the parent has this child
#: already (see JOB_BY_UNIQUE_KEY and JOB_CHILD_BY_KEY): ON CONFLICT, so a concurrent enqueue
#: of the same key waits for the other transaction instead of failing, and the caller's
#: transaction stays usable.
JOB_ENQUEUE = text(
    "INSERT INTO postjob.postjobs (workflow, args, queue, max_attempts, timeout, "
    "workflow_version, tags, parent_id, next_run_at, priority, unique_key, trace_context) "
    "VALUES (:workflow, CAST(:args AS jsonb), :queue, :max_attempts, :timeout, :version, "
    "CAST(:tags AS jsonb), :parent_id, COALESCE(CAST(:run_at AS timestamptz), now()), "
    ":priority, :unique_key, CAST(:trace_context AS jsonb)) "
    "ON CONFLICT DO NOTHING "
    "RETURNING id, root_id, full_id"
)

#: The unfinished job that holds a unique key.
JOB_BY_UNIQUE_KEY = text(
    "SELECT id FROM postjob.postjobs WHERE unique_key = :unique_key AND unique_key_held"
)

JOB_CHILD_BY_KEY = text(
    "SELECT id FROM postjob.postjobs WHERE parent_id = :parent_id AND workflow = :workflow "
    "AND workflow_method = 'run' AND md5(args::text) = md5(CAST(:args AS jsonb)::text)"
)

JOB_ENQUEUE_MANY = text(
    "INSERT INTO postjob.postjobs (id, root_id, full_id, queue, workflow, workflow_version, "
    "args, tags, max_attempts, timeout, next_run_at, priority, trace_context) "
    "SELECT n.id, n.id, n.id::text, :queue, :workflow, :version, n.args, "
    "CAST(:tags AS jsonb), :max_attempts, :timeout, COALESCE(CAST(:run_at AS timestamptz), now()), "
    ":priority, CAST(:trace_context AS jsonb) "
    "FROM (SELECT nextval('postjob.postjobs_id_seq') AS id, a.args, a.ord "
    "      FROM jsonb_array_elements(CAST(:args AS jsonb)) WITH ORDINALITY AS a(args, ord)) n "
    "ORDER BY n.ord RETURNING id"
)

JOB_EXISTS = text("SELECT status::text FROM postjob.postjobs WHERE id = :id")

#: The statuses of these jobs, locked for an operator's change (reset).
#: The jobs to reset, locked: their status, and whether a run of theirs may still execute (the
#: job was ended from outside while it ran, and that run's lease has not ended).
JOBS_STATUS_LOCKED = text(
    "SELECT id, status::text AS status, postjob._run_may_be_executing(id) AS run_goes_on "
    "FROM postjob.postjobs WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id FOR UPDATE"
)

#: The jobs checked out, in the order handed out: their ids first (see JobQueue.checkout),
#: then the columns a worker runs them with (RunningJob's). ``promote``: make due first what
#: has come due (not inside a transactional job's transaction: see postjob._promote).
JOB_CHECKOUT = text(
    "SELECT id, lease_token, workflow, workflow_version, args, queue, root_id, full_id, "
    "parent_id, attempt, max_attempts FROM postjob.checkout_v3(CAST(:worker_id AS bigint), "
    "CAST(:identifier AS varchar), CAST(:workflows AS text[]), CAST(:versions AS text[]), "
    "CAST(:queues AS text[]), CAST(:limit AS integer), CAST(:lease AS float8), "
    "CAST(:promote AS boolean))"
)

#: Record outcomes (as WORKER_CYCLE takes them) and release the leases ``done``: rows for
#: the outcomes not recorded ('lost') and the sleeps woken at once ('woken').
JOB_FINISH = text(
    "SELECT kind, id FROM postjob.finish_jobs_v3(CAST(:ok_ids AS bigint[]), "
    "CAST(:ok_tokens AS bigint[]), CAST(:ok_results AS jsonb[]), CAST(:ok_versions AS text[]), "
    "CAST(:outcomes AS jsonb), CAST(:done AS bigint[]))"
)

#: After outcomes recorded through the API: the leases none of whose jobs runs under them any
#: more end.
LEASES_END = text(
    "DELETE FROM postjob.leases l WHERE l.token = ANY(CAST(:tokens AS bigint[])) "
    "AND NOT EXISTS (SELECT 1 FROM postjob.postjobs j "
    "WHERE j.id = ANY(l.job_ids) AND j.lease_token = l.token)"
)

TOKEN_JOB = text(
    "SELECT j.id, j.workflow, j.status::text AS status FROM postjob.tokens t "
    "JOIN postjob.postjobs j ON j.id = t.postjob_id WHERE t.token = CAST(:token AS uuid)"
)

JOB_RESOLVE = text(
    "SELECT postjob.resolve(CAST(:token AS uuid), CAST(:result AS jsonb), "
    "CAST(:error AS varchar), CAST(:message AS varchar))"
)

JOBS_RESET = text("SELECT postjob.reset_jobs(CAST(:ids AS bigint[]))")

#: Why a reset of these jobs was refused: a finished job among them (or among the descendants
#: reset brings back) whose unique key a newer unfinished job holds, with that holder.
JOB_RESET_KEY_HOLDER = text(
    "SELECT j.id, j.unique_key, h.id AS holder FROM postjob.postjobs j "
    "JOIN postjob.postjobs h ON h.unique_key = j.unique_key AND h.id <> j.id "
    "AND h.status IN ('ready', 'processing', 'sleep', 'err') "
    "WHERE j.unique_key IS NOT NULL AND j.status NOT IN ('ready', 'processing', 'sleep', 'err') "
    "AND (j.id = ANY(CAST(:ids AS bigint[])) OR EXISTS (SELECT 1 FROM postjob.postjobs a "
    "WHERE a.id = ANY(CAST(:ids AS bigint[])) AND j.root_id = a.root_id "
    "AND j.full_id LIKE a.full_id || '.%')) "
    "ORDER BY j.id, h.id LIMIT 1"
)

#: The ids cancelled: these jobs and their unfinished descendants.
JOBS_CANCEL = text("SELECT postjob.cancel_jobs(CAST(:ids AS bigint[]))")

JOB_FORCE = text("SELECT postjob.force_job(CAST(:id AS bigint))")

JOBS_REAP = text("SELECT postjob.reap_v2()")

# -- jobs no running worker knows (postjob_sa.worker.unknown) --------------------------------

#: The workflows of due jobs that no live worker has registered, with how many jobs are due for
#: each, most first: due ones, and the ones whose time has come that no worker made due yet.
#: The distinct workflows are found by loose scans of the waiting jobs' two indexes (one probe
#: per workflow, however many jobs wait), so the cost grows with the number of workflows and of
#: the jobs no worker knows, never with the jobs. Manual steps wait for a person, not a
#: worker: they are neither due nor timed, so never counted.
WORKFLOWS_UNKNOWN = (
    "WITH RECURSIVE due(workflow) AS ("
    "  SELECT min(workflow) FROM postjob.waiting WHERE due "
    "  UNION ALL "
    "  SELECT (SELECT min(w.workflow) FROM postjob.waiting w WHERE w.due AND w.workflow > d.workflow) "
    "  FROM due d WHERE d.workflow IS NOT NULL), "
    "timed(workflow) AS ("
    "  SELECT min(workflow) FROM postjob.waiting WHERE NOT due AND run_at IS NOT NULL "
    "  UNION ALL "
    "  SELECT (SELECT min(w.workflow) FROM postjob.waiting w "
    "          WHERE NOT w.due AND w.run_at IS NOT NULL AND w.workflow > t.workflow) "
    "  FROM timed t WHERE t.workflow IS NOT NULL), "
    "names AS (SELECT workflow FROM due UNION SELECT workflow FROM timed) "
    "SELECT u.workflow, u.jobs FROM ("
    "  SELECT n.workflow, (SELECT count(*) FROM postjob.waiting w "
    "     WHERE w.workflow = n.workflow AND w.due) "
    "   + (SELECT count(*) FROM postjob.waiting w "
    "     WHERE w.workflow = n.workflow AND NOT w.due AND w.run_at IS NOT NULL "
    "     AND w.run_at <= now()) AS jobs "
    "  FROM names n WHERE n.workflow IS NOT NULL "
    "  AND NOT EXISTS (SELECT 1 FROM postjob.workers w "
    "                  WHERE w.expires_at > now() AND n.workflow = ANY (w.workflows))) u "
    "WHERE u.jobs > 0 ORDER BY u.jobs DESC, u.workflow"
)

#: The workflows each live worker has registered (one row per worker).
WORKERS_LIVE = text("SELECT workflows FROM postjob.workers WHERE expires_at > now()")

# -- queue limits and schedules --------------------------------------------------------------

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
    "(SELECT count(*) FROM postjob.leases le CROSS JOIN unnest(le.job_ids) AS h(id) "
    " JOIN postjob.postjobs j ON j.id = h.id AND j.lease_token = le.token "
    " WHERE j.queue = l.queue) AS processing, "
    "(SELECT count(*) FROM postjob.queue_starts s WHERE s.queue = l.queue "
    " AND s.started_at > now() - postjob._period(l.period)) AS started "
    "FROM postjob.queue_limits l ORDER BY l.queue"
)

#: Why a run's fenced write was refused: the job's status now (cancelled, or anything else).
JOB_STATUS = "SELECT status::text FROM postjob.postjobs WHERE id = %(job_id)s::bigint"

#: Register a schedule (a changed definition starts again from the next tick).
SCHEDULE_REGISTER = (
    "INSERT INTO postjob.schedules (name, cron, timezone, every, skip_missed, next_tick_at, "
    "last_tick_at) "
    "VALUES (%(name)s::varchar, %(cron)s::varchar, %(timezone)s::varchar, %(every)s::float8, "
    "%(skip_missed)s::boolean, %(next_tick)s::timestamptz, %(now)s::timestamptz) "
    "ON CONFLICT (name) DO UPDATE SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, "
    "every = EXCLUDED.every, skip_missed = EXCLUDED.skip_missed, "
    "next_tick_at = CASE WHEN (schedules.cron, schedules.timezone, schedules.every) "
    "  IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.every) "
    "  THEN schedules.next_tick_at ELSE EXCLUDED.next_tick_at END, "
    "last_tick_at = CASE WHEN (schedules.cron, schedules.timezone, schedules.every) "
    "  IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.every) "
    "  THEN schedules.last_tick_at ELSE EXCLUDED.last_tick_at END, "
    "registered_at = statement_timestamp() "
    "RETURNING last_tick_at, statement_timestamp() AS now"
)

DB_TIME = "SELECT statement_timestamp()"

#: The schedules' last ticks, and the database's time (every worker ticks by the same clock).
SCHEDULES_STATE = (
    "SELECT name, last_tick_at, statement_timestamp() AS now FROM postjob.schedules "
    "WHERE name = ANY(%(names)s::text[])"
)

#: Claim a tick and enqueue its job (NULL: taken by another worker, or skipped).
SCHEDULE_TICK = (
    "SELECT postjob.schedule_tick(%(name)s::varchar, %(tick)s::timestamptz, "
    "%(next_tick)s::timestamptz, %(skip)s::boolean, %(queue)s::varchar, "
    "%(max_attempts)s::integer, %(timeout)s::float8, %(tags)s::jsonb)"
)

SCHEDULES_LIST = text(
    "SELECT s.name, s.cron, s.timezone, s.every, s.skip_missed, s.last_tick_at, s.next_tick_at, "
    "s.last_run_at, s.last_job_id, j.status::text AS last_status, s.registered_at "
    "FROM postjob.schedules s LEFT JOIN postjob.postjobs j ON j.id = s.last_job_id "
    "ORDER BY s.name"
)
