"""The statements of the worker, the running job and the schema checks, named noun first.

They are plain strings run on the worker's own autocommit connections (or a transactional
job's) through :class:`postjob_sa._db.Conn`; their ``%(name)s`` placeholders suit both psycopg
drivers, and every parameter is cast, so psycopg 3's server-side binding never has to guess a
type. The statements of the Session-bound API are in ``postjob_sa._session_sql``. No statement
is ever built from user input: values travel as bound parameters only.
"""

from __future__ import annotations

# -- the worker ----------------------------------------------------------------------------------

WORKER_REGISTER = (
    "SELECT postjob.register_worker_v2(%(identifier)s::varchar, %(lease)s::float8, "
    "%(revision)s::varchar, %(workflows)s::text[], %(versions)s::text[], %(queues)s::text[])"
)

#: The worker's own connection is this one, direct: once it is gone the worker is dead.
WORKER_ATTACH = "SELECT postjob.worker_attach_v1(%(worker_id)s::bigint)"

#: A stopping worker's last word (after its last outcomes were recorded).
WORKER_UNREGISTER = "SELECT postjob.unregister_worker(%(worker_id)s::bigint)"

#: The held jobs that are no longer this worker's; NULL when the worker's row is gone.
WORKER_HEARTBEAT = (
    "SELECT postjob.worker_heartbeat(%(worker_id)s::bigint, %(lease)s::float8, "
    "%(ids)s::bigint[], %(leases)s::bigint[])"
)

#: The checkout half of the worker's cycle (below), alone when there are no outcomes to
#: record (the first checkout after a wait): rows of kind 'job'.
WORKER_CHECKOUT = (
    "SELECT 'job' AS kind, c.id, c.lease_token, c.workflow, c.workflow_version, c.args, "
    "c.queue, c.root_id, c.full_id, c.parent_id, c.attempt, c.max_attempts "
    "FROM postjob.checkout_v4(%(worker_id)s::bigint, NULL, %(workflows)s::text[], "
    "%(versions)s::text[], %(queues)s::text[], %(limit)s::integer, %(lease)s::float8, false, "
    "%(reap)s::boolean, %(promote)s::boolean) c"
)

#: The worker's cycle, one round trip: record the outcomes (postjob.finish_v4, see
#: postjob_sa/sql/outcomes.sql: the ok runs as arrays, every other outcome as an element of
#: the other arrays, the runs that stopped without one; rows of kind 'lost': outcomes not
#: recorded, 'woken': sleeps whose awaited child had ended), then check out the next jobs
#: (rows of kind 'job'), reaping and making due first when asked. Two functions side by side
#: in one statement (each one plpgsql level), the outcomes first. Arrays come as text
#: literals (see postjob_sa.worker.executor: cheaper to build than adapted lists).
WORKER_CYCLE = (
    "SELECT f.kind, f.id, NULL::bigint AS lease_token, NULL::varchar AS workflow, "
    "NULL::varchar AS workflow_version, NULL::jsonb AS args, NULL::varchar AS queue, "
    "NULL::bigint AS root_id, NULL::varchar AS full_id, NULL::bigint AS parent_id, "
    "NULL::integer AS attempt, NULL::integer AS max_attempts FROM postjob.finish_v4("
    "%(ok_ids)s::bigint[], %(ok_tokens)s::bigint[], %(ok_results)s::jsonb[], "
    "%(ok_versions)s::text[], %(ids)s::bigint[], %(tokens)s::bigint[], %(kinds)s::text[], "
    "%(errors)s::text[], %(messages)s::text[], %(backtraces)s::jsonb[], %(versions)s::text[], "
    "%(awaiting)s::bigint[], %(delays)s::float8[], %(stopped)s::bigint[], "
    "%(stopped_tokens)s::bigint[]) f "
    "UNION ALL "
    "SELECT 'job', c.id, c.lease_token, c.workflow, c.workflow_version, c.args, c.queue, "
    "c.root_id, c.full_id, c.parent_id, c.attempt, c.max_attempts "
    "FROM postjob.checkout_v4(%(worker_id)s::bigint, NULL, %(workflows)s::text[], "
    "%(versions)s::text[], %(queues)s::text[], %(limit)s::integer, %(lease)s::float8, false, "
    "%(reap)s::boolean, %(promote)s::boolean) c"
)

