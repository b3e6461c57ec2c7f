"""postjob schema: tables, indexes, triggers and the state-machine functions.

Revision ID: pj0001
Revises:
Create Date: 2026-11-29

Frozen history: later revisions change these objects with CREATE OR REPLACE / ALTER.
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import sends_scripts_whole

revision = "pj0001"
down_revision = None
branch_labels = ("postjob",)
depends_on = None

# Every function is schema-qualified throughout, so it works whatever the search_path.
# Functions use statement_timestamp(), not now(): a checkout inside a long caller transaction
# must see the time of the call, not the time the transaction began.

SCHEMA_SQL = r"""
CREATE SCHEMA IF NOT EXISTS postjob;

CREATE TYPE postjob.statuses AS ENUM (
  'ready', 'processing', 'sleep', 'failed', 'err', 'timeout', 'ok'
);

CREATE SEQUENCE postjob.lease_tokens;

CREATE TABLE postjob.postjobs (
  id                            bigserial PRIMARY KEY,
  parent_id                     bigint REFERENCES postjob.postjobs (id) ON DELETE CASCADE,
  root_id                       bigint,
  full_id                       varchar,
  created_at                    timestamptz NOT NULL DEFAULT now(),
  updated_at                    timestamptz NOT NULL DEFAULT now(),
  queue                         varchar NOT NULL DEFAULT 'q',
  workflow                      varchar NOT NULL,
  workflow_method               varchar NOT NULL DEFAULT 'run',
  workflow_version              varchar NOT NULL DEFAULT '',
  args                          jsonb NOT NULL DEFAULT '[]'::jsonb,
  status                        postjob.statuses NOT NULL DEFAULT 'ready',
  next_run_at                   timestamptz DEFAULT now(),
  timeout                       double precision,
  timing_out_at                 timestamptz,
  failed_attempts               integer NOT NULL DEFAULT 0,
  max_attempts                  integer NOT NULL DEFAULT 5,
  results                       jsonb,
  error                         varchar,
  error_message                 varchar,
  error_backtrace               jsonb,
  workflow_status               varchar,
  tags                          jsonb,
  awaiting_id                   bigint,
  processing_client             varchar,
  processing_client_identifier  varchar,
  processing_started_at         timestamptz,
  processing_max_duration       double precision,
  lease_expires_at              timestamptz,
  lease_token                   bigint,
  CONSTRAINT postjobs_args_array CHECK (jsonb_typeof(args) = 'array'),
  CONSTRAINT postjobs_tags_object CHECK (tags IS NULL OR jsonb_typeof(tags) = 'object'),
  CONSTRAINT postjobs_max_attempts_positive CHECK (max_attempts >= 1),
  CONSTRAINT postjobs_timeout_positive CHECK (timeout IS NULL OR timeout > 0),
  CONSTRAINT postjobs_lease_while_processing
    CHECK ((status = 'processing') = (lease_token IS NOT NULL))
) WITH (fillfactor = 90);

CREATE INDEX postjobs_runnable_idx ON postjob.postjobs (next_run_at)
  WHERE status IN ('ready', 'err');
CREATE INDEX postjobs_timing_out_idx ON postjob.postjobs (timing_out_at)
  WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL;
CREATE INDEX postjobs_lease_idx ON postjob.postjobs (lease_expires_at)
  WHERE status = 'processing';
CREATE UNIQUE INDEX postjobs_child_key_idx
  ON postjob.postjobs (parent_id, workflow, workflow_method, md5(args::text))
  WHERE parent_id IS NOT NULL;
-- Trees: only children need it (a root is found by its id); tags: only tagged jobs.
-- Partial indexes keep the non-HOT updates of untagged root jobs cheap.
CREATE INDEX postjobs_tree_idx ON postjob.postjobs (root_id, full_id text_pattern_ops)
  WHERE parent_id IS NOT NULL;
CREATE INDEX postjobs_tags_idx ON postjob.postjobs USING gin (tags jsonb_path_ops)
  WHERE tags IS NOT NULL;

CREATE TABLE postjob.tokens (
  id          bigserial PRIMARY KEY,
  postjob_id  bigint NOT NULL UNIQUE REFERENCES postjob.postjobs (id) ON DELETE CASCADE,
  token       uuid NOT NULL UNIQUE,
  created_at  timestamptz NOT NULL DEFAULT now()
);
"""

TRIGGERS_SQL = r"""
-- root_id, full_id and the deadline are derived in the INSERT itself, so a plain
-- session.add(Job(...)) gets them right.
CREATE FUNCTION postjob._fill_job_ids() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  v_root_id bigint;
  v_full_id varchar;
