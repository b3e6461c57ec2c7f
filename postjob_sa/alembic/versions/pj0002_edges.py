"""Workers with heartbeats, checkout by workflow, fenced spawns, wake-ups at every isolation level.

Revision ID: pj0002
Revises: pj0001
Create Date: 2026-11-30

What changes, block by block (each block below is one step of ``upgrade()``):

- **workers**: ``postjob.workers`` holds one row per running worker, kept alive by its
  heartbeat; a job it runs carries its ``worker_id`` and is rescued only once that worker's
  heartbeat has stopped (a job row locked by another transaction can keep an old lease without
  being taken from a live worker).
- **runnable index**: due jobs are found per (workflow, version) pair, so jobs that no asking
  worker can run (manual steps, workflows of other deployments) are never walked past.
- **checkout and cycle**: ``checkout_v2`` (no reaping: a checkout in the caller's transaction
  touches only the jobs it hands out) and ``worker_cycle`` (record outcomes, check out, report
  lost leases, in one round trip).
- **fencing**: ``spawn_children`` and ``set_workflow_status`` act only for the run that holds
  the job's lease.
- **wake-ups**: ``_jobs_ended`` locks before it reads at REPEATABLE READ and SERIALIZABLE.
- **operators**: ``reset_jobs`` leaves running jobs alone.
- **compatibility**: workers of pj0001 code keep running during the upgrade; the functions they
  call stay, now on top of the new ones (``oldest_served_code`` says so). Dead functions are
  dropped (``enqueue``, ``set_job_result``, ``set_job_pending``, ``set_job_error``).

Upgrading a live database: the new index is built CONCURRENTLY outside the transaction, and the
transactional part waits at most ``lock_timeout`` for its table lock, so it never stalls the
queue behind a long transaction (run it again if it timed out).
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import index_step, own_transaction, sends_scripts_whole

revision = "pj0002"
down_revision = "pj0001"
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"

# an index a failed CONCURRENTLY build left behind is invalid: drop it so the build can run again
INVALID_INDEX_DROP = r"""
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index i
             JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'postjob' AND c.relname = 'postjobs_runnable_by_workflow_idx'
               AND NOT i.indisvalid) THEN
    DROP INDEX postjob.postjobs_runnable_by_workflow_idx;
  END IF;
END
$$
"""
INDEX_UP = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_runnable_by_workflow_idx "
    "ON postjob.postjobs (workflow, workflow_version, next_run_at) "
    "WHERE status IN ('ready', 'err')"
)
OLD_INDEX_DOWN = "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_runnable_idx"
OLD_INDEX_UP = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_runnable_idx "
    "ON postjob.postjobs (next_run_at) WHERE status IN ('ready', 'err')"
)
INDEX_DOWN = "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_runnable_by_workflow_idx"

# -- step 1, in a transaction of its own: the shapes pj0001 code reads -------------------------
# pj0001's checkout and finish_and_checkout return the table's row type (SETOF postjobs,
# RETURNING j.*). A call of theirs that waits behind this revision's ALTER TABLE would then
# return one column more than its caller expects. So first, before the table changes, they (and
# resolve, which reads a row of the table) get pj0001's columns spelled out: what runs after
# the ALTER reads exactly what it read before. New functions return explicit columns too.

PJ0001_COLUMNS = """id bigint, parent_id bigint, root_id bigint, full_id varchar, created_at timestamptz,
  updated_at timestamptz, queue varchar, workflow varchar, workflow_method varchar,
  workflow_version varchar, args jsonb, status postjob.statuses, next_run_at timestamptz,
  timeout double precision, timing_out_at timestamptz, failed_attempts integer,
  max_attempts integer, results jsonb, error varchar, error_message varchar,
  error_backtrace jsonb, workflow_status varchar, tags jsonb, awaiting_id bigint,
  processing_client varchar, processing_client_identifier varchar,
  processing_started_at timestamptz, processing_max_duration double precision,
  lease_expires_at timestamptz, lease_token bigint"""

SHAPES_SQL = r"""
DROP FUNCTION postjob.finish_and_checkout(bigint[], bigint[], text[], jsonb[], text[], text[],
  jsonb[], text[], bigint[], text[], text[], text[], integer, double precision, boolean, boolean);
DROP FUNCTION postjob.checkout(text[], text[], text[], integer, double precision, boolean,
  boolean);

CREATE FUNCTION postjob.checkout(
  p_workflows text[],
  p_versions text[],
  p_queues text[] DEFAULT NULL,
  p_limit integer DEFAULT 1,
  p_lease double precision DEFAULT 60,
  p_fast_mode boolean DEFAULT false,
  p_reap boolean DEFAULT true)
