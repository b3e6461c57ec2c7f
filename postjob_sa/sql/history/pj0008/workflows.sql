-- Workflows: what a running job asks of the database (children, tokens, progress notes), and
-- what a job reaching its end means for its family (wake-ups). A running job's writes are
-- fenced on its lease token.

-- What a job reaching a final state means. A failed, timed-out or cancelled job ends its
-- unfinished descendants (timeout; a running one loses its lease). A final child wakes its
-- sleeping parent when the parent waits for it, or whatever it waits for if the child did not
-- end ok; a parent still running is marked (next_run_at), so that its sleep outcome, recorded
-- after this, finds it woken. At READ COMMITTED each statement sees what committed before it;
-- at REPEATABLE READ and SERIALIZABLE the snapshot may predate a parent going to sleep, so
-- there every parent is locked first (a conflict raises a serialization failure, which the
-- caller retries) and only then read.
CREATE OR REPLACE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_wake bigint[];
  v_mark bigint[];
  v_ended bigint[];
BEGIN
  IF cardinality(p_failed_ids) > 0 THEN
    WITH ended AS (
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
        unique_key_held = false,
        updated_at = statement_timestamp()
      FROM postjob.postjobs a
      WHERE a.id = ANY (p_failed_ids)
        AND d.parent_id IS NOT NULL
        AND d.root_id = a.root_id
        AND d.full_id LIKE a.full_id || '.%'
        AND d.status IN ('ready', 'processing', 'sleep', 'err')
      RETURNING d.id
    )
    SELECT array_agg(id) INTO v_ended FROM ended;
    IF v_ended IS NOT NULL THEN
      PERFORM postjob._ended_early(v_ended);
    END IF;
  END IF;

  IF current_setting('transaction_isolation') <> 'read committed' THEN
    PERFORM 1 FROM postjob.postjobs parent
      WHERE parent.id IN (SELECT child.parent_id FROM postjob.postjobs child
                          WHERE child.id = ANY (p_final_ids) AND child.parent_id IS NOT NULL)
      ORDER BY parent.id
      FOR UPDATE;
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
              AND (parent.awaiting_id = child.id
                   OR child.status IN ('failed', 'timeout', 'cancelled')))
          OR (parent.status = 'processing'
              AND child.status IN ('failed', 'timeout', 'cancelled')))
      ORDER BY parent.id
      FOR UPDATE OF parent
    ) l;

  IF v_mark IS NOT NULL THEN
    UPDATE postjob.postjobs SET next_run_at = statement_timestamp()
    WHERE id = ANY (v_mark) AND status = 'processing';
  END IF;
  IF v_wake IS NOT NULL THEN
    PERFORM postjob._make_ready(v_wake, ARRAY['sleep']::postjob.statuses[]);
  END IF;
END;
$$;

-- Jobs ended by someone else than their own run (a failed ancestor, a cancel, a deadline):
-- they wait no more, and their places in a limited queue are free again. Their lease rows
-- stay until their worker (or the reaper) removes them.
CREATE OR REPLACE FUNCTION postjob._ended_early(p_ids bigint[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM postjob.waiting WHERE job_id = ANY (p_ids);
  IF EXISTS (SELECT 1 FROM postjob.queue_slots WHERE job_id IS NOT NULL) THEN
    UPDATE postjob.queue_slots SET job_id = NULL WHERE job_id = ANY (p_ids);
  END IF;
END;
$$;

-- Make these jobs ready to run now, if their status is one of p_from (a sleeping parent
-- woken, a job forced or reset, a zombie to retry): the record and the waiting row say so
-- together, and idle workers are woken.
CREATE OR REPLACE FUNCTION postjob._make_ready(p_ids bigint[], p_from postjob.statuses[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_ready bigint[];
BEGIN
  WITH ready AS (
    UPDATE postjob.postjobs j SET
      status = CASE WHEN j.status = 'sleep' THEN 'ready'::postjob.statuses ELSE j.status END,
      next_run_at = statement_timestamp(),
      awaiting_id = NULL,
      updated_at = statement_timestamp()
    WHERE j.id = ANY (p_ids) AND j.status = ANY (p_from)
    RETURNING j.id, j.status, j.workflow, j.workflow_version, j.queue, j.priority,
              j.next_run_at, j.timing_out_at
  ), rows AS (
    INSERT INTO postjob.waiting AS w (job_id, status, workflow, workflow_version, queue,
                                      priority, run_at, due, timing_out_at)
    SELECT r.id, r.status, r.workflow, r.workflow_version, r.queue, r.priority,
           r.next_run_at, r.workflow <> '__manual__', r.timing_out_at
    FROM ready r
    ON CONFLICT (job_id) DO UPDATE SET
      status = EXCLUDED.status, run_at = EXCLUDED.run_at, due = EXCLUDED.due,
      timing_out_at = EXCLUDED.timing_out_at
    RETURNING w.job_id
  )
  SELECT array_agg(job_id) INTO v_ready FROM rows;
  IF v_ready IS NOT NULL THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN COALESCE(v_ready, '{}');
END;
$$;

-- Insert the children a run spawned (those that exist already are kept) and return every child
-- of the job, in one round trip. Only the run that holds the job's lease may spawn: the lock
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
  WITH updated AS (
    UPDATE postjob.postjobs SET workflow_status = p_status, updated_at = statement_timestamp()
    WHERE id = p_job_id AND lease_token = p_lease_token
    RETURNING 1
  )
  SELECT EXISTS (SELECT 1 FROM updated)
$$;
