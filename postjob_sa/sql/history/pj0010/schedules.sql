-- Schedules: periodic workflows. Every worker that runs one registers it (postjob_sa's
-- scheduler computes the ticks in Python, time zones included) and claims ticks here: one job
-- per tick across all workers.

-- Claim the tick p_tick of schedule p_name (moving last_tick_at to it) and enqueue its job;
-- NULL when another worker claimed it, or when it is skipped (p_skip).
CREATE OR REPLACE FUNCTION postjob.schedule_tick(
  p_name varchar, p_tick timestamptz, p_next timestamptz, p_skip boolean, p_queue varchar,
  p_max_attempts integer, p_timeout double precision, p_tags jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_job_id bigint;
BEGIN
  UPDATE postjob.schedules SET last_tick_at = p_tick, next_tick_at = p_next
  WHERE name = p_name AND (last_tick_at IS NULL OR last_tick_at < p_tick);
  IF NOT FOUND OR p_skip THEN
    RETURN NULL;
  END IF;
  INSERT INTO postjob.postjobs (queue, workflow, max_attempts, timeout, tags)
  VALUES (p_queue, p_name, p_max_attempts, p_timeout, p_tags)
  RETURNING id INTO v_job_id;
  UPDATE postjob.schedules SET last_run_at = p_tick, last_job_id = v_job_id
  WHERE name = p_name;
  RETURN v_job_id;
END;
$$;
