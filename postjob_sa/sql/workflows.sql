-- Workflows: what a running job asks of the database (children, tokens, progress notes), and
-- what a job reaching its end means for its family (wake-ups). A running job's writes are
-- fenced on its lease token.

-- Lock the unfinished rows of these jobs, of their parents, and of the unfinished
-- descendants of p_ending (jobs that end badly: their descendants end with them), in
-- ascending id (the lock order at the top of schema.sql), waiting for them: for operator
-- commands (cancel, resolve), which hold nothing before.
CREATE OR REPLACE FUNCTION postjob._lock_family(p_ids bigint[], p_ending bigint[])
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
  PERFORM 1 FROM postjob.unfinished u
  WHERE u.job_id = ANY (ARRAY(
    SELECT x FROM unnest(p_ids) x
    UNION SELECT p.parent_id FROM postjob.unfinished p
          WHERE p.job_id = ANY (p_ids) AND p.parent_id IS NOT NULL
    UNION SELECT d.id FROM postjob._descendants(p_ending) d))
  ORDER BY u.job_id
  FOR UPDATE;
END;
$$;

-- Tell the families of these final jobs (p_failed: those that ended badly) what their ends
-- mean (_jobs_ended), without waiting for a row: a run's outcome holds its own rows, and
-- another transaction may hold a parent's or a descendant's for as long as it likes (a
-- checkout in an app's transaction). The rows of a job's parent and descendants are taken
-- with SKIP LOCKED; a job whose family could not all be taken now is left in
-- postjob.wakeups, which the next promotion tells (_tell_pending), and which a parent's own
-- sleep reads (it finds itself woken). Returns the ids left for later.
CREATE OR REPLACE FUNCTION postjob._tell_family(p_final bigint[], p_failed bigint[])
RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_kin record;
  v_got bigint[];
  v_told bigint[] := '{}';
  v_later bigint[] := '{}';
BEGIN
  IF cardinality(p_final) = 0 THEN
    RETURN '{}';
  END IF;
  v_got := ARRAY(
    SELECT u.job_id FROM postjob.unfinished u
    WHERE u.job_id = ANY (ARRAY(
      SELECT j.parent_id FROM postjob.postjobs j
      WHERE j.id = ANY (p_final) AND j.parent_id IS NOT NULL
      UNION SELECT d.id FROM postjob._descendants(p_failed) d))
    ORDER BY u.job_id FOR UPDATE SKIP LOCKED);
  FOR v_kin IN
    SELECT j.id, ARRAY(SELECT x.job_id FROM postjob.unfinished x WHERE x.job_id = j.parent_id)
                 || ARRAY(SELECT d.id FROM postjob._descendants(ARRAY[j.id]) d
                          WHERE j.id = ANY (p_failed)) AS kin
    FROM postjob.postjobs j WHERE j.id = ANY (p_final)
  LOOP
    IF v_kin.kin <@ v_got THEN
      v_told := v_told || v_kin.id;
    ELSE
      v_later := v_later || v_kin.id;
    END IF;
  END LOOP;
  IF cardinality(v_told) > 0 THEN
    PERFORM postjob._jobs_ended(v_told, ARRAY(SELECT x FROM unnest(v_told) x
                                              WHERE x = ANY (p_failed)));
  END IF;
  IF cardinality(v_later) > 0 THEN
    INSERT INTO postjob.wakeups (job_id, failed)
    SELECT x, x = ANY (p_failed) FROM unnest(v_later) x
    ON CONFLICT (job_id) DO NOTHING;
  END IF;
  RETURN v_later;
END;
$$;

-- Tell what postjob.wakeups holds (at most p_limit jobs; rows another transaction holds are
-- left for the next call): a worker's promotion calls it, so what was left goes on within
-- a promotion's interval. Returns how many were told.
CREATE OR REPLACE FUNCTION postjob._tell_pending(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_final bigint[];
  v_failed bigint[];
  v_later bigint[];
BEGIN
  WITH taken AS (
    DELETE FROM postjob.wakeups w
    WHERE w.job_id = ANY (ARRAY(SELECT x.job_id FROM postjob.wakeups x ORDER BY x.job_id
                                LIMIT p_limit FOR UPDATE SKIP LOCKED))
    RETURNING w.job_id, w.failed
  )
  SELECT array_agg(t.job_id), array_agg(t.job_id) FILTER (WHERE t.failed)
    INTO v_final, v_failed FROM taken t;
  IF v_final IS NULL THEN
    RETURN 0;
  END IF;
  v_later := postjob._tell_family(v_final, COALESCE(v_failed, '{}'));
  RETURN cardinality(v_final) - cardinality(v_later);
END;
$$;

-- The unfinished descendants of these jobs.
CREATE OR REPLACE FUNCTION postjob._descendants(p_ids bigint[])
RETURNS TABLE (id bigint) LANGUAGE sql STABLE AS $$
  SELECT d.id FROM postjob.postjobs a
  JOIN postjob.postjobs d ON d.parent_id IS NOT NULL AND d.root_id = a.root_id
                         AND d.full_id LIKE a.full_id || '.%'
  WHERE a.id = ANY (p_ids) AND cardinality(p_ids) > 0
    AND EXISTS (SELECT 1 FROM postjob.unfinished u WHERE u.job_id = d.id)
$$;

-- End these unfinished jobs from outside their runs (a cancel, a failed ancestor, a deadline)
-- with p_status, p_error and p_message. A job that waits is done at once: its row goes. A job
-- that runs keeps its row, with the lease and the final status, until its run has stopped:
-- its place in a limited queue stays taken, and reset waits. The rows must be locked.
-- Returns the ids ended.
CREATE OR REPLACE FUNCTION postjob._end_unfinished(
  p_ids bigint[], p_status postjob.statuses, p_error varchar, p_message varchar)
RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_ended bigint[];
  v_queues varchar[];
BEGIN
  WITH rows AS (
    SELECT u.job_id, u.lease_token IS NOT NULL AS running FROM postjob.unfinished u
    WHERE u.job_id = ANY (p_ids) AND u.status IN ('ready', 'err', 'sleep')
  ), gone AS (
    DELETE FROM postjob.unfinished u
    WHERE u.job_id = ANY (ARRAY(SELECT r.job_id FROM rows r WHERE NOT r.running))
  ), kept AS (
    UPDATE postjob.unfinished u SET status = p_status, due = false, run_at = NULL,
      unique_key = NULL
    WHERE u.job_id = ANY (ARRAY(SELECT r.job_id FROM rows r WHERE r.running))
  ), ended AS (
    UPDATE postjob.postjobs j SET
      status = p_status, error = p_error, error_message = p_message, error_backtrace = NULL,
      failed_attempts = j.failed_attempts + CASE WHEN p_status = 'timeout' THEN 1 ELSE 0 END,
      next_run_at = NULL, awaiting_id = NULL, unique_key_held = false,
      processing_client = NULL, processing_client_identifier = NULL,
      processing_started_at = NULL, processing_max_duration = NULL,
      updated_at = statement_timestamp()
    WHERE j.id = ANY (ARRAY(SELECT r.job_id FROM rows r))
    RETURNING j.id, j.queue
  )
  SELECT COALESCE(array_agg(e.id ORDER BY e.id), '{}'), array_agg(e.queue)
    INTO v_ended, v_queues FROM ended e;
  IF cardinality(v_ended) > 0 THEN
    PERFORM postjob._count_settled(v_queues, array_fill(p_status, ARRAY[cardinality(v_ended)]));
  END IF;
  RETURN v_ended;
END;
$$;

-- What jobs reaching a final state mean for their families (their rows, their parents' and
-- their descendants' locked: _lock_family, or _tell_family). A failed, timed-out or cancelled job ends its
-- unfinished descendants (timeout). A final child wakes its sleeping parent when the parent
-- waits for it, or whatever it waits for if the child did not end ok; a parent still
-- running is marked (woken), so that the sleep its run ends with finds it woken.
CREATE OR REPLACE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_job record;
  v_wake bigint[];
BEGIN
  FOR v_job IN
    SELECT a.id, a.status FROM postjob.postjobs a WHERE a.id = ANY (p_failed_ids) ORDER BY a.id
  LOOP
    PERFORM postjob._end_unfinished(ARRAY(SELECT d.id FROM postjob._descendants(ARRAY[v_job.id]) d),
                                    'timeout', 'Timeout',
                                    'cancelled: job ' || v_job.id || ' ended with status ' || v_job.status);
  END LOOP;
  -- the parents: asleep ones are woken, running ones marked
  WITH parents AS (
    SELECT p.job_id, p.lease_token IS NOT NULL AS running, pj.awaiting_id, c.id AS child,
           c.status IN ('failed', 'timeout', 'cancelled') AS bad
    FROM postjob.postjobs c
    JOIN postjob.unfinished p ON p.job_id = c.parent_id AND p.status IN ('ready', 'err', 'sleep')
    JOIN postjob.postjobs pj ON pj.id = p.job_id
    WHERE c.id = ANY (p_final_ids) AND c.parent_id IS NOT NULL
  ), marked AS (
    UPDATE postjob.unfinished u SET woken = true
    WHERE u.job_id = ANY (ARRAY(SELECT p.job_id FROM parents p WHERE p.running AND p.bad))
  )
  SELECT array_agg(DISTINCT p.job_id) INTO v_wake FROM parents p
  JOIN postjob.unfinished u ON u.job_id = p.job_id
  WHERE NOT p.running AND u.status = 'sleep' AND (p.awaiting_id = p.child OR p.bad);
  IF v_wake IS NOT NULL THEN
    PERFORM postjob._make_ready(v_wake, ARRAY['sleep']::postjob.statuses[]);
  END IF;
END;
$$;

-- Make these waiting jobs ready to run now, if their status is one of p_from (a sleeping
-- parent woken, a job forced or reset to ready, a zombie to retry): the record and the row
-- say so together, and an idle worker is woken. Returns the ids made ready.
CREATE OR REPLACE FUNCTION postjob._make_ready(p_ids bigint[], p_from postjob.statuses[])
RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_ready bigint[];
BEGIN
  WITH ready AS (
    UPDATE postjob.unfinished u SET
      status = CASE WHEN u.status = 'sleep' THEN 'ready'::postjob.statuses ELSE u.status END,
      run_at = statement_timestamp(), due = u.workflow <> '__manual__', woken = false
    WHERE u.job_id = ANY (p_ids) AND u.status = ANY (p_from) AND u.lease_token IS NULL
    RETURNING u.job_id, u.status
  ), records AS (
    UPDATE postjob.postjobs j SET status = r.status, next_run_at = statement_timestamp(),
      awaiting_id = NULL, updated_at = statement_timestamp()
    FROM ready r WHERE j.id = ANY (ARRAY(SELECT r.job_id FROM ready r)) AND j.id = r.job_id
  )
  SELECT array_agg(r.job_id) INTO v_ready FROM ready r;
  IF v_ready IS NOT NULL THEN
    PERFORM postjob._wake(cardinality(v_ready));
  END IF;
  RETURN COALESCE(v_ready, '{}');
END;
$$;

-- Whether the run under p_lease_token still holds the job (and the job is not ended): its
-- row, locked for share until the transaction ends, so a reap, reset or cancel waits for the
-- write this fences. Raises PJ001 when it does not.
CREATE OR REPLACE FUNCTION postjob._hold(p_job_id bigint, p_lease_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM postjob.unfinished u
    WHERE u.job_id = p_job_id AND u.lease_token = p_lease_token
      AND u.status IN ('ready', 'err', 'sleep')
    FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: job % lost its lease', p_job_id USING ERRCODE = 'PJ001';
  END IF;
END;
$$;

-- Insert the children a run spawned (those that exist already are kept) and return every child
-- of the job, in one round trip. One child per (workflow, method, args): the record, being
-- partitioned, holds no unique index of it; the lease does, as only its run spawns (a
-- reap, reset or cancel that takes the lease waits for the lock below). The lock
-- holds a concurrent reap, reset or cancel back until these children are in (a cancel then
-- finds them), and a run whose lease is gone gets an error (SQLSTATE PJ001) instead of
-- children that nobody awaits.
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
DECLARE
  v_added integer := 0;
BEGIN
  PERFORM postjob._hold(p_parent_id, p_lease_token);
  IF cardinality(p_workflows) > 0 THEN
    WITH added AS (
      INSERT INTO postjob.postjobs (parent_id, queue, workflow, args, max_attempts, timeout,
                                    queued)
      SELECT p_parent_id, c.queue, c.workflow, c.args, c.max_attempts, c.timeout, true
      FROM (SELECT DISTINCT ON (n.workflow, md5(n.args::text)) n.*
            FROM unnest(p_queues, p_workflows, p_args, p_max_attempts, p_timeouts)
              WITH ORDINALITY AS n(queue, workflow, args, max_attempts, timeout, ord)
            ORDER BY n.workflow, md5(n.args::text), n.ord) c
      WHERE NOT EXISTS (
        SELECT 1 FROM postjob.postjobs e
        WHERE e.parent_id = p_parent_id AND e.id > p_parent_id AND e.workflow = c.workflow
          AND e.workflow_method = 'run' AND md5(e.args::text) = md5(c.args::text))
      RETURNING postjobs.id, postjobs.workflow, postjobs.workflow_version, postjobs.queue,
                postjobs.priority, postjobs.timing_out_at
    ), queued AS (
      INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, queue,
                                      priority, run_at, due, timing_out_at, parent_id)
      SELECT a.id, 'ready', a.workflow, a.workflow_version, a.queue, a.priority,
             postjob._first_run_at('ready', a.workflow, NULL), a.workflow <> '__manual__',
             a.timing_out_at, p_parent_id
      FROM added a
      RETURNING due, workflow, workflow_version, queue
    )
    -- each group of children due now wakes workers that serve it
    SELECT count(postjob._wake_for(g.n, g.workflow, g.workflow_version, g.queue))
      INTO v_added
      FROM (SELECT q.workflow, q.workflow_version, q.queue, count(*)::integer AS n
            FROM queued q WHERE q.due GROUP BY 1, 2, 3) g;
  END IF;
  RETURN QUERY
  SELECT c.id, c.workflow, c.args,
         (CASE WHEN u.lease_token IS NOT NULL AND u.status IN ('ready', 'err', 'sleep')
               THEN 'processing' ELSE c.status::text END),
         c.results, c.error, c.error_message
  FROM postjob.postjobs c LEFT JOIN postjob.unfinished u ON u.job_id = c.id
  WHERE c.parent_id = p_parent_id AND c.id > p_parent_id;
END;
$$;

-- The token that finishes a manual step (made once).
CREATE OR REPLACE FUNCTION postjob.manual_token(p_job_id bigint) RETURNS uuid
LANGUAGE plpgsql AS $$
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

-- A running job's progress note; false when the run no longer holds the job's lease.
CREATE OR REPLACE FUNCTION postjob.set_workflow_status(
  p_job_id bigint, p_lease_token bigint, p_status varchar)
RETURNS boolean LANGUAGE sql AS $$
  WITH held AS (
    SELECT 1 FROM postjob.unfinished u
    WHERE u.job_id = p_job_id AND u.lease_token = p_lease_token
      AND u.status IN ('ready', 'err', 'sleep')
    FOR SHARE
  ), updated AS (
    UPDATE postjob.postjobs SET workflow_status = p_status, updated_at = statement_timestamp()
    WHERE id = p_job_id AND EXISTS (SELECT 1 FROM held)
    RETURNING 1
  )
  SELECT EXISTS (SELECT 1 FROM updated)
$$;
