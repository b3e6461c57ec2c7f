-- Workers and leases: a worker's row and heartbeat, its cycle and idle wait, and the reaper
-- that rescues the jobs of a worker that has gone and ends the jobs past their deadline.
--
-- A checkout's jobs are held under its lease (postjob.leases): a worker's for as long as the
-- worker beats (its row in postjob.workers), an API checkout's until expires_at. A job whose
-- worker beats is never presumed abandoned.

CREATE OR REPLACE FUNCTION postjob.register_worker(
  p_identifier varchar, p_lease double precision, p_code_revision varchar,
  p_workflows text[], p_queues text[])
RETURNS bigint LANGUAGE sql AS $$
  INSERT INTO postjob.workers (identifier, expires_at, code_revision, workflows, queues)
  VALUES (p_identifier, statement_timestamp() + p_lease * interval '1 second',
          p_code_revision, COALESCE(p_workflows, '{}'), p_queues)
  RETURNING id
$$;

CREATE OR REPLACE FUNCTION postjob.unregister_worker(p_worker_id bigint) RETURNS void
LANGUAGE sql AS $$
  DELETE FROM postjob.workers WHERE id = p_worker_id
$$;

-- Keep the worker alive for p_lease more seconds, and its jobs' leases with it; return the
-- held jobs (p_ids, under p_lease_tokens) that are no longer its own (cancelled, reaped,
-- reset), or NULL when the worker's row is gone (it was presumed dead). It never waits: rows
-- another transaction holds keep the lease they show until the next beat.
CREATE OR REPLACE FUNCTION postjob.worker_heartbeat(
  p_worker_id bigint, p_lease double precision, p_ids bigint[], p_lease_tokens bigint[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_until timestamptz := statement_timestamp() + p_lease * interval '1 second';
  v_lost bigint[];
BEGIN
  UPDATE postjob.workers SET heartbeat_at = statement_timestamp(), expires_at = v_until
  WHERE id = p_worker_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  UPDATE postjob.leases SET expires_at = v_until
  WHERE token = ANY (ARRAY(SELECT l.token FROM postjob.leases l WHERE l.worker_id = p_worker_id
                           FOR NO KEY UPDATE SKIP LOCKED));
  IF cardinality(p_ids) > 0 THEN
    UPDATE postjob.postjobs j SET
      lease_expires_at = v_until,
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

-- Rescue and end what nobody will: the jobs of leases whose holder has gone (zombies: retried
-- at once, or failed with no attempts left) and the waiting jobs past their deadline
-- (timeout), at most p_limit of each; free the places of jobs no longer running; forget
-- workers gone for an hour. Returns how many jobs it rescued or ended.
CREATE OR REPLACE FUNCTION postjob.reap_v3(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  v_now timestamptz := statement_timestamp();
  v_tokens bigint[];
  v_count integer := 0;
  v_retry bigint[];
  v_final bigint[];
  v_timeouts bigint[];
BEGIN
  v_tokens := ARRAY(
    SELECT l.token FROM postjob.leases l
    WHERE l.expires_at <= v_now
      AND NOT EXISTS (SELECT 1 FROM postjob.workers w
                      WHERE w.id = l.worker_id AND w.expires_at > v_now)
    ORDER BY l.expires_at
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED);
  IF cardinality(v_tokens) > 0 THEN
    WITH zombies AS (
      SELECT j.id FROM postjob.leases l
      CROSS JOIN LATERAL unnest(l.job_ids) AS h(id)
      JOIN postjob.postjobs j ON j.id = h.id AND j.lease_token = l.token
      WHERE l.token = ANY (v_tokens)
        AND j.id = ANY (ARRAY(SELECT unnest(job_ids) FROM postjob.leases
                              WHERE token = ANY (v_tokens)))
      ORDER BY j.id
      FOR UPDATE OF j SKIP LOCKED
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
        unique_key_held = j.unique_key_held AND j.failed_attempts + 1 < j.max_attempts,
        updated_at = v_now
      FROM zombies WHERE j.id = ANY (ARRAY(SELECT z.id FROM zombies z)) AND j.id = zombies.id
      RETURNING j.id, j.status
    )
    SELECT array_agg(id) FILTER (WHERE status = 'err'),
           array_agg(id) FILTER (WHERE status = 'failed')
      INTO v_retry, v_final FROM reaped;
    -- a lease goes once none of its jobs runs under it (a row locked just now stays for the
    -- next reap)
    DELETE FROM postjob.leases l
    WHERE l.token = ANY (v_tokens)
      AND NOT EXISTS (SELECT 1 FROM postjob.postjobs j
                      WHERE j.id = ANY (l.job_ids) AND j.lease_token = l.token);
    IF v_retry IS NOT NULL THEN
      PERFORM postjob._ended_early(v_retry);
      PERFORM postjob._make_ready(v_retry, ARRAY['err']::postjob.statuses[]);
      v_count := v_count + cardinality(v_retry);
    END IF;
    IF v_final IS NOT NULL THEN
      PERFORM postjob._ended_early(v_final);
      PERFORM postjob._jobs_ended(v_final, v_final);
      v_count := v_count + cardinality(v_final);
    END IF;
  END IF;

  WITH expired AS (
    SELECT w.job_id FROM postjob.waiting w
    WHERE w.timing_out_at <= v_now
    ORDER BY w.timing_out_at
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  ), gone AS (
    DELETE FROM postjob.waiting w WHERE w.job_id = ANY (ARRAY(SELECT e.job_id FROM expired e))
    RETURNING w.job_id
  ), ended AS (
    UPDATE postjob.postjobs j SET
      status = 'timeout',
      failed_attempts = j.failed_attempts + 1,
      error = 'Timeout',
      error_message = 'timeout',
      error_backtrace = NULL,
      next_run_at = NULL,
      awaiting_id = NULL,
      unique_key_held = false,
      updated_at = v_now
    FROM gone WHERE j.id = ANY (ARRAY(SELECT g.job_id FROM gone g)) AND j.id = gone.job_id
      AND j.status IN ('ready', 'err', 'sleep')
    RETURNING j.id
  )
  SELECT array_agg(id) INTO v_timeouts FROM ended;
  IF v_timeouts IS NOT NULL THEN
    PERFORM postjob._jobs_ended(v_timeouts, v_timeouts);
    v_count := v_count + cardinality(v_timeouts);
  END IF;

  -- a place whose job no longer runs is free (its end was recorded without freeing it)
  UPDATE postjob.queue_slots s SET job_id = NULL
  WHERE s.job_id IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM postjob.postjobs j
                    WHERE j.id = s.job_id AND j.status = 'processing');
  DELETE FROM postjob.workers WHERE expires_at < v_now - interval '1 hour';
  RETURN v_count;
END;
$$;

-- The worker's cycle, one round trip: record outcomes (postjob.finish_jobs_v3), release the
-- leases whose jobs have all ended, reap and make due what has come due when asked (the
-- worker asks now and then, not every cycle), and check out the next jobs
-- (postjob.checkout_v3). Rows of kind 'job' are the jobs checked out; 'lost' and 'woken' are
-- finish_jobs_v3's.
CREATE OR REPLACE FUNCTION postjob.worker_cycle_v3(
  p_worker_id bigint,
  p_identifier varchar,
  p_ok_ids bigint[],
  p_ok_tokens bigint[],
  p_ok_results jsonb[],
  p_ok_versions text[],
  p_outcomes jsonb,
  p_done bigint[],
  p_workflows text[],
  p_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision,
  p_reap boolean,
  p_promote boolean)
RETURNS TABLE (kind text, id bigint, lease_token bigint, workflow varchar,
               workflow_version varchar, args jsonb, queue varchar, root_id bigint,
               full_id varchar, parent_id bigint, attempt integer, max_attempts integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(p_ok_ids) > 0 OR jsonb_array_length(p_outcomes) > 0
     OR cardinality(p_done) > 0 THEN
    RETURN QUERY
    SELECT f.kind, f.id, NULL::bigint, NULL::varchar, NULL::varchar, NULL::jsonb,
           NULL::varchar, NULL::bigint, NULL::varchar, NULL::bigint, NULL::integer,
           NULL::integer
    FROM postjob.finish_jobs_v3(p_ok_ids, p_ok_tokens, p_ok_results, p_ok_versions,
                                p_outcomes, p_done) f;
  END IF;
  IF p_reap THEN
    PERFORM postjob.reap_v3();
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY
    SELECT 'job'::text, c.id, c.lease_token, c.workflow, c.workflow_version, c.args, c.queue,
           c.root_id, c.full_id, c.parent_id, c.attempt, c.max_attempts
    FROM postjob.checkout_v3(p_worker_id, p_identifier, p_workflows, p_versions, p_queues,
                             p_limit, p_lease, p_promote) c;
  END IF;
END;
$$;

-- When a rate-limited queue may start a job next: when its oldest start is a period old (now,
-- when a start is free).
CREATE OR REPLACE FUNCTION postjob._next_start(p_limits postjob.queue_limits)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
  SELECT greatest(statement_timestamp(),
                  COALESCE(min(s.started_at), '-infinity') + postjob._period(p_limits.period))
  FROM (SELECT s.started_at FROM postjob.queue_starts s
        WHERE s.queue = p_limits.queue AND s.n <= p_limits.rate
        ORDER BY s.started_at NULLS FIRST LIMIT 1) s
$$;

-- Before an idle worker waits (its checkout found nothing it could take): reap when asked,
-- make due what has come due, then the seconds until there may be work for it (0: now; NULL:
-- nothing in sight): jobs it just made due, the next of its jobs to come due, the next start
-- of a rate-limited queue where jobs of its wait, the next deadline, the moment a lease would
-- be presumed abandoned. Jobs due now that its checkout did not take are another checkout's,
-- or in a queue whose places are all taken (the end of a run there wakes the idle workers):
-- nothing here reads them, so what lies in levels, queues or times it cannot take costs the
-- wait nothing.
CREATE OR REPLACE FUNCTION postjob.worker_idle(
  p_workflows text[], p_versions text[], p_queues text[], p_reap boolean)
RETURNS double precision
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_now timestamptz := statement_timestamp();
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap_v3();
  END IF;
  IF postjob._promote(p_workflows, p_versions) > 0 THEN
    RETURN 0;
  END IF;
  RETURN EXTRACT(EPOCH FROM LEAST(
    (SELECT min(s.run_at)
       FROM postjob._served_keys(p_workflows, p_versions) k
       CROSS JOIN LATERAL (
         SELECT w.run_at FROM postjob.waiting w
         WHERE w.workflow = k.workflow AND w.workflow_version = k.workflow_version
           AND NOT w.due AND w.run_at IS NOT NULL
         ORDER BY w.run_at LIMIT 1) s),
    (SELECT min(postjob._next_start(l))
       FROM postjob.queue_limits l
       WHERE l.rate IS NOT NULL AND (p_queues IS NULL OR l.queue = ANY (p_queues))
         AND EXISTS (SELECT 1 FROM postjob._served_keys(p_workflows, p_versions) k
                     JOIN postjob.waiting w ON w.workflow = k.workflow
                      AND w.workflow_version = k.workflow_version AND w.queue = l.queue
                     WHERE w.due)),
    (SELECT min(timing_out_at) FROM postjob.waiting WHERE timing_out_at IS NOT NULL),
    (SELECT min(l.expires_at) FROM postjob.leases l WHERE l.worker_id IS NULL),
    (SELECT min(w.expires_at) FROM postjob.workers w
      WHERE EXISTS (SELECT 1 FROM postjob.leases l WHERE l.worker_id = w.id))) - v_now
  )::double precision;
END;
$$;
