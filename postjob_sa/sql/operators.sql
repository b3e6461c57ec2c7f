-- Operator commands on jobs that exist (JobQueue.reset/cancel/force/resolve, postjob job ...,
-- the dashboard's buttons). Each runs in the caller's transaction, locks in the order of
-- schema.sql, and tries again when PostgreSQL reports a deadlock (a tree that grew while it
-- was locked): no deadlock reaches the caller.

-- Whether a run of this job may still be executing though the job is no longer unfinished:
-- it was ended from outside (cancelled, or timed out by a failed ancestor) while it ran, and
-- that run has not stopped (its row still holds the lease).
CREATE OR REPLACE FUNCTION postjob._run_may_be_executing(p_id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM postjob.unfinished u
                 WHERE u.job_id = p_id AND u.lease_token IS NOT NULL
                   AND u.status NOT IN ('ready', 'err', 'sleep'))
$$;

-- Make these jobs (and their failed, timed-out or cancelled descendants) ready again: attempts
-- and errors cleared, a fresh deadline, the unique key held again. A running job is left
-- alone, and so is one whose run may still be executing. A job whose unique key another
-- unfinished job holds raises PJ002 naming it. Returns the ids reset.
CREATE OR REPLACE FUNCTION postjob.reset_jobs(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
  v_targets bigint[];
  v_conflict record;
  v_ids bigint[];
  v_try integer := 0;
BEGIN
  LOOP
    BEGIN
      v_targets := ARRAY(
        SELECT t.id FROM (
          SELECT j.id FROM postjob.postjobs j WHERE j.id = ANY (p_ids)
          UNION
          SELECT d.id FROM postjob.postjobs a
            JOIN postjob.postjobs d ON d.parent_id IS NOT NULL AND d.root_id = a.root_id
                                    AND d.full_id LIKE a.full_id || '.%'
            WHERE a.id = ANY (p_ids) AND d.status IN ('failed', 'timeout', 'cancelled')) t
        ORDER BY t.id);
      PERFORM 1 FROM postjob.unfinished WHERE job_id = ANY (v_targets) ORDER BY job_id FOR UPDATE;
      PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_targets) ORDER BY id FOR UPDATE;
      v_targets := ARRAY(  -- not running, and no run of theirs going on
        SELECT x FROM unnest(v_targets) x
        WHERE NOT EXISTS (SELECT 1 FROM postjob.unfinished u
                          WHERE u.job_id = x AND u.lease_token IS NOT NULL));
      SELECT j.id, j.unique_key, h.job_id AS holder INTO v_conflict
        FROM postjob.postjobs j
        JOIN postjob.unfinished h ON h.unique_key = j.unique_key AND h.job_id <> j.id
        WHERE j.id = ANY (v_targets) AND j.unique_key IS NOT NULL
        LIMIT 1;
      IF FOUND THEN
        RAISE EXCEPTION 'postjob: job % holds the unique key % of job %', v_conflict.holder,
          v_conflict.unique_key, v_conflict.id USING ERRCODE = 'PJ002';
      END IF;
      WITH reset AS (
        UPDATE postjob.postjobs j SET
          status = 'ready', next_run_at = statement_timestamp(),
          timing_out_at = CASE WHEN j.timeout IS NOT NULL
                               THEN statement_timestamp() + j.timeout * interval '1 second' END,
          results = NULL, failed_attempts = 0, error = NULL, error_message = NULL,
          error_backtrace = NULL, awaiting_id = NULL, processing_client = NULL,
          processing_client_identifier = NULL, processing_started_at = NULL,
          processing_max_duration = NULL, unique_key_held = j.unique_key IS NOT NULL,
          updated_at = statement_timestamp()
        WHERE j.id = ANY (v_targets)
        RETURNING j.id, j.workflow, j.workflow_version, j.queue, j.priority, j.next_run_at,
                  j.timing_out_at, j.parent_id, j.unique_key
      ), rows AS (
        INSERT INTO postjob.unfinished AS u (job_id, status, workflow, workflow_version, queue,
                                             priority, run_at, due, timing_out_at, parent_id,
                                             unique_key)
        SELECT r.id, 'ready', r.workflow, r.workflow_version, r.queue, r.priority,
               CASE WHEN r.workflow <> '__manual__' THEN r.next_run_at END,
               r.workflow <> '__manual__', r.timing_out_at, r.parent_id, r.unique_key
        FROM reset r
        ON CONFLICT (job_id) DO UPDATE SET
          status = EXCLUDED.status, run_at = EXCLUDED.run_at, due = EXCLUDED.due,
          timing_out_at = EXCLUDED.timing_out_at, unique_key = EXCLUDED.unique_key
        RETURNING u.job_id
      )
      SELECT array_agg(job_id ORDER BY job_id) INTO v_ids FROM rows;
      IF v_ids IS NOT NULL THEN
        -- what failed is tried again: the errors its steps stored and the timeouts of its
        -- waits go (what they achieved stays), and its waits start afresh
        DELETE FROM postjob.steps WHERE job_id = ANY (v_ids) AND error IS NOT NULL;
        DELETE FROM postjob.event_waits WHERE job_id = ANY (v_ids);
        PERFORM postjob._wake(cardinality(v_ids));
      END IF;
      RETURN COALESCE(v_ids, '{}');
    EXCEPTION WHEN deadlock_detected THEN
      v_try := v_try + 1;
      IF v_try >= 5 THEN
        RAISE;
      END IF;
    END;
  END LOOP;
END;
$$;

-- Cancel these jobs and their unfinished descendants: status cancelled (final) at once. A
-- running job learns it at its next fenced write or heartbeat, and its outcome is not
-- recorded; its row keeps its lease until its run has stopped. Every descendant that exists
-- when the cancel commits is cancelled: the jobs are locked before their descendants are read
-- (a spawn holds its parent until its children are in), and again until no new descendant
-- appears; a spawn after that is refused (the job has ended). Parents waiting for a cancelled
-- child are woken. Returns the ids cancelled.
CREATE OR REPLACE FUNCTION postjob.cancel_jobs(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
  v_locked bigint[];
  v_more bigint[];
  v_ids bigint[];
  v_id bigint;
  v_try integer := 0;
BEGIN
  LOOP
    BEGIN
      v_locked := ARRAY(SELECT x FROM unnest(p_ids) x
                        UNION SELECT d.id FROM postjob._descendants(p_ids) d);
      PERFORM postjob._lock_family(v_locked, '{}');
      LOOP  -- descendants spawned while the locks were taken (later ids, locked after)
        v_more := ARRAY(SELECT d.id FROM postjob._descendants(p_ids) d
                        WHERE d.id <> ALL (v_locked) ORDER BY d.id);
        EXIT WHEN cardinality(v_more) = 0;
        PERFORM 1 FROM postjob.unfinished WHERE job_id = ANY (v_more) ORDER BY job_id FOR UPDATE;
        v_locked := v_locked || v_more;
      END LOOP;
      v_ids := postjob._end_unfinished(p_ids, 'cancelled', 'Cancelled', 'cancelled');
      FOREACH v_id IN ARRAY v_ids LOOP
        v_ids := v_ids || postjob._end_unfinished(
          ARRAY(SELECT d.id FROM postjob._descendants(ARRAY[v_id]) d), 'cancelled', 'Cancelled',
          'cancelled with job ' || v_id);
      END LOOP;
      IF cardinality(v_ids) > 0 THEN
        PERFORM postjob._jobs_ended(v_ids, '{}');
      END IF;
      RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_ids) x ORDER BY x);
    EXCEPTION WHEN deadlock_detected THEN
      v_try := v_try + 1;
      IF v_try >= 5 THEN
        RAISE;
      END IF;
    END;
  END LOOP;