BEGIN
  IF NEW.parent_id IS NULL THEN
    NEW.root_id := NEW.id;
    NEW.full_id := NEW.id::varchar;
  ELSE
    SELECT p.root_id, p.full_id INTO v_root_id, v_full_id
      FROM postjob.postjobs p WHERE p.id = NEW.parent_id;
    NEW.root_id := COALESCE(v_root_id, NEW.parent_id);
    NEW.full_id := COALESCE(v_full_id, NEW.parent_id::varchar) || '.' || NEW.id;
  END IF;
  IF NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL THEN
    NEW.timing_out_at := statement_timestamp() + NEW.timeout * interval '1 second';
  END IF;
  RETURN NEW;
END;
$$;

CREATE TRIGGER postjobs_fill_ids BEFORE INSERT ON postjob.postjobs
  FOR EACH ROW
  WHEN (NEW.root_id IS NULL OR NEW.full_id IS NULL
        OR (NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL))
  EXECUTE FUNCTION postjob._fill_job_ids();

-- New jobs wake idle workers: one notification per inserting statement (NOTIFYs with the
-- same payload fold within a transaction). Updates notify from the functions below, and only
-- when a job becomes runnable or a retry is scheduled.
CREATE FUNCTION postjob._notify_workers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('postjob_notifications', '');
  RETURN NULL;
END;
$$;

CREATE TRIGGER postjobs_notify_insert AFTER INSERT ON postjob.postjobs
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._notify_workers();
"""

FUNCTIONS_SQL = r"""
CREATE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0001'::text
$$;

-- Retry delay after the n-th failed attempt: base * 1.5^n (base 10 s, 0.01 s in fast mode).
CREATE FUNCTION postjob._backoff(p_failed_attempts integer, p_fast_mode boolean)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
  SELECT (CASE WHEN p_fast_mode THEN 0.01 ELSE 10 END)
         * power(1.5, p_failed_attempts) * interval '1 second'
$$;

CREATE FUNCTION postjob.set_client_identifier(p_identifier varchar) RETURNS void
LANGUAGE sql AS $$
  SELECT set_config('postjob.client_identifier', p_identifier, false);
$$;

CREATE FUNCTION postjob._client_identifier() RETURNS varchar LANGUAGE sql STABLE AS $$
  SELECT NULLIF(current_setting('postjob.client_identifier', true), '')
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

-- What happens when jobs reach a final state: the non-final descendants of failed and
-- timed-out jobs are timed out (no orphan work keeps running); sleeping parents that wait
-- for one of these jobs (or that have a child that failed) become ready; processing parents
-- of a failed or timed-out child are marked (next_run_at = now, unused while processing) so
-- that their coming 'sleep' turns into 'ready' (see finish_jobs).
CREATE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
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

  -- Lock the parents to wake or mark (the lock re-reads a parent whose own finish is
  -- committing), in id order (no deadlocks between batches), then update them by id.
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

-- Reap expired leases (zombies: a recoverable error, retried at once) and passed deadlines
-- (timeout, final).
-- Called by every checkout; callable on its own (postjob reap, cron). Returns jobs reaped.
CREATE FUNCTION postjob.reap(p_fast_mode boolean DEFAULT false, p_limit integer DEFAULT 1000)
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
        -- the job did not fail, its worker vanished: retry at once (the attempt still
        -- counts, so a job that keeps killing its worker ends failed)
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

-- Check out up to p_limit runnable jobs of the given (workflow, version) pairs, oldest due
-- first, each with a lease of p_lease seconds and a fresh lease token (the fencing token
-- every later write must present). A job pinned to version '' matches any registered version.
-- With p_reap (the default) it first reaps expired leases and deadlines; a worker passes false
-- when it reaped less than a second ago, keeping the reap off its wake-up path.
CREATE FUNCTION postjob.checkout(
  p_workflows text[],
  p_versions text[],
  p_queues text[] DEFAULT NULL,
  p_limit integer DEFAULT 1,
  p_lease double precision DEFAULT 60,
  p_fast_mode boolean DEFAULT false,
  p_reap boolean DEFAULT true)
