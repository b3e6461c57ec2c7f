-- Outcomes: how runs end, recorded in batches, and what a job's end means for its family.
--
-- A worker sends the outcomes of many runs in one call (postjob.finish_v4, in the same
-- statement as its next checkout), as typed arrays:
--   - the runs of root jobs that ended ok, nearly all of them: ids, lease tokens, [value]
--     results, the workflow versions that ran;
--   - every other outcome, one array element each: id, lease token, kind (ok, err, failed,
--     sleep or release), error, message, backtrace (failures), version, the child a sleeping
--     parent waits for (awaiting), and delay: for err, the seconds before the next attempt
--     (the workflow's back-off: a policy of the Python code, never of the database); for a
--     sleep, the seconds until it runs again whatever wakes it before (a durable sleep, an
--     event's timeout: durable.sql), or NULL (it waits to be woken);
--   - the runs that stopped without an outcome to record (their job was ended from outside
--     while they ran): ids and lease tokens.
-- Each outcome is fenced on its lease token: a run that lost its job (cancelled, reaped,
-- reset) records nothing.

-- Record a batch of outcomes (the format is at the top of this file). Returns one row per
-- outcome that was not recorded ('lost': the run no longer held its job) and per sleep that
-- did not sleep ('woken': what it waited for had ended meanwhile).
CREATE OR REPLACE FUNCTION postjob.finish_v4(
  p_ok_ids bigint[], p_ok_tokens bigint[], p_ok_results jsonb[], p_ok_versions text[],
  p_ids bigint[], p_tokens bigint[], p_kinds text[], p_errors text[], p_messages text[],
  p_backtraces jsonb[], p_versions text[], p_awaiting bigint[], p_delays double precision[],
  p_stopped bigint[], p_stopped_tokens bigint[])
RETURNS TABLE (kind text, id bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_done bigint[] := '{}';
  v_queues varchar[];
  v_rest bigint[];
BEGIN
  IF cardinality(p_ok_ids) > 0 THEN
    -- runs of root jobs that ended ok: their rows go, their records are settled (HOT)
    WITH done AS (
      DELETE FROM postjob.unfinished u USING unnest(p_ok_ids, p_ok_tokens) AS o(id, token)
      WHERE u.job_id = ANY (p_ok_ids) AND u.job_id = o.id AND u.lease_token = o.token
        AND u.parent_id IS NULL AND u.status IN ('ready', 'err', 'sleep')
      RETURNING u.job_id
    ), settled AS (
      UPDATE postjob.postjobs j SET
        status = 'ok', results = r.result, error = NULL, error_message = NULL,
        error_backtrace = NULL, next_run_at = NULL, awaiting_id = NULL,
        workflow_version = COALESCE(r.version, j.workflow_version),
        processing_client = NULL, processing_client_identifier = NULL,
        processing_started_at = NULL, processing_max_duration = NULL,
        unique_key_held = false, updated_at = v_now
      FROM unnest(p_ok_ids, p_ok_results, p_ok_versions) AS r(id, result, version)
      WHERE j.id = ANY (ARRAY(SELECT d.job_id FROM done d)) AND j.id = r.id
      RETURNING j.id, j.queue
    )
    SELECT COALESCE(array_agg(s.id), '{}'), array_agg(s.queue) INTO v_done, v_queues
    FROM settled s;
    IF EXISTS (SELECT 1 FROM postjob.queue_slots WHERE job_id IS NOT NULL) THEN
      PERFORM postjob._free_places(v_done);
    END IF;
    IF cardinality(v_done) > 0 THEN
      PERFORM postjob._count_settled(
        v_queues, array_fill('ok'::postjob.statuses, ARRAY[cardinality(v_done)]));
    END IF;
  END IF;
  -- the rest (children that ended ok, failures, sleeps, releases, runs that stopped, and a
  -- run that lost its job): one more function, whose locks keep the order of schema.sql
  v_rest := ARRAY(SELECT x FROM unnest(p_ok_ids) x WHERE x <> ALL (v_done));
  IF cardinality(v_rest) > 0 OR cardinality(p_ids) > 0 OR cardinality(p_stopped) > 0 THEN
    RETURN QUERY
    SELECT s.kind, s.id FROM postjob._settle(
      p_ids || v_rest,
      p_tokens || ARRAY(SELECT o.token FROM unnest(p_ok_ids, p_ok_tokens) AS o(id, token)
                        WHERE o.id = ANY (v_rest)),
      p_kinds || array_fill('ok'::text, ARRAY[cardinality(v_rest)]),
      array_fill(NULL::jsonb, ARRAY[cardinality(p_ids)])
        || ARRAY(SELECT o.result FROM unnest(p_ok_ids, p_ok_results) AS o(id, result)
                 WHERE o.id = ANY (v_rest)),
      p_errors || array_fill(NULL::text, ARRAY[cardinality(v_rest)]),
      p_messages || array_fill(NULL::text, ARRAY[cardinality(v_rest)]),
      p_backtraces || array_fill(NULL::jsonb, ARRAY[cardinality(v_rest)]),
      p_versions || ARRAY(SELECT o.version FROM unnest(p_ok_ids, p_ok_versions) AS o(id, version)
                          WHERE o.id = ANY (v_rest)),
      p_awaiting || array_fill(NULL::bigint, ARRAY[cardinality(v_rest)]),
      p_delays || array_fill(NULL::double precision, ARRAY[cardinality(v_rest)]),
      p_stopped, p_stopped_tokens) s;
  END IF;
END;
$$;

-- Give back the places in limited queues of these jobs, whose runs have ended; a freed place
-- may let a waiting job of its queue start: an idle worker is woken.
CREATE OR REPLACE FUNCTION postjob._free_places(p_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  v_freed integer;
BEGIN
  -- a place another transaction holds (a change of the queue's limits) is left: the reaper
  -- frees a place whose job no longer runs
  UPDATE postjob.queue_slots s SET job_id = NULL
  WHERE (s.queue, s.slot) IN (SELECT x.queue, x.slot FROM postjob.queue_slots x
                              WHERE x.job_id = ANY (p_ids) FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS v_freed = ROW_COUNT;
  IF v_freed > 0 THEN
    PERFORM postjob._wake(v_freed);
  END IF;
END;
$$;

-- Whether a sleep ends at once: the child it waits for has ended, a child's end is still to
-- be told (postjob.wakeups), or its run was marked (a child failed while it ran).
CREATE OR REPLACE FUNCTION postjob._sleep_woken(p_id bigint, p_awaiting bigint, p_marked boolean)
RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT p_marked
    OR EXISTS (SELECT 1 FROM postjob.postjobs c WHERE c.id = p_awaiting
               AND c.status IN ('ok', 'failed', 'timeout', 'cancelled'))
    OR EXISTS (SELECT 1 FROM postjob.wakeups n JOIN postjob.postjobs c ON c.id = n.job_id
               WHERE c.parent_id = p_id)
$$;

-- What an outcome makes of its job: the status, and when it runs next (an error's back-off,
-- a sleep's delay, a release or a woken sleep at once; NULL: a final status or a sleep
-- without an end of its own); and whether it is a sleep woken at once.
CREATE OR REPLACE FUNCTION postjob._outcome_next(
  p_kind text, p_delay double precision, p_status postjob.statuses, p_woken boolean,
  p_failed_attempts integer, p_max_attempts integer, p_now timestamptz)
RETURNS TABLE (status postjob.statuses, run_at timestamptz, woken boolean)
LANGUAGE sql IMMUTABLE AS $$
  SELECT (CASE WHEN p_kind = 'ok' THEN 'ok'
               WHEN p_kind = 'failed' OR (p_kind = 'err' AND p_failed_attempts + 1 >= p_max_attempts)
                 THEN 'failed'
               WHEN p_kind = 'err' THEN 'err'
               WHEN p_kind = 'sleep' AND NOT p_woken THEN 'sleep'
               WHEN p_kind = 'sleep' THEN 'ready'
               ELSE p_status END)::postjob.statuses,
         CASE WHEN p_kind = 'err' THEN p_now + greatest(COALESCE(p_delay, 0), 0) * interval '1 second'
              WHEN p_kind = 'release' OR p_woken THEN p_now
              WHEN p_kind = 'sleep' THEN p_now + p_delay * interval '1 second' END,
         p_woken
$$;

-- The outcomes finish_v4 does not record itself (its format; p_results has the [value] of
-- the ok ones, NULL for the others). The jobs' own rows are locked first and read after, by
-- the next statement; the families are told without waiting (_tell_family): a run's outcome
-- never waits for another job's row. A sleep finds itself woken when the child it waits for
-- has ended, or a child's end is still to be told (postjob.wakeups).
CREATE OR REPLACE FUNCTION postjob._settle(
  p_ids bigint[], p_tokens bigint[], p_kinds text[], p_results jsonb[], p_errors text[],
  p_messages text[], p_backtraces jsonb[], p_versions text[], p_awaiting bigint[],
  p_delays double precision[], p_stopped bigint[], p_stopped_tokens bigint[])
RETURNS TABLE (kind text, id bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_settled bigint[];  -- the outcomes recorded, of which
  v_final bigint[];    -- final (and failed), and sleeps woken at once
  v_failed bigint[];
  v_queues varchar[];  -- the final ones' queues and statuses (postjob.settled_counts)
  v_statuses postjob.statuses[];
  v_woken bigint[];
  v_ended bigint[];    -- the runs over: recorded, stopped, or their job ended from outside
  v_runnable integer;  -- how many may run now (an idle worker is woken for each)
BEGIN
  PERFORM 1 FROM postjob.unfinished WHERE job_id = ANY (p_ids || p_stopped)
    ORDER BY job_id FOR UPDATE;
  WITH plan AS MATERIALIZED (
    SELECT o.*, x.status, x.run_at, x.run_at <= v_now AS due, x.woken, j.queue
    FROM unnest(p_ids, p_tokens, p_kinds, p_results, p_errors, p_messages, p_backtraces,
                p_versions, p_awaiting, p_delays)
      AS o(id, token, kind, result, error, message, backtrace, version, awaiting, delay)
    JOIN postjob.unfinished u ON u.job_id = o.id AND u.lease_token = o.token
                             AND u.status IN ('ready', 'err', 'sleep')
    JOIN postjob.postjobs j ON j.id = o.id
    CROSS JOIN LATERAL postjob._outcome_next(
      o.kind, o.delay, u.status,
      o.kind = 'sleep' AND postjob._sleep_woken(o.id, o.awaiting, u.woken),
      j.failed_attempts, j.max_attempts, v_now) x
  ), gone AS (
    DELETE FROM postjob.unfinished u
    WHERE u.job_id = ANY (ARRAY(SELECT p.id FROM plan p WHERE p.status IN ('ok', 'failed')))
  ), kept AS (
    UPDATE postjob.unfinished u SET status = p.status, run_at = p.run_at,
      due = COALESCE(p.due, false), lease_token = NULL, worker_id = NULL, lease_expires_at = NULL,
      started_at = NULL, holder = NULL, woken = false
    FROM plan p
    WHERE u.job_id = ANY (ARRAY(SELECT p.id FROM plan p WHERE p.status NOT IN ('ok', 'failed')))
      AND u.job_id = p.id
  ), records AS (
    UPDATE postjob.postjobs j SET
      status = p.status,
      results = CASE WHEN p.status = 'ok' THEN p.result END,
      error = CASE WHEN p.kind IN ('err', 'failed') THEN p.error END,
      error_message = CASE WHEN p.kind IN ('err', 'failed') THEN p.message END,
      error_backtrace = CASE WHEN p.kind IN ('err', 'failed') THEN p.backtrace END,
      failed_attempts = j.failed_attempts + CASE WHEN p.kind IN ('err', 'failed') THEN 1 ELSE 0 END,
      next_run_at = CASE WHEN p.status NOT IN ('ok', 'failed') THEN p.run_at END,
      awaiting_id = CASE WHEN p.status = 'sleep' THEN p.awaiting END,
      workflow_version = COALESCE(p.version, j.workflow_version),
      processing_client = NULL, processing_client_identifier = NULL,
      processing_started_at = NULL, processing_max_duration = NULL,
      unique_key_held = j.unique_key_held AND p.status NOT IN ('ok', 'failed'),
      updated_at = v_now
    FROM plan p
    WHERE j.id = ANY (ARRAY(SELECT p.id FROM plan p WHERE p.kind <> 'release')) AND j.id = p.id
  )
  SELECT array_agg(p.id), array_agg(p.id) FILTER (WHERE p.status IN ('ok', 'failed')),
         array_agg(p.id) FILTER (WHERE p.status = 'failed'),
         array_agg(p.queue) FILTER (WHERE p.status IN ('ok', 'failed')),
         array_agg(p.status) FILTER (WHERE p.status IN ('ok', 'failed')),
         array_agg(p.id) FILTER (WHERE p.woken),
         count(*) FILTER (WHERE p.status IN ('ready', 'err') AND p.due)
    INTO v_settled, v_final, v_failed, v_queues, v_statuses, v_woken, v_runnable FROM plan p;
  v_ended := COALESCE(v_settled, '{}') || postjob._runs_stopped(
    p_stopped || ARRAY(SELECT x FROM unnest(p_ids) x WHERE x <> ALL (COALESCE(v_settled, '{}'))),
    p_stopped_tokens || ARRAY(SELECT o.token FROM unnest(p_ids, p_tokens) AS o(id, token)
                              WHERE o.id <> ALL (COALESCE(v_settled, '{}'))));
  IF EXISTS (SELECT 1 FROM postjob.queue_slots WHERE job_id IS NOT NULL) THEN
    PERFORM postjob._free_places(v_ended);
  END IF;
  IF v_final IS NOT NULL THEN
    PERFORM postjob._tell_family(v_final, COALESCE(v_failed, '{}'));
  END IF;
  IF v_runnable > 0 THEN
    PERFORM postjob._wake(v_runnable);
  END IF;
  IF v_final IS NOT NULL THEN
    PERFORM postjob._count_settled(v_queues, v_statuses);
  END IF;
  RETURN QUERY
    SELECT 'lost'::text, x FROM unnest(p_ids) x WHERE x <> ALL (COALESCE(v_settled, '{}'))
    UNION ALL SELECT 'woken'::text, x FROM unnest(v_woken) x;
END;
$$;

-- Runs that stopped without an outcome to record, under these lease tokens: a job ended
-- from outside while it ran (cancelled, timed out with a failed ancestor) is done now, its
-- row goes; a job that still stands is given back (due again, no attempt counted). The rows
-- must be locked. Returns the ids whose leases ended.
CREATE OR REPLACE FUNCTION postjob._runs_stopped(p_ids bigint[], p_tokens bigint[])
RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_ids bigint[];
BEGIN
  IF cardinality(p_ids) = 0 THEN
    RETURN '{}';
  END IF;
  WITH stopped AS (
    SELECT u.job_id, u.status IN ('ready', 'err', 'sleep') AS stands
    FROM postjob.unfinished u JOIN unnest(p_ids, p_tokens) AS s(id, token)
      ON u.job_id = s.id AND u.lease_token = s.token
    WHERE u.job_id = ANY (p_ids)
  ), gone AS (
    DELETE FROM postjob.unfinished u
    WHERE u.job_id = ANY (ARRAY(SELECT s.job_id FROM stopped s WHERE NOT s.stands))
  ), back AS (
    UPDATE postjob.unfinished u SET lease_token = NULL, worker_id = NULL,
      lease_expires_at = NULL, started_at = NULL, holder = NULL, woken = false,
      run_at = statement_timestamp(), due = u.workflow <> '__manual__'
    WHERE u.job_id = ANY (ARRAY(SELECT s.job_id FROM stopped s WHERE s.stands))
  )
  SELECT COALESCE(array_agg(s.job_id), '{}') INTO v_ids FROM stopped s;
  RETURN v_ids;
END;
$$;

-- Count jobs settled by this statement (p_queues, p_statuses: one element a job) in
-- postjob.settled_counts: one write for the batch, a row per queue and status, of this
-- backend's own rows (shard: its pid; no other transaction writes them, so this never waits:
-- schema.sql), after every other lock of the caller.
CREATE OR REPLACE FUNCTION postjob._count_settled(p_queues varchar[], p_statuses postjob.statuses[])
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
  INSERT INTO postjob.settled_counts AS c (minute, queue, status, shard, n)
  SELECT to_timestamp(floor(extract(epoch FROM statement_timestamp()) / 60) * 60), s.queue,
         s.status, pg_backend_pid(), count(*)
  FROM unnest(p_queues, p_statuses) AS s(queue, status)
  GROUP BY s.queue, s.status ORDER BY s.queue, s.status
  ON CONFLICT (minute, queue, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
END;
$$;

-- Fold the counts of each closed minute (the minute before this one is left to statements
-- still under way) into one row per queue and status (shard 0), and drop the minutes more
-- than two hours old: the upkeep calls it. Rows another transaction holds are left for the
-- next call: it waits for none. Returns how many rows it folded or dropped.
CREATE OR REPLACE FUNCTION postjob._settled_counts_fold() RETURNS integer
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
  v_closed timestamptz :=
    to_timestamp(floor(extract(epoch FROM statement_timestamp()) / 60) * 60) - interval '1 minute';
  v_n integer;
BEGIN
  WITH gone AS (
    DELETE FROM postjob.settled_counts c
    WHERE (c.minute, c.queue, c.status, c.shard) IN (
      SELECT x.minute, x.queue, x.status, x.shard FROM postjob.settled_counts x
      WHERE x.minute < v_closed AND (x.shard <> 0 OR x.minute < v_closed - interval '2 hours')
      FOR UPDATE SKIP LOCKED)
    RETURNING c.minute, c.queue, c.status, c.n
  ), folded AS (
    INSERT INTO postjob.settled_counts AS c (minute, queue, status, shard, n)
    SELECT g.minute, g.queue, g.status, 0, sum(g.n) FROM gone g
    WHERE g.minute >= v_closed - interval '2 hours'
    GROUP BY g.minute, g.queue, g.status ORDER BY g.minute, g.queue, g.status
    ON CONFLICT (minute, queue, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
  )
  SELECT count(*) INTO v_n FROM gone;
  RETURN v_n;
END;
$$;
