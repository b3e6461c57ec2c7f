-- Durable workflows: what a job's runs did that its re-runs must not do again (steps, sleeps,
-- event waits: postjob.steps), the events (postjob.events) and the jobs waiting for one
-- (postjob.event_waits).
--
-- A run loads its job's steps once (postjob_sa's STEPS_LOAD, a plain SELECT) and records a new
-- one with one call here, fenced on its lease token like every write of a run. A job that
-- sleeps or waits for an event ends its run with a sleep outcome (outcomes.sql) that carries
-- its wake time (or none): no worker and no lease are held meanwhile, and a waiting row that
-- is not due costs checkout nothing.
--
-- Events and waits are serialized per key by an advisory lock (class 1885692278, 'pjev'; the
-- key's hash), which an emit and a wait take before anything else and keep to their commit:
-- a wait that finds no event and records itself cannot miss an emit that commits meanwhile
-- (the emit waits for the wait's commit and then sees it; a wait that comes after an emit
-- waits for the emit's commit and then sees the event).

-- Record a step of a running job (p_kind 'step', 'sleep' or 'event'; p_name the step's name,
-- or the ordinal of the sleep or wait in its run), once: a step recorded already stays as it
-- is. A sleep's wake time is p_wake_at, or p_wake_in seconds from now (the database's clock).
-- Returns the step as stored, with the seconds until its wake time. Only the run that holds
-- the job's lease may record (SQLSTATE PJ001 otherwise); the lock holds a reap, reset or
-- cancel back until this commits.
CREATE OR REPLACE FUNCTION postjob.record_step_v1(
  p_job_id bigint, p_lease_token bigint, p_kind varchar, p_name varchar, p_digest varchar,
  p_result jsonb, p_error varchar, p_message varchar, p_wake_in double precision,
  p_wake_at timestamptz)
RETURNS TABLE (result jsonb, error varchar, error_message varchar, wake_in double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  PERFORM 1 FROM postjob.postjobs
    WHERE postjobs.id = p_job_id AND postjobs.lease_token = p_lease_token FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: job % lost its lease', p_job_id USING ERRCODE = 'PJ001';
  END IF;
  INSERT INTO postjob.steps (job_id, kind, name, digest, result, error, error_message, wake_at)
  VALUES (p_job_id, p_kind, p_name, p_digest, p_result, p_error, p_message,
          COALESCE(p_wake_at, statement_timestamp() + p_wake_in * interval '1 second'))
  ON CONFLICT (job_id, kind, name) DO NOTHING;
  RETURN QUERY
  SELECT s.result, s.error, s.error_message,
         EXTRACT(EPOCH FROM s.wake_at - statement_timestamp())::double precision
  FROM postjob.steps s WHERE s.job_id = p_job_id AND s.kind = p_kind AND s.name = p_name;
END;
$$;

-- The p_seq-th wait of a running job for an event under p_key: 'event' with the payload of the
-- first event under the key (one emitted before the wait counts), or 'timeout' once the
-- wait's deadline (p_timeout seconds after the wait was first recorded) has passed, both
-- recorded as the job's step ('event', p_seq) so that its re-runs get the same; otherwise the
-- wait is recorded (postjob.event_waits: an emit wakes the job) and 'wait' comes back with the
-- seconds left until the deadline (NULL: none). Fenced on the lease like record_step_v1.
CREATE OR REPLACE FUNCTION postjob.wait_event_v1(
  p_job_id bigint, p_lease_token bigint, p_seq integer, p_key varchar,
  p_timeout double precision)
RETURNS TABLE (state text, payload jsonb, wake_in double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_event postjob.events;
  v_timeout_at timestamptz;
BEGIN
  -- the key first, the job's row after (an emit takes them in this order too)
  PERFORM pg_advisory_xact_lock(1885692278, hashtext(p_key));
  PERFORM 1 FROM postjob.postjobs
    WHERE postjobs.id = p_job_id AND postjobs.lease_token = p_lease_token FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: job % lost its lease', p_job_id USING ERRCODE = 'PJ001';
  END IF;
  SELECT * INTO v_event FROM postjob.events e WHERE e.key = p_key ORDER BY e.id LIMIT 1;
  IF FOUND THEN
    INSERT INTO postjob.steps (job_id, kind, name, digest, result)
    VALUES (p_job_id, 'event', p_seq::varchar, p_key, jsonb_build_array(v_event.payload))
    ON CONFLICT (job_id, kind, name) DO NOTHING;
    DELETE FROM postjob.event_waits w
      WHERE w.job_id = p_job_id AND w.seq = p_seq AND w.key = p_key;
    RETURN QUERY SELECT 'event'::text, v_event.payload, NULL::double precision;
    RETURN;
  END IF;
  INSERT INTO postjob.event_waits (job_id, seq, key, timeout_at)
  VALUES (p_job_id, p_seq, p_key, statement_timestamp() + p_timeout * interval '1 second')
  ON CONFLICT (job_id, seq, key) DO NOTHING;
  SELECT w.timeout_at INTO v_timeout_at FROM postjob.event_waits w
    WHERE w.job_id = p_job_id AND w.seq = p_seq AND w.key = p_key;
  IF v_timeout_at <= statement_timestamp() THEN
    INSERT INTO postjob.steps (job_id, kind, name, digest, error, error_message)
    VALUES (p_job_id, 'event', p_seq::varchar, p_key, 'EventTimeout',
            'no event under ' || p_key || ' came in time')
    ON CONFLICT (job_id, kind, name) DO NOTHING;
    DELETE FROM postjob.event_waits w
      WHERE w.job_id = p_job_id AND w.seq = p_seq AND w.key = p_key;
    RETURN QUERY SELECT 'timeout'::text, NULL::jsonb, NULL::double precision;
    RETURN;
  END IF;
  RETURN QUERY SELECT 'wait'::text, NULL::jsonb,
    EXTRACT(EPOCH FROM v_timeout_at - statement_timestamp())::double precision;
END;
$$;

-- Record an event under p_key in the caller's transaction and wake the jobs waiting for it:
-- their waits go; a waiting job's row is made due (checkout takes it as it is, status sleep;
-- a row another transaction holds is skipped: whoever holds it is taking the job to run it or
-- ending it), and a job still running (its wait recorded, its sleep not yet) is marked so that
-- its sleep finds it woken (as a finished child marks its running parent). The idle workers
-- are woken at commit; a rollback records and wakes nothing. Returns the event's id.
--
-- No lock is taken here that a run waiting for the key might hold: the job rows locked are of
-- runs whose checkout committed (a transactional job's run holds its row but is not
-- 'processing' to anyone else), and their holders never wait for a key.
CREATE OR REPLACE FUNCTION postjob.emit_event_v1(p_key varchar, p_payload jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_jobs bigint[];
  v_due integer;
BEGIN
  PERFORM pg_advisory_xact_lock(1885692278, hashtext(p_key));
  INSERT INTO postjob.events (key, payload) VALUES (p_key, p_payload) RETURNING id INTO v_id;
  WITH gone AS (
    DELETE FROM postjob.event_waits w WHERE w.key = p_key RETURNING w.job_id
  )
  SELECT array_agg(DISTINCT job_id) INTO v_jobs FROM gone;
  IF v_jobs IS NULL THEN
    RETURN v_id;
  END IF;
  -- first the running ones (a lock waits for a sleep being recorded now; the statement after
  -- it then sees the waiting row that sleep wrote), in id order as every batch locks them
  UPDATE postjob.postjobs j SET next_run_at = statement_timestamp()
  WHERE j.id = ANY (ARRAY(SELECT p.id FROM postjob.postjobs p
                          WHERE p.id = ANY (v_jobs) AND p.status = 'processing'
                          ORDER BY p.id FOR UPDATE))
    AND j.status = 'processing';
  UPDATE postjob.waiting w SET due = true, run_at = statement_timestamp()
  WHERE w.job_id = ANY (ARRAY(SELECT s.job_id FROM postjob.waiting s
                              WHERE s.job_id = ANY (v_jobs) AND s.status = 'sleep' AND NOT s.due
                              ORDER BY s.job_id FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS v_due = ROW_COUNT;
  IF v_due > 0 THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN v_id;
END;
$$;
