-- Outcomes: how runs end, recorded in batches, and what a job's end means for its family.
--
-- A worker sends the outcomes of many runs in one call (postjob.worker_cycle_v3, or
-- postjob.finish_jobs_v3 for a transactional job and JobQueue.complete/fail). The runs that
-- ended ok, nearly all of them, come as parallel arrays (ids, lease tokens, [value] results,
-- versions), the others as one JSON array with one element per run:
--   [id, lease_token, kind, result, error, message, backtrace, version, awaiting, retry_in,
--    wake_in]
-- kind is ok, err, failed, sleep or release; result is the run's [value] (ok); error, message
-- and backtrace describe a failure; version is the workflow version that ran; awaiting is the
-- child a sleeping parent waits for; retry_in is the seconds an err outcome waits before its
-- next attempt (the workflow's back-off: a policy of the Python code, never of the database);
-- wake_in, when a sleep has it, is the seconds until it runs again whatever wakes it before
-- (a durable sleep, an event's timeout: durable.sql), else it waits to be woken. The last
-- elements may be left out.
-- Each outcome is fenced on its lease token: a run that lost its job (cancelled, reaped,
-- reset) records nothing.

-- Record a batch of outcomes (the format is at the top of this file). p_done names the lease
-- tokens whose jobs have all ended (the worker knows): their lease rows go. Returns one row
-- per outcome that was not recorded ('lost': the run no longer held its job) and per sleep
-- that did not sleep ('woken': what it waited for had ended meanwhile).
CREATE OR REPLACE FUNCTION postjob.finish_jobs_v3(
  p_ok_ids bigint[], p_ok_tokens bigint[], p_ok_results jsonb[], p_ok_versions text[],
  p_outcomes jsonb, p_done bigint[])
RETURNS TABLE (kind text, id bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_sleeping bigint[];
  v_awaiting bigint[];
  v_awaited_final bigint[] := '{}';
  v_marked bigint[] := '{}';
  v_accepted bigint[];
  v_final bigint[];
  v_failed bigint[];
  v_woken bigint[];
  v_runnable boolean := false;
  v_waiting boolean := false;
  v_ids bigint[];
  v_ok bigint[];
  v_ok_final bigint[];
BEGIN
  IF cardinality(p_ok_ids) > 0 THEN
    -- the runs that ended ok: one lean UPDATE (HOT: nothing it changes is indexed)
    WITH done AS (
      UPDATE postjob.postjobs j SET
        status = 'ok',
        results = i.result,
        error = NULL,
        error_message = NULL,
        error_backtrace = NULL,
        next_run_at = NULL,
        awaiting_id = NULL,
        workflow_version = COALESCE(i.version, j.workflow_version),
        processing_client = NULL,
        processing_client_identifier = NULL,
        processing_started_at = NULL,
        processing_max_duration = NULL,
        lease_expires_at = NULL,
        lease_token = NULL,
        worker_id = NULL,
        unique_key_held = false,
        updated_at = v_now
      FROM unnest(p_ok_ids, p_ok_tokens, p_ok_results, p_ok_versions)
        AS i(id, token, result, version)
      WHERE j.id = ANY (p_ok_ids) AND j.id = i.id AND j.lease_token = i.token
      RETURNING j.id, j.parent_id
    )
    SELECT array_agg(d.id), array_agg(d.id) FILTER (WHERE d.parent_id IS NOT NULL)
      INTO v_ok, v_ok_final FROM done d;
    IF cardinality(v_ok) IS DISTINCT FROM cardinality(p_ok_ids) THEN
      RETURN QUERY SELECT 'lost'::text, x FROM unnest(p_ok_ids) AS x
        WHERE x <> ALL (COALESCE(v_ok, '{}'));
    END IF;
  END IF;

  IF jsonb_array_length(p_outcomes) > 0 THEN
    SELECT array_agg((e->>0)::bigint), array_agg((e->>8)::bigint)
      INTO v_sleeping, v_awaiting
      FROM jsonb_array_elements(p_outcomes) e WHERE e->>2 = 'sleep';
    IF v_sleeping IS NOT NULL THEN
      -- Lock first, read after, in separate statements (a status filter in the locking
      -- statement would be applied to the old row version, below the lock): a lock waits for
      -- a completion of an awaited child (or a failed child's mark on this job) that is
      -- committing right now, and the reads that follow take a new snapshot that sees it. The
      -- locks also hold back a completion that starts now until this sleep has committed, so
      -- it finds the job asleep. Children before parents, as a completion locks them.
      PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_awaiting) ORDER BY id FOR SHARE;
      PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_sleeping) ORDER BY id FOR UPDATE;
      SELECT COALESCE(array_agg(id), '{}') INTO v_awaited_final FROM postjob.postjobs
        WHERE id = ANY (v_awaiting) AND status IN ('ok', 'failed', 'timeout', 'cancelled');
      SELECT COALESCE(array_agg(id), '{}') INTO v_marked FROM postjob.postjobs
        WHERE id = ANY (v_sleeping) AND status = 'processing' AND next_run_at IS NOT NULL;
    END IF;

    v_ids := ARRAY(SELECT (e->>0)::bigint FROM jsonb_array_elements(p_outcomes) e);
    WITH o AS (
      SELECT (e->>0)::bigint AS id, (e->>1)::bigint AS token, e->>2 AS kind, e->3 AS result,
             e->>4 AS error, e->>5 AS message, e->6 AS backtrace, e->>7 AS version,
             (e->>8)::bigint AS awaiting, COALESCE((e->>9)::float8, 0) AS retry_in,
             (e->>10)::float8 AS wake_in
      FROM jsonb_array_elements(p_outcomes) e
    ), i AS (
      SELECT o.*, (o.kind = 'sleep'
                   AND (o.awaiting = ANY (v_awaited_final) OR o.id = ANY (v_marked))) AS woken
      FROM o
    ), updated AS (
      UPDATE postjob.postjobs j SET
        status = (CASE
          WHEN i.kind = 'ok' THEN 'ok'
          WHEN i.kind = 'failed' THEN 'failed'
          WHEN i.kind = 'err' AND j.failed_attempts + 1 < j.max_attempts THEN 'err'
          WHEN i.kind = 'err' THEN 'failed'
          WHEN i.kind = 'sleep' AND i.woken THEN 'ready'
          WHEN i.kind = 'sleep' THEN 'sleep'
          WHEN i.kind = 'release' THEN 'ready'
        END)::postjob.statuses,
        results = CASE WHEN i.kind = 'ok' THEN i.result END,
        error = CASE WHEN i.kind IN ('err', 'failed') THEN i.error END,
        error_message = CASE WHEN i.kind IN ('err', 'failed') THEN i.message END,
        error_backtrace = CASE WHEN i.kind IN ('err', 'failed') THEN i.backtrace END,
        failed_attempts = j.failed_attempts
          + CASE WHEN i.kind IN ('err', 'failed') THEN 1 ELSE 0 END,
        next_run_at = CASE
          WHEN i.kind = 'err' AND j.failed_attempts + 1 < j.max_attempts
            THEN v_now + greatest(i.retry_in, 0) * interval '1 second'
          WHEN i.kind = 'release' OR i.woken THEN v_now
          WHEN i.kind = 'sleep' THEN v_now + i.wake_in * interval '1 second'
        END,
        awaiting_id = CASE WHEN i.kind = 'sleep' AND NOT i.woken THEN i.awaiting END,
        workflow_version = COALESCE(i.version, j.workflow_version),
        processing_client = NULL,
        processing_client_identifier = NULL,
        processing_started_at = NULL,
        processing_max_duration = NULL,
        lease_expires_at = NULL,
        lease_token = NULL,
        worker_id = NULL,
        unique_key_held = j.unique_key_held
          AND NOT (i.kind IN ('ok', 'failed')
                   OR (i.kind = 'err' AND j.failed_attempts + 1 >= j.max_attempts)),
        updated_at = v_now
      FROM i
      -- the lease token alone fences: it is set exactly while the job is processing (a check
      -- constraint says so)
      -- (by id from an array too: a generic plan would not know the batch is small)
      WHERE j.id = ANY (v_ids) AND j.id = i.id AND j.lease_token = i.token
      RETURNING j.id, j.status, j.parent_id, j.workflow, j.workflow_version, j.queue,
                j.priority, j.next_run_at, j.timing_out_at, i.woken
    ), waits AS (
      INSERT INTO postjob.waiting (job_id, status, workflow, workflow_version, queue, priority,
                                   run_at, due, timing_out_at)
      SELECT u.id, u.status, u.workflow, u.workflow_version, u.queue, u.priority, u.next_run_at,
             u.next_run_at IS NOT NULL AND u.next_run_at <= v_now, u.timing_out_at
      FROM updated u WHERE u.status IN ('ready', 'err', 'sleep')
      ON CONFLICT (job_id) DO NOTHING
      RETURNING 1
    )
    SELECT array_agg(u.id),
           -- a final job matters to its parent, and a failed one to its descendants
           array_agg(u.id) FILTER (WHERE (u.parent_id IS NOT NULL AND u.status IN ('ok', 'failed'))
                                    OR u.status = 'failed'),
           array_agg(u.id) FILTER (WHERE u.status = 'failed'),
           array_agg(u.id) FILTER (WHERE u.woken),
           bool_or(u.status = 'ready' OR (u.status = 'err' AND u.next_run_at <= v_now)),
           bool_or(u.status = 'err' OR (u.status = 'sleep' AND u.next_run_at IS NOT NULL))
      INTO v_accepted, v_final, v_failed, v_woken, v_runnable, v_waiting
      FROM updated u;

    RETURN QUERY
      SELECT 'lost'::text, (e->>0)::bigint FROM jsonb_array_elements(p_outcomes) e
      WHERE (e->>0)::bigint <> ALL (COALESCE(v_accepted, '{}'));
    RETURN QUERY SELECT 'woken'::text, w FROM unnest(v_woken) AS w;
  END IF;

  v_accepted := COALESCE(v_accepted, '{}') || COALESCE(v_ok, '{}');
  v_final := COALESCE(v_final, '{}') || COALESCE(v_ok_final, '{}');
  IF cardinality(v_accepted) > 0 THEN
    IF EXISTS (SELECT 1 FROM postjob.queue_slots WHERE job_id IS NOT NULL) THEN
      WITH freed AS (
        UPDATE postjob.queue_slots SET job_id = NULL WHERE job_id = ANY (v_accepted)
        RETURNING queue
      )
      -- a freed place may let a waiting job of its queue start: wake the idle workers
      SELECT v_runnable OR count(*) > 0 INTO v_runnable FROM freed;
    END IF;
    IF cardinality(v_final) > 0 THEN
      PERFORM postjob._jobs_ended(v_final, COALESCE(v_failed, '{}'));
    END IF;
    IF v_runnable OR v_waiting THEN
      PERFORM pg_notify('postjob_notifications', '');
    END IF;
  END IF;
  IF cardinality(p_done) > 0 THEN
    DELETE FROM postjob.leases WHERE token = ANY (p_done);
  END IF;
END;
$$;