#: The jobs a reap now would rescue: held under an expired lease whose worker is gone, or by a
#: worker whose connection is gone (as reap_v4 picks them), with who held them and when the
#: lease ended (worker/rescues.py).
JOBS_OF_GONE_WORKERS = (
    "WITH d AS (SELECT postjob._dead_workers() AS ids) "
    "SELECT u.job_id AS id, u.workflow, u.lease_token, j.failed_attempts, "
    "u.lease_expires_at AS expires_at, COALESCE(w.identifier, u.holder) AS holder, "
    "COALESCE(u.worker_id = ANY (d.ids), false) AS connection_gone "
    "FROM d CROSS JOIN postjob.unfinished u JOIN postjob.postjobs j ON j.id = u.job_id "
    "LEFT JOIN postjob.workers w ON w.id = u.worker_id "
    "WHERE u.lease_token IS NOT NULL AND u.status IN ('ready', 'err', 'sleep') "
    "AND ((u.lease_expires_at <= statement_timestamp() AND NOT EXISTS ("
    "SELECT 1 FROM postjob.workers x WHERE x.id = u.worker_id "
    "AND x.expires_at > statement_timestamp())) OR u.worker_id = ANY (d.ids)) "
    "ORDER BY u.lease_expires_at, u.job_id LIMIT 1000"
)
#: Of those, the ones a reap rescued: no longer under that lease, with the attempt it cost
#: counted (the same statement may have checked a retried one out again already).
JOBS_RESCUED = (
    "SELECT j.id, j.status::text AS status, j.failed_attempts, j.max_attempts "
    "FROM postjob.jobs j JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[], "
    "%(attempts)s::integer[]) AS h(id, token, attempts) ON j.id = h.id "
    "WHERE j.lease_token IS DISTINCT FROM h.token AND j.failed_attempts > h.attempts "
    "ORDER BY j.id"
)

#: Outcomes only (a stopping worker's, or the keeper's flush while the loop is busy).
WORKER_FINISH = (
    "SELECT kind, id FROM postjob.finish_v4("
    "%(ok_ids)s::bigint[], %(ok_tokens)s::bigint[], %(ok_results)s::jsonb[], "
    "%(ok_versions)s::text[], %(ids)s::bigint[], %(tokens)s::bigint[], %(kinds)s::text[], "
    "%(errors)s::text[], %(messages)s::text[], %(backtraces)s::jsonb[], %(versions)s::text[], "
    "%(awaiting)s::bigint[], %(delays)s::float8[], %(stopped)s::bigint[], "
    "%(stopped_tokens)s::bigint[])"
)

#: Before an idle wait: the worker marked waiting (when it listens on a channel of its own),
#: reap now and then, make due what has come due, and the seconds until there may be work (0
#: or less: now; NULL: nothing in sight).
WORKER_IDLE = (
    "SELECT postjob.worker_idle_v2(%(worker_id)s::bigint, %(workflows)s::text[], "
    "%(versions)s::text[], %(queues)s::text[], %(reap)s::boolean)"
)

#: A wake-up this worker could not use (its checkout found nothing), passed on to a worker
#: that was waiting when it was sent (:since, the notification's payload).
WORKER_PASS_WAKEUP = "SELECT postjob.pass_wakeup_v1(%(worker_id)s::bigint, %(since)s::text)"

#: Make due the waiting jobs of these workflows whose time has come (a transactional worker,
#: on its own connection, before the transaction of its next job).
WORKER_PROMOTE = "SELECT postjob._promote(%(workflows)s::text[], %(versions)s::text[])"

#: Why these runs lost their jobs: the jobs' statuses now.
JOBS_STATUS_NOW = (
    "SELECT id, status::text FROM postjob.jobs WHERE id = ANY(%(ids)s::bigint[])"
)