END;
$$;

-- Run a ready, err or sleeping job as soon as possible (a durable sleep of it ends now).
CREATE OR REPLACE FUNCTION postjob.force_job(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM postjob.unfinished WHERE job_id = p_id FOR UPDATE;
  UPDATE postjob.steps SET wake_at = statement_timestamp()
  WHERE job_id = p_id AND kind = 'sleep' AND wake_at > statement_timestamp()
    AND EXISTS (SELECT 1 FROM postjob.unfinished u WHERE u.job_id = p_id
                AND u.status IN ('ready', 'err', 'sleep') AND u.lease_token IS NULL);
  RETURN cardinality(postjob._make_ready(ARRAY[p_id],
                                         ARRAY['ready', 'err', 'sleep']::postjob.statuses[])) > 0;
END;
$$;

-- Finish a manual job by its token: ok with p_result, or failed with p_error (and p_message).
-- Wakes its parent. Returns the job's id.
CREATE OR REPLACE FUNCTION postjob.resolve(
  p_token uuid, p_result jsonb, p_error varchar DEFAULT NULL, p_message varchar DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_workflow varchar;
  v_queue varchar;
  v_status postjob.statuses;
  v_try integer := 0;
BEGIN
  SELECT j.id, j.workflow INTO v_id, v_workflow
    FROM postjob.tokens t JOIN postjob.postjobs j ON j.id = t.postjob_id
    WHERE t.token = p_token;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: no job has the token %', p_token USING ERRCODE = 'no_data_found';
  END IF;
  IF v_workflow <> '__manual__' THEN
    RAISE EXCEPTION 'postjob: job % is not a manual job', v_id
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  LOOP
    BEGIN
      PERFORM postjob._lock_family(ARRAY[v_id], '{}');
      SELECT j.status INTO v_status FROM postjob.postjobs j WHERE j.id = v_id FOR UPDATE;
      IF v_status NOT IN ('ready', 'processing', 'sleep', 'err') THEN
        RAISE EXCEPTION 'postjob: job % is already %', v_id, v_status
          USING ERRCODE = 'invalid_parameter_value';
      END IF;
      UPDATE postjob.postjobs SET
        status = (CASE WHEN p_error IS NULL THEN 'ok' ELSE 'failed' END)::postjob.statuses,
        results = CASE WHEN p_error IS NULL THEN jsonb_build_array(p_result) END,
        error = p_error,
        error_message = CASE WHEN p_error IS NOT NULL THEN COALESCE(p_message, p_error) END,
        failed_attempts = failed_attempts + CASE WHEN p_error IS NULL THEN 0 ELSE 1 END,
        next_run_at = NULL, unique_key_held = false, updated_at = statement_timestamp()
      WHERE id = v_id
      RETURNING queue INTO v_queue;
      DELETE FROM postjob.unfinished WHERE job_id = v_id;
      PERFORM postjob._jobs_ended(
        ARRAY[v_id], CASE WHEN p_error IS NULL THEN '{}'::bigint[] ELSE ARRAY[v_id] END);
      PERFORM postjob._count_settled(
        ARRAY[v_queue], ARRAY[CASE WHEN p_error IS NULL THEN 'ok' ELSE 'failed' END]::postjob.statuses[]);
      RETURN v_id;
    EXCEPTION WHEN deadlock_detected THEN
      v_try := v_try + 1;
      IF v_try >= 5 THEN
        RAISE;
      END IF;
    END;
  END LOOP;
END;
$$;