RETURNS TABLE (id bigint, parent_id bigint, root_id bigint, full_id varchar, created_at timestamptz,
  updated_at timestamptz, queue varchar, workflow varchar, workflow_method varchar,
  workflow_version varchar, args jsonb, status postjob.statuses, next_run_at timestamptz,
  timeout double precision, timing_out_at timestamptz, failed_attempts integer,
  max_attempts integer, results jsonb, error varchar, error_message varchar,
  error_backtrace jsonb, workflow_status varchar, tags jsonb, awaiting_id bigint,
  processing_client varchar, processing_client_identifier varchar,
  processing_started_at timestamptz, processing_max_duration double precision,
  lease_expires_at timestamptz, lease_token bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap(p_fast_mode);
  END IF;
  RETURN QUERY
  UPDATE postjob.postjobs j SET
    status = 'processing',
    next_run_at = NULL,
    error = NULL,
    error_message = NULL,
    error_backtrace = NULL,
    awaiting_id = NULL,
    processing_client = host(inet_client_addr()) || ':' || inet_client_port(),
    processing_client_identifier = postjob._client_identifier(),
    processing_started_at = statement_timestamp(),
    processing_max_duration = p_lease,
    lease_expires_at = statement_timestamp() + p_lease * interval '1 second',
    lease_token = nextval('postjob.lease_tokens'),
    updated_at = statement_timestamp()
  WHERE j.id = ANY (ARRAY(
    SELECT s.id FROM postjob.postjobs s
    WHERE s.status IN ('ready', 'err')
      AND s.next_run_at <= statement_timestamp()
      AND (s.timing_out_at IS NULL OR s.timing_out_at > statement_timestamp())
      AND (p_queues IS NULL OR s.queue = ANY (p_queues))
      AND EXISTS (SELECT 1 FROM unnest(p_workflows, p_versions) AS w(name, version)
                  WHERE w.name = s.workflow
                    AND (s.workflow_version = '' OR s.workflow_version = w.version))
    ORDER BY s.next_run_at
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED))
  RETURNING j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, j.workflow,
    j.workflow_method, j.workflow_version, j.args, j.status, j.next_run_at, j.timeout,
    j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message,
    j.error_backtrace, j.workflow_status, j.tags, j.awaiting_id, j.processing_client,
    j.processing_client_identifier, j.processing_started_at, j.processing_max_duration,
    j.lease_expires_at, j.lease_token;
END;
$$;

CREATE FUNCTION postjob.finish_and_checkout(
  p_ids bigint[],
  p_lease_tokens bigint[],
  p_outcomes text[],
  p_results jsonb[],
  p_errors text[],
  p_messages text[],
  p_backtraces jsonb[],
  p_versions text[],
  p_awaiting bigint[],
  p_workflows text[],
  p_workflow_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision,
  p_fast_mode boolean,
  p_reap boolean DEFAULT true)
RETURNS TABLE (id bigint, parent_id bigint, root_id bigint, full_id varchar, created_at timestamptz,
  updated_at timestamptz, queue varchar, workflow varchar, workflow_method varchar,
  workflow_version varchar, args jsonb, status postjob.statuses, next_run_at timestamptz,
  timeout double precision, timing_out_at timestamptz, failed_attempts integer,
  max_attempts integer, results jsonb, error varchar, error_message varchar,
  error_backtrace jsonb, workflow_status varchar, tags jsonb, awaiting_id bigint,
  processing_client varchar, processing_client_identifier varchar,
  processing_started_at timestamptz, processing_max_duration double precision,
  lease_expires_at timestamptz, lease_token bigint)
LANGUAGE plpgsql AS $$
BEGIN
  IF cardinality(p_ids) > 0 THEN
    PERFORM postjob.finish_jobs(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors,
                                p_messages, p_backtraces, p_versions, p_awaiting, p_fast_mode);
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY SELECT * FROM postjob.checkout(p_workflows, p_workflow_versions, p_queues,
                                                p_limit, p_lease, p_fast_mode, p_reap);
  END IF;
END;
$$;

"""

# resolve reads the job's columns it needs, never the row type (pj0004 runs this again to
# downgrade)
RESOLVE_SQL = r"""
CREATE OR REPLACE FUNCTION postjob.resolve(
  p_token uuid, p_result jsonb, p_error varchar DEFAULT NULL, p_message varchar DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_workflow varchar;
  v_status postjob.statuses;
BEGIN
  SELECT j.id, j.workflow, j.status INTO v_id, v_workflow, v_status
    FROM postjob.tokens t JOIN postjob.postjobs j ON j.id = t.postjob_id
    WHERE t.token = p_token
    FOR UPDATE OF j;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: no job has the token %', p_token USING ERRCODE = 'no_data_found';
  END IF;
  IF v_workflow <> '__manual__' THEN
    RAISE EXCEPTION 'postjob: job % is not a manual job', v_id
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF v_status IN ('ok', 'failed', 'timeout') THEN
    RAISE EXCEPTION 'postjob: job % is already %', v_id, v_status
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  UPDATE postjob.postjobs SET
    status = (CASE WHEN p_error IS NULL THEN 'ok' ELSE 'failed' END)::postjob.statuses,
    results = CASE WHEN p_error IS NULL THEN jsonb_build_array(p_result) END,
    error = p_error,
    error_message = CASE WHEN p_error IS NOT NULL THEN COALESCE(p_message, p_error) END,
    failed_attempts = failed_attempts + CASE WHEN p_error IS NULL THEN 0 ELSE 1 END,
    next_run_at = NULL,
    updated_at = statement_timestamp()
  WHERE id = v_id;
  PERFORM postjob._jobs_ended(
    ARRAY[v_id], CASE WHEN p_error IS NULL THEN '{}'::bigint[] ELSE ARRAY[v_id] END);
  RETURN v_id;
END;
$$;
"""

WORKERS_SQL = r"""
CREATE TABLE IF NOT EXISTS postjob.workers (
  id             bigserial PRIMARY KEY,
  identifier     varchar NOT NULL,
  started_at     timestamptz NOT NULL DEFAULT now(),
  heartbeat_at   timestamptz NOT NULL DEFAULT now(),
  expires_at     timestamptz NOT NULL,
  code_revision  varchar NOT NULL,
  workflows      text[] NOT NULL DEFAULT '{}',
  queues         text[]
);

ALTER TABLE postjob.postjobs ADD COLUMN IF NOT EXISTS worker_id bigint;

CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0002'::text
$$;

-- The oldest code revision this schema still serves: workers of that code keep running while
-- the database is upgraded under them (the functions they call are kept below).
CREATE OR REPLACE FUNCTION postjob.oldest_served_code() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0001'::text
$$;

-- A worker announces itself; its heartbeat keeps the row alive. Returns its id.
CREATE OR REPLACE FUNCTION postjob.register_worker(
  p_identifier varchar, p_lease double precision, p_code_revision varchar,
  p_workflows text[], p_queues text[])
RETURNS bigint LANGUAGE sql AS $$
  INSERT INTO postjob.workers (identifier, expires_at, code_revision, workflows, queues)
  VALUES (p_identifier, statement_timestamp() + p_lease * interval '1 second',
          p_code_revision, COALESCE(p_workflows, '{}'), p_queues)
  RETURNING id
$$;

CREATE OR REPLACE FUNCTION postjob.unregister_worker(p_worker_id bigint) RETURNS void LANGUAGE sql AS $$
  DELETE FROM postjob.workers WHERE id = p_worker_id
$$;

-- The heartbeat: keep the worker alive and extend the leases of the jobs it holds. It never
-- waits for a lock: a job row another transaction has locked keeps its lease until the next
-- beat (its worker is alive, so it is not reaped meanwhile). Returns the held jobs that are no
-- longer this worker's (reaped, reset or resolved by someone else), or NULL when the worker's
-- own row is gone (it was presumed dead: its jobs were rescued; it must register again).
CREATE OR REPLACE FUNCTION postjob.worker_heartbeat(
  p_worker_id bigint, p_lease double precision, p_ids bigint[], p_lease_tokens bigint[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_lost bigint[];
BEGIN
  UPDATE postjob.workers SET
    heartbeat_at = statement_timestamp(),
    expires_at = statement_timestamp() + p_lease * interval '1 second'
  WHERE id = p_worker_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF cardinality(p_ids) > 0 THEN
    UPDATE postjob.postjobs j SET
      lease_expires_at = statement_timestamp() + p_lease * interval '1 second',
      processing_max_duration =
        EXTRACT(EPOCH FROM statement_timestamp() - j.processing_started_at) + p_lease
    WHERE j.id = ANY (ARRAY(
      SELECT s.id FROM postjob.postjobs s
        JOIN unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
          ON s.id = h.id AND s.lease_token = h.lease_token
      FOR NO KEY UPDATE OF s SKIP LOCKED));
    SELECT array_agg(h.id) INTO v_lost
      FROM unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
      WHERE NOT EXISTS (SELECT 1 FROM postjob.postjobs s
                        WHERE s.id = h.id AND s.lease_token = h.lease_token);
  END IF;
  RETURN COALESCE(v_lost, '{}');
END;
$$;
"""

REAP_SQL = r"""
-- Reap expired leases (zombies: a recoverable error, retried at once) and passed deadlines
-- (timeout, final). A job whose worker still beats is never a zombie, whatever its lease says
-- (its lease could not be extended while another transaction held its row). Also forgets
-- workers whose heartbeat stopped an hour ago. Returns how many jobs were reaped.
CREATE OR REPLACE FUNCTION postjob.reap_v2(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := statement_timestamp();
  v_zombies integer := 0;
  v_final bigint[];
  v_timeouts bigint[];
  v_retry boolean;
BEGIN
  IF EXISTS (SELECT 1 FROM postjob.postjobs z
             WHERE z.status = 'processing' AND z.lease_expires_at <= v_now
               AND NOT EXISTS (SELECT 1 FROM postjob.workers w
                               WHERE w.id = z.worker_id AND w.expires_at > v_now)) THEN
    WITH expired AS (
      SELECT z.id FROM postjob.postjobs z
      WHERE z.status = 'processing' AND z.lease_expires_at <= v_now
        AND NOT EXISTS (SELECT 1 FROM postjob.workers w
                        WHERE w.id = z.worker_id AND w.expires_at > v_now)
      ORDER BY z.lease_expires_at
      LIMIT p_limit
      FOR UPDATE OF z SKIP LOCKED
    ), reaped AS (
      UPDATE postjob.postjobs j SET
        status = (CASE WHEN j.failed_attempts + 1 < j.max_attempts
                       THEN 'err' ELSE 'failed' END)::postjob.statuses,
        failed_attempts = j.failed_attempts + 1,
        error = 'Zombie',
        error_message = 'zombie: the lease expired (worker ' ||
          COALESCE(j.processing_client_identifier, j.processing_client, 'unknown') || ')',
        error_backtrace = NULL,
        next_run_at = CASE WHEN j.failed_attempts + 1 < j.max_attempts THEN v_now END,
        processing_client = NULL,
        processing_client_identifier = NULL,
        processing_started_at = NULL,
        processing_max_duration = NULL,
        lease_expires_at = NULL,
        lease_token = NULL,
        worker_id = NULL,
        updated_at = v_now
      FROM expired WHERE j.id = expired.id
      RETURNING j.id, j.status
    )
    SELECT count(*), array_agg(id) FILTER (WHERE status = 'failed'), bool_or(status = 'err')
      INTO v_zombies, v_final, v_retry
      FROM reaped;
    IF v_final IS NOT NULL THEN
      PERFORM postjob._jobs_ended(v_final, v_final);
    END IF;
    IF v_retry THEN
      PERFORM pg_notify('postjob_notifications', '');
    END IF;
  END IF;

  IF EXISTS (SELECT 1 FROM postjob.postjobs
             WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at <= v_now) THEN
    WITH expired AS (
      SELECT id FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at <= v_now
      ORDER BY timing_out_at
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED
    ), reaped AS (
      UPDATE postjob.postjobs j SET
        status = 'timeout',
        failed_attempts = j.failed_attempts + 1,
        error = 'Timeout',
        error_message = 'timeout',
        error_backtrace = NULL,
        next_run_at = NULL,
        awaiting_id = NULL,
        updated_at = v_now
      FROM expired WHERE j.id = expired.id
      RETURNING j.id
    )
    SELECT array_agg(id) INTO v_timeouts FROM reaped;
    IF v_timeouts IS NOT NULL THEN
      PERFORM postjob._jobs_ended(v_timeouts, v_timeouts);
      v_zombies := v_zombies + cardinality(v_timeouts);
    END IF;
  END IF;

  DELETE FROM postjob.workers WHERE expires_at < v_now - interval '1 hour';
  RETURN v_zombies;
END;
$$;
"""

CHECKOUT_SQL = r"""
-- The (workflow, version) index keys a worker may check out: a job not pinned to a version
-- ('') runs on any registered version; a pinned one only on that version.
CREATE OR REPLACE FUNCTION postjob._runnable_keys(p_workflows text[], p_versions text[])
RETURNS TABLE (workflow text, workflow_version text) LANGUAGE sql IMMUTABLE AS $$
  SELECT DISTINCT w.name, v.version
  FROM unnest(p_workflows, p_versions) AS w(name, version)
  CROSS JOIN LATERAL (VALUES (''::text), (w.version)) AS v(version)
$$;

-- Check out up to p_limit due jobs of the given (workflow, version) pairs, oldest due first,
-- each with a lease of p_lease seconds and a fresh lease token (the fencing token every later
-- write must present). Returns what a worker needs to run them, in columns of its own (never
-- the table's row type, which later revisions may widen under a running call). Each pair is one short range of the runnable index, so jobs that this
-- worker cannot run are never walked past. No reaping here: a checkout inside the caller's
-- transaction must lock only the jobs it hands out.
--
-- The due jobs are first picked without locks and then locked (SKIP LOCKED); only when some
-- were taken meanwhile by another worker does a second pass lock as it scans, so a batch never
-- locks rows it does not hand out unless it must.
CREATE OR REPLACE FUNCTION postjob.checkout_v2(
  p_worker_id bigint,
  p_identifier varchar,
  p_workflows text[],
  p_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint)
LANGUAGE plpgsql
-- one cached plan whatever the arguments (custom plans would be re-planned on every call)
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_candidates bigint[];
  v_ids bigint[];
BEGIN
  v_candidates := ARRAY(
    SELECT c.id
    FROM postjob._runnable_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT s.id, s.next_run_at FROM postjob.postjobs s
      WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
        AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
        AND (p_queues IS NULL OR s.queue = ANY (p_queues))
      ORDER BY s.next_run_at
      LIMIT p_limit) c
    ORDER BY c.next_run_at
    LIMIT p_limit);
  IF cardinality(v_candidates) = 0 THEN
    RETURN;
  END IF;
  v_ids := ARRAY(
    SELECT s.id FROM postjob.postjobs s
    WHERE s.id = ANY (v_candidates)
      AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
    FOR UPDATE SKIP LOCKED);
  IF cardinality(v_ids) < cardinality(v_candidates) THEN
    -- others got some of them first: scan again, locking as we go
    v_ids := v_ids || ARRAY(
      SELECT c.id
      FROM postjob._runnable_keys(p_workflows, p_versions) k
      CROSS JOIN LATERAL (
        SELECT s.id, s.next_run_at FROM postjob.postjobs s
        WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
          AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
          AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
          AND (p_queues IS NULL OR s.queue = ANY (p_queues))
          AND s.id <> ALL (v_ids)
        ORDER BY s.next_run_at
        LIMIT p_limit - cardinality(v_ids)
        FOR UPDATE SKIP LOCKED) c
      ORDER BY c.next_run_at
      LIMIT p_limit - cardinality(v_ids));
  END IF;
  RETURN QUERY
  UPDATE postjob.postjobs j SET
    status = 'processing',
    next_run_at = NULL,
    error = NULL,
    error_message = NULL,
    error_backtrace = NULL,
    awaiting_id = NULL,
    processing_client = host(inet_client_addr()) || ':' || inet_client_port(),
    processing_client_identifier = COALESCE(p_identifier, postjob._client_identifier()),
    processing_started_at = v_now,
    processing_max_duration = p_lease,
    lease_expires_at = v_now + p_lease * interval '1 second',
    lease_token = nextval('postjob.lease_tokens'),
    worker_id = p_worker_id,
    updated_at = v_now
  WHERE j.id = ANY (v_ids)
  RETURNING j.id, j.lease_token, j.workflow, j.workflow_version, j.args, j.queue, j.root_id,
            j.full_id, j.parent_id;
END;
$$;

-- Seconds until a worker for these pairs has something to do (negative: overdue; NULL:
-- nothing scheduled): its own due jobs, and leases and deadlines of any job (any worker reaps).
CREATE OR REPLACE FUNCTION postjob.time_to_next_job_v2(
  p_workflows text[], p_versions text[], p_queues text[])
RETURNS double precision LANGUAGE sql STABLE AS $$
  SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(lease_expires_at) FROM postjob.postjobs WHERE status = 'processing'),
    (SELECT min(timing_out_at) FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL),
    (SELECT min(c.next_run_at)
       FROM postjob._runnable_keys(p_workflows, p_versions) k
       CROSS JOIN LATERAL (
         SELECT s.next_run_at FROM postjob.postjobs s
         WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
           AND s.status IN ('ready', 'err')
           AND (p_queues IS NULL OR s.queue = ANY (p_queues))
         ORDER BY s.next_run_at
         LIMIT 1) c)
  ) - statement_timestamp())::double precision
$$;

-- The worker's cycle in one round trip: record the outcomes of its previous jobs, reap now and
-- then (p_reap), and check out the next batch. Rows of kind 'job' are the jobs checked out; a row
-- of kind 'done' gives the status recorded for an outcome and the attempt the run was; a row of
-- kind 'lost' names an outcome that was not recorded because the job was no longer this run's
-- (reaped, reset or resolved).
CREATE OR REPLACE FUNCTION postjob.worker_cycle(
  p_worker_id bigint,
  p_identifier varchar,
  p_ids bigint[],
  p_lease_tokens bigint[],
  p_outcomes text[],
  p_results jsonb[],
  p_errors text[],
  p_messages text[],
  p_backtraces jsonb[],
  p_versions text[],
  p_awaiting bigint[],
  p_workflows text[],
  p_workflow_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision,
  p_fast_mode boolean,
  p_reap boolean)
RETURNS TABLE (kind text, id bigint, status text, lease_token bigint, workflow varchar,
               workflow_version varchar, args jsonb, queue varchar, root_id bigint,
               full_id varchar, parent_id bigint, attempt integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_accepted bigint[];
BEGIN
  IF cardinality(p_ids) > 0 THEN
    v_accepted := postjob.finish_jobs(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors,
                                      p_messages, p_backtraces, p_versions, p_awaiting,
                                      p_fast_mode);
    -- the attempt each run was: an error counted it already, any other outcome did not
    RETURN QUERY SELECT 'done'::text, d.id, d.status::text, NULL::bigint, NULL::varchar,
                        NULL::varchar, NULL::jsonb, NULL::varchar, NULL::bigint,
                        NULL::varchar, NULL::bigint,
                        d.failed_attempts + CASE WHEN i.outcome IN ('err', 'failed') THEN 0
                                                 ELSE 1 END
      FROM postjob.postjobs d
      JOIN unnest(p_ids, p_outcomes) AS i(id, outcome) ON i.id = d.id
      WHERE d.id = ANY (v_accepted);
    RETURN QUERY SELECT 'lost'::text, x, NULL::text, NULL::bigint, NULL::varchar,
                        NULL::varchar, NULL::jsonb, NULL::varchar, NULL::bigint,
                        NULL::varchar, NULL::bigint, NULL::integer
      FROM unnest(p_ids) AS x WHERE x <> ALL (v_accepted);
  END IF;
  IF p_reap THEN
    PERFORM postjob.reap_v2();
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY SELECT 'job'::text, j.id, 'processing'::text, j.lease_token, j.workflow,
                        j.workflow_version, j.args, j.queue, j.root_id, j.full_id, j.parent_id,
                        NULL::integer
      FROM postjob.checkout_v2(p_worker_id, p_identifier, p_workflows, p_workflow_versions,
                               p_queues, p_limit, p_lease) j;
  END IF;
END;
$$;

-- Before an idle worker waits: reap now and then (p_reap), then the seconds to its next job.
CREATE OR REPLACE FUNCTION postjob.worker_idle(
  p_workflows text[], p_versions text[], p_queues text[], p_reap boolean)
RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap_v2();
  END IF;
  RETURN postjob.time_to_next_job_v2(p_workflows, p_versions, p_queues);
END;
$$;
"""

FENCING_SQL = r"""
-- Insert the children a run spawned (those that exist already are kept) and return every child
-- of the job, in one round trip. Only the run that holds the job's lease may spawn: the lock
-- holds a concurrent reap (or reset) back until these children are in, and a run whose lease is
-- gone gets an error (SQLSTATE PJ001) instead of children that nobody awaits.
CREATE OR REPLACE FUNCTION postjob.spawn_children(
  p_parent_id bigint,
  p_lease_token bigint,
  p_queues text[],
  p_workflows text[],
  p_args jsonb[],
  p_max_attempts integer[],
  p_timeouts double precision[])
RETURNS TABLE (id bigint, workflow varchar, args jsonb, status text, results jsonb,
               error varchar, error_message varchar)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  PERFORM 1 FROM postjob.postjobs
    WHERE postjobs.id = p_parent_id AND postjobs.lease_token = p_lease_token FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: job % lost its lease', p_parent_id USING ERRCODE = 'PJ001';
  END IF;
  IF cardinality(p_workflows) > 0 THEN
    INSERT INTO postjob.postjobs (parent_id, queue, workflow, args, max_attempts, timeout)
    SELECT p_parent_id, c.queue, c.workflow, c.args, c.max_attempts, c.timeout
    FROM unnest(p_queues, p_workflows, p_args, p_max_attempts, p_timeouts)
      AS c(queue, workflow, args, max_attempts, timeout)
    ON CONFLICT (parent_id, workflow, workflow_method, md5(args::text))
      WHERE parent_id IS NOT NULL DO NOTHING;
  END IF;
  RETURN QUERY
  SELECT c.id, c.workflow, c.args, c.status::text, c.results, c.error, c.error_message
  FROM postjob.postjobs c WHERE c.parent_id = p_parent_id;
END;
$$;

-- A running job's progress note; false when the run no longer holds the job's lease.
CREATE OR REPLACE FUNCTION postjob.set_workflow_status(
  p_job_id bigint, p_lease_token bigint, p_status varchar)
RETURNS boolean LANGUAGE sql AS $$
  WITH updated AS (
    UPDATE postjob.postjobs SET workflow_status = p_status, updated_at = statement_timestamp()
    WHERE id = p_job_id AND lease_token = p_lease_token
    RETURNING 1
  )
  SELECT EXISTS (SELECT 1 FROM updated)
$$;
"""

WAKEUPS_SQL = r"""
-- What happens when jobs reach a final state (see pj0001). At READ COMMITTED each statement
-- sees what committed before it; at REPEATABLE READ and SERIALIZABLE the transaction's
-- snapshot may predate a parent going to sleep, and a status filter read from that snapshot
-- would skip the parent: so there every parent is locked first (a parent changed since the
-- snapshot raises a serialization failure, which the caller retries as for any conflict at
-- those levels), and only then read.
CREATE OR REPLACE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_wake bigint[];
  v_mark bigint[];
BEGIN
  IF cardinality(p_failed_ids) > 0 THEN
    UPDATE postjob.postjobs d SET
      status = 'timeout',
      error = 'Timeout',
      error_message = 'cancelled: job ' || a.id || ' ended with status ' || a.status,
      error_backtrace = NULL,
      next_run_at = NULL,
      awaiting_id = NULL,
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      worker_id = NULL,
      updated_at = statement_timestamp()
    FROM postjob.postjobs a
    WHERE a.id = ANY (p_failed_ids)
      AND d.parent_id IS NOT NULL
      AND d.root_id = a.root_id
      AND d.full_id LIKE a.full_id || '.%'
      AND d.status NOT IN ('ok', 'failed', 'timeout');
  END IF;

  IF current_setting('transaction_isolation') <> 'read committed' THEN
    PERFORM 1 FROM postjob.postjobs parent
      WHERE parent.id IN (SELECT child.parent_id FROM postjob.postjobs child
                          WHERE child.id = ANY (p_final_ids) AND child.parent_id IS NOT NULL)
      ORDER BY parent.id
      FOR UPDATE;
  END IF;

  -- Lock the parents to wake or mark (at READ COMMITTED the lock re-reads a parent whose own
  -- finish is committing), in id order (no deadlocks between batches), then update them by id.
  SELECT array_agg(l.id) FILTER (WHERE l.status = 'sleep'),
         array_agg(l.id) FILTER (WHERE l.status = 'processing')
    INTO v_wake, v_mark
    FROM (
      SELECT parent.id, parent.status
      FROM postjob.postjobs child
      JOIN postjob.postjobs parent ON parent.id = child.parent_id
      WHERE child.id = ANY (p_final_ids)
        AND ((parent.status = 'sleep'
              AND (parent.awaiting_id = child.id OR child.status IN ('failed', 'timeout')))
          OR (parent.status = 'processing' AND child.status IN ('failed', 'timeout')))
      ORDER BY parent.id
      FOR UPDATE OF parent
    ) l;

  IF v_mark IS NOT NULL THEN
    UPDATE postjob.postjobs SET next_run_at = statement_timestamp()
    WHERE id = ANY (v_mark) AND status = 'processing';
  END IF;
  IF v_wake IS NOT NULL THEN
    UPDATE postjob.postjobs SET
      status = 'ready',
      next_run_at = statement_timestamp(),
      awaiting_id = NULL,
      updated_at = statement_timestamp()
    WHERE id = ANY (v_wake) AND status = 'sleep';
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
END;
$$;
"""

OPERATORS_SQL = r"""
-- Operator reset (see pj0001), now leaving running jobs alone: a job that is processing is
-- not reset (it would run twice at once); JobQueue.reset reports it before calling this.
CREATE OR REPLACE FUNCTION postjob.reset_jobs(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
  v_ids bigint[];
BEGIN
  WITH targets AS (
    SELECT j.id FROM postjob.postjobs j WHERE j.id = ANY (p_ids) AND j.status <> 'processing'
    UNION
    SELECT d.id FROM postjob.postjobs a
      JOIN postjob.postjobs d ON d.parent_id IS NOT NULL AND d.root_id = a.root_id
                              AND d.full_id LIKE a.full_id || '.%'
      WHERE a.id = ANY (p_ids) AND d.status IN ('failed', 'timeout')
  ), reset AS (
    UPDATE postjob.postjobs j SET
      status = 'ready',
      next_run_at = statement_timestamp(),
      timing_out_at = CASE WHEN j.timeout IS NOT NULL
                           THEN statement_timestamp() + j.timeout * interval '1 second' END,
      results = NULL,
      failed_attempts = 0,
      error = NULL,
      error_message = NULL,
      error_backtrace = NULL,
      awaiting_id = NULL,
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      worker_id = NULL,
      updated_at = statement_timestamp()
    FROM targets t WHERE j.id = t.id AND j.status <> 'processing'
    RETURNING j.id
  )
  SELECT array_agg(id ORDER BY id) INTO v_ids FROM reset;
  IF v_ids IS NOT NULL THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN COALESCE(v_ids, '{}');
END;
$$;
"""

COMPAT_SQL = r"""
-- Workers of pj0001 code call these while the database is upgraded under them; they now run
-- on the new functions (same arguments, same results). A later revision drops them.
CREATE OR REPLACE FUNCTION postjob.reap(p_fast_mode boolean DEFAULT false,
                                        p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE sql AS $$
  SELECT postjob.reap_v2(p_limit)
$$;

CREATE OR REPLACE FUNCTION postjob.checkout(
  p_workflows text[],
  p_versions text[],
  p_queues text[] DEFAULT NULL,
  p_limit integer DEFAULT 1,
  p_lease double precision DEFAULT 60,
  p_fast_mode boolean DEFAULT false,
  p_reap boolean DEFAULT true)
RETURNS TABLE (id bigint, parent_id bigint, root_id bigint, full_id varchar, created_at timestamptz,
  updated_at timestamptz, queue varchar, workflow varchar, workflow_method varchar,
  workflow_version varchar, args jsonb, status postjob.statuses, next_run_at timestamptz,
  timeout double precision, timing_out_at timestamptz, failed_attempts integer,
  max_attempts integer, results jsonb, error varchar, error_message varchar,
  error_backtrace jsonb, workflow_status varchar, tags jsonb, awaiting_id bigint,
  processing_client varchar, processing_client_identifier varchar,
  processing_started_at timestamptz, processing_max_duration double precision,
  lease_expires_at timestamptz, lease_token bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_ids bigint[];
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap_v2();
  END IF;
  -- two statements: the second reads the rows as the first updated them
  v_ids := ARRAY(SELECT c.id FROM postjob.checkout_v2(NULL, NULL, p_workflows, p_versions,
                                                       p_queues, p_limit, p_lease) c);
  RETURN QUERY SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, j.workflow,
    j.workflow_method, j.workflow_version, j.args, j.status, j.next_run_at, j.timeout,
    j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message,
    j.error_backtrace, j.workflow_status, j.tags, j.awaiting_id, j.processing_client,
    j.processing_client_identifier, j.processing_started_at, j.processing_max_duration,
    j.lease_expires_at, j.lease_token
    FROM postjob.postjobs j WHERE j.id = ANY (v_ids);
END;
$$;

CREATE OR REPLACE FUNCTION postjob.time_to_next_job(
  p_workflows text[], p_versions text[], p_queues text[] DEFAULT NULL)
RETURNS double precision LANGUAGE sql STABLE AS $$
  SELECT postjob.time_to_next_job_v2(p_workflows, p_versions, p_queues)
$$;

DROP FUNCTION IF EXISTS postjob.enqueue(varchar, varchar, varchar, varchar, jsonb, bigint, jsonb,
                              integer, double precision, timestamptz);
DROP FUNCTION IF EXISTS postjob.set_job_result(bigint, bigint, jsonb, varchar);
DROP FUNCTION IF EXISTS postjob.set_job_pending(bigint, bigint, bigint, varchar);
DROP FUNCTION IF EXISTS postjob.set_job_error(bigint, bigint, varchar, varchar, jsonb, varchar, varchar,
                                    boolean);
"""


@sends_scripts_whole
def upgrade() -> None:
    # committed first, then a moment for calls that began on the old functions to end
    own_transaction(SHAPES_SQL + RESOLVE_SQL, then_wait=1.0)
    index_step(INVALID_INDEX_DROP, INDEX_UP)
    op.execute(LOCK_TIMEOUT)
    for block in (WORKERS_SQL, REAP_SQL, CHECKOUT_SQL, FENCING_SQL, WAKEUPS_SQL, OPERATORS_SQL,
                  COMPAT_SQL):
        op.execute(block)
    index_step(OLD_INDEX_DOWN)


# -- downgrade: back to pj0001 exactly (its functions as it created them) ---------------------

DOWN_SQL = r"""
DROP FUNCTION postjob.worker_idle(text[], text[], text[], boolean);
DROP FUNCTION postjob.worker_cycle(bigint, varchar, bigint[], bigint[], text[], jsonb[], text[],
                                   text[], jsonb[], text[], bigint[], text[], text[], text[],
                                   integer, double precision, boolean, boolean);
DROP FUNCTION postjob.set_workflow_status(bigint, bigint, varchar);
DROP FUNCTION postjob.spawn_children(bigint, bigint, text[], text[], jsonb[], integer[],
                                     double precision[]);
DROP FUNCTION postjob.worker_heartbeat(bigint, double precision, bigint[], bigint[]);
DROP FUNCTION postjob.unregister_worker(bigint);
DROP FUNCTION postjob.register_worker(varchar, double precision, varchar, text[], text[]);
DROP FUNCTION postjob.oldest_served_code();

CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0001'::text
$$;
"""

# pj0001's bodies of the functions this revision replaced or dropped, verbatim from that
# revision (history: restored as they were).
DOWN_FUNCTIONS_SQL = r"""
CREATE OR REPLACE FUNCTION postjob.reap(p_fast_mode boolean DEFAULT false, p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  v_zombies integer := 0;
  v_final bigint[];
  v_timeouts bigint[];
  v_retry boolean;
BEGIN
  IF EXISTS (SELECT 1 FROM postjob.postjobs
             WHERE status = 'processing' AND lease_expires_at <= statement_timestamp()) THEN
    WITH expired AS (
      SELECT id FROM postjob.postjobs
      WHERE status = 'processing' AND lease_expires_at <= statement_timestamp()
      ORDER BY lease_expires_at
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED
    ), reaped AS (
      UPDATE postjob.postjobs j SET
        status = (CASE WHEN j.failed_attempts + 1 < j.max_attempts
                       THEN 'err' ELSE 'failed' END)::postjob.statuses,
        failed_attempts = j.failed_attempts + 1,
        error = 'Zombie',
        error_message = 'zombie: the lease expired (worker ' ||
          COALESCE(j.processing_client_identifier, j.processing_client, 'unknown') || ')',
        error_backtrace = NULL,
        next_run_at = CASE WHEN j.failed_attempts + 1 < j.max_attempts
                           THEN statement_timestamp() END,
        processing_client = NULL,
        processing_client_identifier = NULL,
        processing_started_at = NULL,
        processing_max_duration = NULL,
        lease_expires_at = NULL,
        lease_token = NULL,
        updated_at = statement_timestamp()
      FROM expired WHERE j.id = expired.id
      RETURNING j.id, j.status
    )
    SELECT count(*), array_agg(id) FILTER (WHERE status = 'failed'), bool_or(status = 'err')
      INTO v_zombies, v_final, v_retry
      FROM reaped;
    IF v_final IS NOT NULL THEN
      PERFORM postjob._jobs_ended(v_final, v_final);
    END IF;
    IF v_retry THEN
      PERFORM pg_notify('postjob_notifications', '');
    END IF;
  END IF;

  IF EXISTS (SELECT 1 FROM postjob.postjobs
             WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at <= statement_timestamp()) THEN
    WITH expired AS (
      SELECT id FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at <= statement_timestamp()
      ORDER BY timing_out_at
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED
    ), reaped AS (
      UPDATE postjob.postjobs j SET
        status = 'timeout',
        failed_attempts = j.failed_attempts + 1,
        error = 'Timeout',
        error_message = 'timeout',
        error_backtrace = NULL,
        next_run_at = NULL,
        awaiting_id = NULL,
        updated_at = statement_timestamp()
      FROM expired WHERE j.id = expired.id
      RETURNING j.id
    )
    SELECT array_agg(id) INTO v_timeouts FROM reaped;
    IF v_timeouts IS NOT NULL THEN
      PERFORM postjob._jobs_ended(v_timeouts, v_timeouts);
      RETURN v_zombies + cardinality(v_timeouts);
    END IF;
  END IF;
  RETURN v_zombies;
END;
$$;

CREATE OR REPLACE FUNCTION postjob.checkout(
  p_workflows text[],
  p_versions text[],
  p_queues text[] DEFAULT NULL,
  p_limit integer DEFAULT 1,
  p_lease double precision DEFAULT 60,
  p_fast_mode boolean DEFAULT false,
  p_reap boolean DEFAULT true)
RETURNS SETOF postjob.postjobs LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap(p_fast_mode);
  END IF;
  RETURN QUERY
  UPDATE postjob.postjobs j SET
    status = 'processing',
    next_run_at = NULL,
    error = NULL,
    error_message = NULL,
    error_backtrace = NULL,
    awaiting_id = NULL,
    processing_client = host(inet_client_addr()) || ':' || inet_client_port(),
    processing_client_identifier = postjob._client_identifier(),
    processing_started_at = statement_timestamp(),
    processing_max_duration = p_lease,
    lease_expires_at = statement_timestamp() + p_lease * interval '1 second',
    lease_token = nextval('postjob.lease_tokens'),
    updated_at = statement_timestamp()
  WHERE j.id = ANY (ARRAY(
    SELECT s.id FROM postjob.postjobs s
    WHERE s.status IN ('ready', 'err')
      AND s.next_run_at <= statement_timestamp()
      AND (s.timing_out_at IS NULL OR s.timing_out_at > statement_timestamp())
      AND (p_queues IS NULL OR s.queue = ANY (p_queues))
      AND EXISTS (SELECT 1 FROM unnest(p_workflows, p_versions) AS w(name, version)
                  WHERE w.name = s.workflow
                    AND (s.workflow_version = '' OR s.workflow_version = w.version))
    ORDER BY s.next_run_at
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED))
  RETURNING j.*;
END;
$$;

CREATE OR REPLACE FUNCTION postjob.time_to_next_job(
  p_workflows text[],
  p_versions text[],
  p_queues text[] DEFAULT NULL)
RETURNS double precision LANGUAGE sql STABLE AS $$
  SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(lease_expires_at) FROM postjob.postjobs WHERE status = 'processing'),
    (SELECT min(timing_out_at) FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL),
    (SELECT min(s.next_run_at) FROM postjob.postjobs s
      WHERE s.status IN ('ready', 'err')
        AND (p_queues IS NULL OR s.queue = ANY (p_queues))
        AND EXISTS (SELECT 1 FROM unnest(p_workflows, p_versions) AS w(name, version)
                    WHERE w.name = s.workflow
                      AND (s.workflow_version = '' OR s.workflow_version = w.version)))
  ) - statement_timestamp())::double precision
$$;

CREATE OR REPLACE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_wake bigint[];
  v_mark bigint[];
BEGIN
  IF cardinality(p_failed_ids) > 0 THEN
    UPDATE postjob.postjobs d SET
      status = 'timeout',
      error = 'Timeout',
      error_message = 'cancelled: job ' || a.id || ' ended with status ' || a.status,
      error_backtrace = NULL,
      next_run_at = NULL,
      awaiting_id = NULL,
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      updated_at = statement_timestamp()
    FROM postjob.postjobs a
    WHERE a.id = ANY (p_failed_ids)
      AND d.parent_id IS NOT NULL
      AND d.root_id = a.root_id
      AND d.full_id LIKE a.full_id || '.%'
      AND d.status NOT IN ('ok', 'failed', 'timeout');
  END IF;

  SELECT array_agg(l.id) FILTER (WHERE l.status = 'sleep'),
         array_agg(l.id) FILTER (WHERE l.status = 'processing')
    INTO v_wake, v_mark
    FROM (
      SELECT parent.id, parent.status
      FROM postjob.postjobs child
      JOIN postjob.postjobs parent ON parent.id = child.parent_id
      WHERE child.id = ANY (p_final_ids)
        AND ((parent.status = 'sleep'
              AND (parent.awaiting_id = child.id OR child.status IN ('failed', 'timeout')))
          OR (parent.status = 'processing' AND child.status IN ('failed', 'timeout')))
      ORDER BY parent.id
      FOR UPDATE OF parent
    ) l;

  IF v_mark IS NOT NULL THEN
    UPDATE postjob.postjobs SET next_run_at = statement_timestamp()
    WHERE id = ANY (v_mark) AND status = 'processing';
  END IF;
  IF v_wake IS NOT NULL THEN
    UPDATE postjob.postjobs SET
      status = 'ready',
      next_run_at = statement_timestamp(),
      awaiting_id = NULL,
      updated_at = statement_timestamp()
    WHERE id = ANY (v_wake) AND status = 'sleep';
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
END;
$$;

CREATE OR REPLACE FUNCTION postjob.reset_jobs(p_ids bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_ids bigint[];
BEGIN
  WITH targets AS (
    SELECT j.id FROM postjob.postjobs j WHERE j.id = ANY (p_ids)
    UNION
    SELECT d.id FROM postjob.postjobs a
      JOIN postjob.postjobs d ON d.parent_id IS NOT NULL AND d.root_id = a.root_id
                              AND d.full_id LIKE a.full_id || '.%'
      WHERE a.id = ANY (p_ids) AND d.status IN ('failed', 'timeout')
  ), reset AS (
    UPDATE postjob.postjobs j SET
      status = 'ready',
      next_run_at = statement_timestamp(),
      timing_out_at = CASE WHEN j.timeout IS NOT NULL
                           THEN statement_timestamp() + j.timeout * interval '1 second' END,
      results = NULL,
      failed_attempts = 0,
      error = NULL,
      error_message = NULL,
      error_backtrace = NULL,
      awaiting_id = NULL,
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      updated_at = statement_timestamp()
    FROM targets t WHERE j.id = t.id
    RETURNING j.id
  )
  SELECT array_agg(id ORDER BY id) INTO v_ids FROM reset;
  IF v_ids IS NOT NULL THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN COALESCE(v_ids, '{}');
END;
$$;

CREATE FUNCTION postjob.enqueue(
  p_queue varchar,
  p_workflow varchar,
  p_workflow_method varchar,
  p_workflow_version varchar,
  p_args jsonb,
  p_parent_id bigint,
  p_tags jsonb,
  p_max_attempts integer,
  p_timeout double precision,
  p_run_at timestamptz DEFAULT NULL)
RETURNS SETOF postjob.postjobs LANGUAGE sql AS $$
  INSERT INTO postjob.postjobs (queue, workflow, workflow_method, workflow_version, args,
                                parent_id, tags, max_attempts, timeout, next_run_at)
  VALUES (COALESCE(p_queue, 'q'), p_workflow, COALESCE(p_workflow_method, 'run'),
          COALESCE(p_workflow_version, ''), COALESCE(p_args, '[]'::jsonb), p_parent_id, p_tags,
          COALESCE(p_max_attempts, 5), p_timeout, COALESCE(p_run_at, statement_timestamp()))
  RETURNING *
$$;

CREATE FUNCTION postjob.set_job_result(
  p_job_id bigint, p_lease_token bigint, p_results jsonb, p_version varchar)
RETURNS boolean LANGUAGE sql AS $$
  SELECT cardinality(postjob.finish_jobs(
    ARRAY[p_job_id], ARRAY[p_lease_token], ARRAY['ok'], ARRAY[p_results], ARRAY[NULL::text],
    ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[p_version::text], ARRAY[NULL::bigint])) = 1
$$;

CREATE FUNCTION postjob.set_job_pending(
  p_job_id bigint, p_lease_token bigint, p_awaiting_id bigint, p_version varchar)
RETURNS boolean LANGUAGE sql AS $$
  SELECT cardinality(postjob.finish_jobs(
    ARRAY[p_job_id], ARRAY[p_lease_token], ARRAY['sleep'], ARRAY[NULL::jsonb],
    ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[p_version::text],
    ARRAY[p_awaiting_id])) = 1
$$;

CREATE FUNCTION postjob.set_job_error(
  p_job_id bigint, p_lease_token bigint, p_error varchar, p_error_message varchar,
  p_error_backtrace jsonb, p_status varchar, p_version varchar, p_fast_mode boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF p_status NOT IN ('err', 'failed') THEN
    RAISE EXCEPTION 'postjob: invalid error status %', p_status
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN cardinality(postjob.finish_jobs(
    ARRAY[p_job_id], ARRAY[p_lease_token], ARRAY[p_status::text], ARRAY[NULL::jsonb],
    ARRAY[p_error::text], ARRAY[p_error_message::text], ARRAY[p_error_backtrace],
    ARRAY[p_version::text], ARRAY[NULL::bigint], p_fast_mode)) = 1;
END;
$$;
"""

# pj0001's own shapes again (the row type of the table, which is pj0001's once more)
DOWN_SHAPES_SQL = r"""
DROP FUNCTION postjob.finish_and_checkout(bigint[], bigint[], text[], jsonb[], text[], text[],
  jsonb[], text[], bigint[], text[], text[], text[], integer, double precision, boolean, boolean);
DROP FUNCTION postjob.checkout(text[], text[], text[], integer, double precision, boolean,
  boolean);
CREATE FUNCTION postjob.checkout(
  p_workflows text[],
  p_versions text[],
  p_queues text[] DEFAULT NULL,
  p_limit integer DEFAULT 1,
  p_lease double precision DEFAULT 60,
  p_fast_mode boolean DEFAULT false,
  p_reap boolean DEFAULT true)
RETURNS SETOF postjob.postjobs LANGUAGE plpgsql AS $$ BEGIN END; $$;
CREATE FUNCTION postjob.finish_and_checkout(
  p_ids bigint[],
  p_lease_tokens bigint[],
  p_outcomes text[],
  p_results jsonb[],
  p_errors text[],
  p_messages text[],
  p_backtraces jsonb[],
  p_versions text[],
  p_awaiting bigint[],
  p_workflows text[],
  p_workflow_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision,
  p_fast_mode boolean,
  p_reap boolean DEFAULT true)
RETURNS SETOF postjob.postjobs LANGUAGE plpgsql AS $$
BEGIN
  IF cardinality(p_ids) > 0 THEN
    PERFORM postjob.finish_jobs(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors,
                                p_messages, p_backtraces, p_versions, p_awaiting, p_fast_mode);
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY SELECT * FROM postjob.checkout(p_workflows, p_workflow_versions, p_queues,
                                                p_limit, p_lease, p_fast_mode, p_reap);
  END IF;
END;
$$;

CREATE OR REPLACE FUNCTION postjob.resolve(
  p_token uuid, p_result jsonb, p_error varchar DEFAULT NULL, p_message varchar DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_job postjob.postjobs;
BEGIN
  SELECT j.* INTO v_job
    FROM postjob.tokens t JOIN postjob.postjobs j ON j.id = t.postjob_id
    WHERE t.token = p_token
    FOR UPDATE OF j;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: no job has the token %', p_token USING ERRCODE = 'no_data_found';
  END IF;
  IF v_job.workflow <> '__manual__' THEN
    RAISE EXCEPTION 'postjob: job % is not a manual job', v_job.id
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF v_job.status IN ('ok', 'failed', 'timeout') THEN
    RAISE EXCEPTION 'postjob: job % is already %', v_job.id, v_job.status
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  UPDATE postjob.postjobs SET
    status = (CASE WHEN p_error IS NULL THEN 'ok' ELSE 'failed' END)::postjob.statuses,
    results = CASE WHEN p_error IS NULL THEN jsonb_build_array(p_result) END,
    error = p_error,
    error_message = CASE WHEN p_error IS NOT NULL THEN COALESCE(p_message, p_error) END,
    failed_attempts = failed_attempts + CASE WHEN p_error IS NULL THEN 0 ELSE 1 END,
    next_run_at = NULL,
    updated_at = statement_timestamp()
  WHERE id = v_job.id;
  PERFORM postjob._jobs_ended(
    ARRAY[v_job.id], CASE WHEN p_error IS NULL THEN '{}'::bigint[] ELSE ARRAY[v_job.id] END);
  RETURN v_job.id;
END;
$$;
"""

DOWN_TABLES_SQL = r"""
DROP FUNCTION postjob.time_to_next_job_v2(text[], text[], text[]);
DROP FUNCTION postjob.checkout_v2(bigint, varchar, text[], text[], text[], integer,
                                  double precision);
DROP FUNCTION postjob._runnable_keys(text[], text[]);
DROP FUNCTION postjob.reap_v2(integer);
ALTER TABLE postjob.postjobs DROP COLUMN worker_id;
DROP TABLE postjob.workers;
"""


@sends_scripts_whole
def downgrade() -> None:
    index_step(OLD_INDEX_UP)
    op.execute(LOCK_TIMEOUT)
    op.execute(DOWN_SQL)
    op.execute(DOWN_TABLES_SQL)
    op.execute(DOWN_SHAPES_SQL)
    op.execute(DOWN_FUNCTIONS_SQL)
    index_step(INDEX_DOWN)