#: Every worker hears this channel (a wake-up that found no worker waiting goes to all) ...
WORKER_LISTEN = "LISTEN postjob_notifications"
#: ... and one of its own (postjob._wake_for wakes, on its channel, the worker waiting longest
#: among those that serve the new job).
WORKER_LISTEN_OWN = "LISTEN postjob_worker_{worker_id:d}"
#: The probe for a pooler in transaction mode (worker/pooler.py): a channel nobody notifies.
POOLER_PROBE_LISTEN = "LISTEN postjob_pooler_probe"
POOLER_PROBE_LISTENING = "SELECT 'postjob_pooler_probe' = ANY(ARRAY(SELECT pg_listening_channels()))"
POOLER_PROBE_UNLISTEN = "UNLISTEN postjob_pooler_probe"

#: A worker's connection: its statements at READ COMMITTED whatever the database's default,
#: and how it shows in pg_stat_activity ("postjob worker host:pid", when named).
WORKER_SESSION_SET = (
    "SELECT set_config('default_transaction_isolation', 'read committed', false), "
    "CASE WHEN %(name)s::text IS NOT NULL "
    "THEN set_config('application_name', %(name)s::text, false) END"
)
ISOLATION_LEVEL = "SHOW transaction_isolation"

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

#: Why a run's fenced write was refused: the job's status now (cancelled, or anything else).
JOB_STATUS = "SELECT status::text FROM postjob.postjobs WHERE id = %(job_id)s::bigint"

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

# -- jobs no running worker knows (postjob_sa.worker.unknown) --------------------------------

#: The workflows of due jobs that no live worker has registered, with how many jobs are due for
#: each, most first: due ones, and the ones whose time has come that no worker made due yet.
#: The distinct workflows are found by loose scans of the waiting jobs' two indexes (one probe
#: per workflow, however many jobs wait), so the cost grows with the number of workflows and of
#: the jobs no worker knows, never with the jobs. Manual steps wait for a person, not a
#: worker: they are neither due nor timed, so never counted.
WORKFLOWS_UNKNOWN = (
    "WITH RECURSIVE due(workflow) AS ("
    "  SELECT min(workflow) FROM postjob.unfinished WHERE due AND lease_token IS NULL "
    "  UNION ALL "
    "  SELECT (SELECT min(w.workflow) FROM postjob.unfinished w WHERE w.due AND w.lease_token IS NULL "
    "          AND w.workflow > d.workflow) "
    "  FROM due d WHERE d.workflow IS NOT NULL), "
    "timed(workflow) AS ("
    "  SELECT min(workflow) FROM postjob.unfinished WHERE NOT due AND run_at IS NOT NULL "
    "  AND lease_token IS NULL "
    "  UNION ALL "
    "  SELECT (SELECT min(w.workflow) FROM postjob.unfinished w "
    "          WHERE NOT w.due AND w.run_at IS NOT NULL AND w.lease_token IS NULL "
    "          AND w.workflow > t.workflow) "
    "  FROM timed t WHERE t.workflow IS NOT NULL), "
    "names AS (SELECT workflow FROM due UNION SELECT workflow FROM timed) "
    "SELECT u.workflow, u.jobs FROM ("
    "  SELECT n.workflow, (SELECT count(*) FROM postjob.unfinished w "
    "     WHERE w.workflow = n.workflow AND w.due AND w.lease_token IS NULL) "
    "   + (SELECT count(*) FROM postjob.unfinished w "
    "     WHERE w.workflow = n.workflow AND NOT w.due AND w.run_at IS NOT NULL "
    "     AND w.lease_token IS NULL AND w.run_at <= now()) AS jobs "
    "  FROM names n WHERE n.workflow IS NOT NULL "
    "  AND NOT EXISTS (SELECT 1 FROM postjob.workers w "
    "                  WHERE w.expires_at > now() AND n.workflow = ANY (w.workflows))) u "
    "WHERE u.jobs > 0 ORDER BY u.jobs DESC, u.workflow"
)

# -- schedules (postjob_sa.worker.scheduler; postjob_sa/sql/schedules.sql) --------------------

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

# -- history (postjob_sa/sql/history.sql) ------------------------------------------------------

#: One rotation (see postjob.rotate_history): a row per range it did something with.
HISTORY_ROTATE_SQL = ("SELECT action, name, from_id, to_id, jobs, root_id, detail "
                      "FROM postjob.rotate_history()")

#: Fold the per-minute counts of settled jobs (see postjob._settled_counts_fold).
SETTLED_COUNTS_FOLD = "SELECT postjob._settled_counts_fold()"
