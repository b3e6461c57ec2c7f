-- A job comes and goes: what every INSERT into and DELETE from postjob.postjobs does, whoever
-- runs it (JobQueue.enqueue, session.add(Job(...)), a spawn, a schedule's tick, a retention
-- DELETE). The triggers are declared in schema.sql.

-- Row by row, before the insert: root_id, full_id (and the trace context, when the job has
-- none of its own) derived from the parent, the deadline
-- from the timeout, and the unique key held while the job is unfinished (a second unfinished
-- job with the key then conflicts on postjobs_unique_key_idx, which ON CONFLICT can catch).
CREATE OR REPLACE FUNCTION postjob._fill_job_ids() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  v_root_id bigint;
  v_full_id varchar;
  v_trace jsonb;
BEGIN
  IF NEW.root_id IS NULL OR NEW.full_id IS NULL THEN
    IF NEW.parent_id IS NULL THEN
      NEW.root_id := NEW.id;
      NEW.full_id := NEW.id::varchar;
    ELSE
      SELECT p.root_id, p.full_id, p.trace_context INTO v_root_id, v_full_id, v_trace
        FROM postjob.postjobs p WHERE p.id = NEW.parent_id;
      NEW.root_id := COALESCE(v_root_id, NEW.parent_id);
      NEW.full_id := COALESCE(v_full_id, NEW.parent_id::varchar) || '.' || NEW.id;
      NEW.trace_context := COALESCE(NEW.trace_context, v_trace);  -- one trace per tree
    END IF;
  END IF;
  IF NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL THEN
    NEW.timing_out_at := statement_timestamp() + NEW.timeout * interval '1 second';
  END IF;
  NEW.unique_key_held := NEW.unique_key IS NOT NULL
                         AND NEW.status IN ('ready', 'processing', 'sleep', 'err');
  RETURN NEW;
END;
$$;

-- Once per statement, after it: the waiting rows of the jobs it inserted, and one wake-up for
-- the idle workers when any of them has a time to run (due now, or sooner than a worker's
-- next wake-up may be). A manual step waits for a person: no time, no wake-up.
CREATE OR REPLACE FUNCTION postjob._jobs_added() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  v_timed boolean;
BEGIN
  WITH added_rows AS (
    INSERT INTO postjob.waiting (job_id, status, workflow, workflow_version, queue, priority,
                                 run_at, due, timing_out_at)
    SELECT a.id, a.status, a.workflow, a.workflow_version, a.queue, a.priority, t.run_at,
           COALESCE(t.run_at <= statement_timestamp(), false), a.timing_out_at
    FROM added a
    CROSS JOIN LATERAL (SELECT CASE WHEN a.status IN ('ready', 'err')
                                     AND a.workflow <> '__manual__'
                                    THEN COALESCE(a.next_run_at, statement_timestamp())
                               END AS run_at) t
    WHERE a.status IN ('ready', 'err', 'sleep')
    RETURNING run_at
  )
  SELECT bool_or(run_at IS NOT NULL) INTO v_timed FROM added_rows;
  IF v_timed THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN NULL;
END;
$$;

-- Once per statement, after a DELETE (retention, or a tree removed by its root): what the
-- deleted jobs waited or held goes with them, and their steps and event waits.
CREATE OR REPLACE FUNCTION postjob._jobs_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM postjob.waiting w USING removed r
    WHERE w.job_id = r.id AND r.status IN ('ready', 'err', 'sleep');
  UPDATE postjob.queue_slots s SET job_id = NULL
    FROM removed r WHERE s.job_id = r.id AND r.status = 'processing';
  DELETE FROM postjob.steps s USING removed r WHERE s.job_id = r.id;
  DELETE FROM postjob.event_waits e USING removed r WHERE e.job_id = r.id;
  RETURN NULL;
END;
$$;

-- TRUNCATE of the jobs empties what refers to them.
CREATE OR REPLACE FUNCTION postjob._jobs_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  TRUNCATE postjob.waiting, postjob.leases, postjob.steps, postjob.event_waits;
  UPDATE postjob.queue_slots SET job_id = NULL WHERE job_id IS NOT NULL;
  RETURN NULL;
END;
$$;