RETURNS SETOF postjob.postjobs LANGUAGE plpgsql
-- One cached plan, whatever p_limit: custom plans would be re-planned on every call (their
-- estimate beats the generic one's), and the shape above is right for any limit.
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

-- Seconds until a worker for these workflows has something to do (negative: overdue;
-- NULL: nothing scheduled). Counts leases and deadlines of any workflow, since any worker
-- reaps them.
CREATE FUNCTION postjob.time_to_next_job(
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

-- Extend the leases of running jobs (the worker's heartbeat). Returns how many still held.
CREATE FUNCTION postjob.extend_leases(
  p_ids bigint[], p_lease_tokens bigint[], p_lease double precision)
RETURNS integer LANGUAGE sql AS $$
  WITH extended AS (
    UPDATE postjob.postjobs j SET
      lease_expires_at = statement_timestamp() + p_lease * interval '1 second',
      processing_max_duration = EXTRACT(EPOCH FROM statement_timestamp() - j.processing_started_at) + p_lease
    FROM unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
    WHERE j.id = h.id AND j.lease_token = h.lease_token
    RETURNING 1
  )
  SELECT count(*)::integer FROM extended
$$;

-- Record the outcomes of a batch of runs in one statement. Outcomes: 'ok' (with a result
-- stored as [value]), 'err' (recoverable: retried with back-off until max_attempts), 'failed'
-- (final), 'sleep' (waits for the child p_awaiting; goes to ready at once if that child has
-- already finished or a child failed during the run: no lost wake-up), 'release' (back to
-- ready, no attempt counted).
-- A write only applies to a job still processing under the same lease token (fencing).
-- Returns the ids whose outcome was recorded; the others had lost their lease.
CREATE FUNCTION postjob.finish_jobs(
  p_ids bigint[],
  p_lease_tokens bigint[],
  p_outcomes text[],
  p_results jsonb[],
  p_errors text[],
  p_messages text[],
  p_backtraces jsonb[],
  p_versions text[],
  p_awaiting bigint[],
  p_fast_mode boolean DEFAULT false)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_sleeping bigint[];
  v_awaited_final bigint[] := '{}';
  v_marked bigint[] := '{}';
  v_accepted bigint[];
  v_final bigint[];
  v_failed bigint[];
  v_runnable boolean;
BEGIN
  IF 'sleep' = ANY (p_outcomes) THEN
    SELECT array_agg(i.id) INTO v_sleeping
      FROM unnest(p_ids, p_outcomes) AS i(id, outcome) WHERE i.outcome = 'sleep';
    -- Lock first, read after, in separate statements (a status filter in the locking
    -- statement would be applied to the old row version, below the lock): a lock waits for
    -- a completion of an awaited child (or a failed child's mark on this job) that is
    -- committing right now, and the reads that follow take a new snapshot that sees it. The
    -- locks also hold back a completion that starts now until this sleep has committed, so
    -- it finds the job asleep. Children before parents, as a completion locks them.
    PERFORM 1 FROM postjob.postjobs WHERE id = ANY (p_awaiting) ORDER BY id FOR SHARE;
    PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_sleeping) ORDER BY id FOR UPDATE;
    SELECT COALESCE(array_agg(id), '{}') INTO v_awaited_final FROM postjob.postjobs
      WHERE id = ANY (p_awaiting) AND status IN ('ok', 'failed', 'timeout');
    SELECT COALESCE(array_agg(id), '{}') INTO v_marked FROM postjob.postjobs
      WHERE id = ANY (v_sleeping) AND status = 'processing' AND next_run_at IS NOT NULL;
  END IF;

  WITH updated AS (
    UPDATE postjob.postjobs j SET
      status = (CASE
        WHEN i.outcome = 'ok' THEN 'ok'
        WHEN i.outcome = 'failed' THEN 'failed'
        WHEN i.outcome = 'err' AND j.failed_attempts + 1 < j.max_attempts THEN 'err'
        WHEN i.outcome = 'err' THEN 'failed'
        WHEN i.outcome = 'sleep'
             AND (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked)) THEN 'ready'
        WHEN i.outcome = 'sleep' THEN 'sleep'
        WHEN i.outcome = 'release' THEN 'ready'
      END)::postjob.statuses,
      results = CASE WHEN i.outcome = 'ok' THEN i.result END,
      error = CASE WHEN i.outcome IN ('err', 'failed') THEN i.error END,
      error_message = CASE WHEN i.outcome IN ('err', 'failed') THEN i.message END,
      error_backtrace = CASE WHEN i.outcome IN ('err', 'failed') THEN i.backtrace END,
      failed_attempts = j.failed_attempts
        + CASE WHEN i.outcome IN ('err', 'failed') THEN 1 ELSE 0 END,
      next_run_at = CASE
        WHEN i.outcome = 'err' AND j.failed_attempts + 1 < j.max_attempts
          THEN statement_timestamp() + postjob._backoff(j.failed_attempts + 1, p_fast_mode)
        WHEN i.outcome = 'release'
          OR (i.outcome = 'sleep'
              AND (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked)))
          THEN statement_timestamp()
      END,
      awaiting_id = CASE WHEN i.outcome = 'sleep'
                          AND NOT (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked))
                         THEN i.awaiting END,
      workflow_version = COALESCE(i.version, j.workflow_version),
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      updated_at = statement_timestamp()
    FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors, p_messages,
                p_backtraces, p_versions, p_awaiting)
      AS i(id, lease_token, outcome, result, error, message, backtrace, version, awaiting)
    -- the lease token alone fences: it is set exactly while the job is processing (a check
    -- constraint says so), and matching it rather than the status keeps the planner on the
    -- primary key instead of the partial index of processing jobs
    WHERE j.id = i.id AND j.lease_token = i.lease_token
    RETURNING j.id, j.status, j.parent_id
  )
  SELECT array_agg(id),
         -- a final job matters to its parent, and a failed one to its descendants
         array_agg(id) FILTER (WHERE (parent_id IS NOT NULL AND status IN ('ok', 'failed'))
                                  OR status = 'failed'),
         array_agg(id) FILTER (WHERE status = 'failed'),
         bool_or(status IN ('err', 'ready'))
    INTO v_accepted, v_final, v_failed, v_runnable
    FROM updated;

  IF v_final IS NOT NULL THEN
    PERFORM postjob._jobs_ended(v_final, COALESCE(v_failed, '{}'));
  END IF;
  IF v_runnable THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  IF cardinality(v_accepted) IS DISTINCT FROM cardinality(p_ids) THEN
    RAISE NOTICE 'postjob: lease lost for jobs %',
      (SELECT array_agg(x) FROM unnest(p_ids) x WHERE x <> ALL (COALESCE(v_accepted, '{}')));
  END IF;
  RETURN COALESCE(v_accepted, '{}');
