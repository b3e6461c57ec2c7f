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
-- Events and waits are serialized per key by a row of postjob.event_keys (the key's bucket,
-- one of 4096 by its hash), which an emit and a wait update before anything else and keep
-- locked to their commit. At READ COMMITTED a wait that finds no event and records itself
-- cannot miss an emit that commits meanwhile: the emit waits for the wait's commit and then
-- sees it, and a wait that comes after an emit waits for the emit's commit and then sees the
-- event (each statement reads what committed before it). At REPEATABLE READ and SERIALIZABLE
-- a statement reads the transaction's snapshot, which may predate the other side's commit;
-- there the update of a bucket row that the other side updated after that snapshot raises a
-- serialization failure, which the caller tries again (a transactional job's run is run
-- again) with a snapshot that sees it. Either way no emit commits while its waiter sleeps on.

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
  PERFORM postjob._hold(p_job_id, p_lease_token);
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

-- Take an event key's lock (its bucket's row, see the top of this file) until the transaction
-- ends.
CREATE OR REPLACE FUNCTION postjob._event_key_lock(p_key varchar) RETURNS void
LANGUAGE sql AS $$
  UPDATE postjob.event_keys SET changes = changes + 1 WHERE bucket = hashtext(p_key) & 4095
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
  PERFORM postjob._event_key_lock(p_key);
  PERFORM postjob._hold(p_job_id, p_lease_token);
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
-- their waits go; a waiting job's row is made due (checkout takes it as it is, status sleep),
-- and a job still running (its wait recorded, its sleep not yet) is marked woken, so that its
-- sleep finds it woken (as a finished child marks its running parent). An idle worker is
-- woken at commit; a rollback records and wakes nothing. Returns the event's id. The key's
-- lock first, then the waiting jobs' rows in id order (schema.sql), then their waits; a
-- deadlock with a transactional job that waits for the key (it holds its row) is tried again.
CREATE OR REPLACE FUNCTION postjob.emit_event_v1(p_key varchar, p_payload jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_jobs bigint[];
  v_due integer;
  v_try integer := 0;
BEGIN
  LOOP
    BEGIN
      PERFORM postjob._event_key_lock(p_key);
      INSERT INTO postjob.events (key, payload) VALUES (p_key, p_payload) RETURNING id INTO v_id;
      v_jobs := ARRAY(SELECT DISTINCT w.job_id FROM postjob.event_waits w WHERE w.key = p_key
                      ORDER BY w.job_id);
      IF cardinality(v_jobs) = 0 THEN
        RETURN v_id;
      END IF;
      PERFORM 1 FROM postjob.unfinished WHERE job_id = ANY (v_jobs) ORDER BY job_id FOR UPDATE;
      DELETE FROM postjob.event_waits w WHERE w.key = p_key AND w.job_id = ANY (v_jobs);
      UPDATE postjob.unfinished u SET woken = true
      WHERE u.job_id = ANY (v_jobs) AND u.lease_token IS NOT NULL
        AND u.status IN ('ready', 'err', 'sleep');
      UPDATE postjob.unfinished u SET due = true, run_at = statement_timestamp()
      WHERE u.job_id = ANY (v_jobs) AND u.lease_token IS NULL AND u.status = 'sleep'
        AND NOT u.due;
      GET DIAGNOSTICS v_due = ROW_COUNT;
      IF v_due > 0 THEN
        PERFORM postjob._wake(v_due);
      END IF;
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