END;
$$;

-- The worker's cycle in one round trip: record the outcomes of the previous batch, then
-- check out the next one (one transaction per batch instead of two).
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

-- The seed's single-job result functions, as thin wrappers over finish_jobs.
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

-- The token of a manual job, created on first use.
CREATE FUNCTION postjob.manual_token(p_job_id bigint) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
  v_token uuid;
BEGIN
  INSERT INTO postjob.tokens (postjob_id, token) VALUES (p_job_id, gen_random_uuid())
    ON CONFLICT (postjob_id) DO NOTHING
    RETURNING token INTO v_token;
  IF v_token IS NULL THEN
    SELECT token INTO v_token FROM postjob.tokens WHERE postjob_id = p_job_id;
  END IF;
  RETURN v_token;
END;
$$;

-- Finish a non-final manual job by its token: ok with p_result, or failed when p_error is
-- given. Wakes the parent. Returns the job id.
CREATE FUNCTION postjob.resolve(
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

-- Operator reset: the given jobs and their failed or timed-out descendants become ready with
-- attempts and errors cleared and, where a timeout was set, a fresh deadline.
CREATE FUNCTION postjob.reset_jobs(p_ids bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
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

-- Run a waiting job as soon as possible: ready/err get next_run_at = now, a sleeping job
-- becomes ready (it re-runs and sleeps again if its child is unfinished). Returns false
-- for jobs in any other state.
CREATE FUNCTION postjob.force_job(p_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  UPDATE postjob.postjobs SET
    status = CASE WHEN status = 'sleep' THEN 'ready'::postjob.statuses ELSE status END,
    next_run_at = statement_timestamp(),
    awaiting_id = NULL,
    updated_at = statement_timestamp()
  WHERE id = p_id AND status IN ('ready', 'err', 'sleep');
  IF FOUND THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN FOUND;
END;
$$;
"""


@sends_scripts_whole
def upgrade() -> None:
    op.execute(SCHEMA_SQL)
    op.execute(TRIGGERS_SQL)
    op.execute(FUNCTIONS_SQL)


def downgrade() -> None:
    op.execute("DROP SCHEMA postjob CASCADE")
