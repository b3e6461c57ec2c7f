-- A job comes and goes: what every INSERT into and DELETE from postjob.postjobs does, whoever
-- runs it, and the wake-up of idle workers. The triggers are declared in schema.sql.
--
-- postjob_sa's own inserts (JobQueue.enqueue and enqueue_many, a spawn, a schedule's tick)
-- write the job's record and its row in postjob.unfinished in one statement, and mark the
-- record queued. Any other insert (session.add(Job(...)), an INSERT of the app's) is queued
-- by the insert trigger, row by row.

-- Row by row, before the insert: root_id, full_id (and the trace context, when the job has
-- none of its own) derived from the parent, the deadline from the timeout, and whether the
-- job holds its unique key. A child's parent must exist; it is locked as a foreign key's
-- check would (FOR KEY SHARE), so that it cannot be deleted while the child is inserted.
CREATE OR REPLACE FUNCTION postjob._fill_job_ids() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  v_root_id bigint;
  v_full_id varchar;
  v_trace jsonb;
BEGIN
  IF NEW.parent_id IS NOT NULL THEN
    SELECT p.root_id, p.full_id, p.trace_context INTO v_root_id, v_full_id, v_trace
      FROM postjob.postjobs p WHERE p.id = NEW.parent_id FOR KEY SHARE;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'postjob: job % has no parent %: no such job', NEW.id, NEW.parent_id
        USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF NEW.root_id IS NULL OR NEW.full_id IS NULL THEN
      NEW.root_id := COALESCE(v_root_id, NEW.parent_id);
      NEW.full_id := COALESCE(v_full_id, NEW.parent_id::varchar) || '.' || NEW.id;
      NEW.trace_context := COALESCE(NEW.trace_context, v_trace);  -- one trace per tree
    END IF;
  ELSIF NEW.root_id IS NULL OR NEW.full_id IS NULL THEN
    NEW.root_id := NEW.id;
    NEW.full_id := NEW.id::varchar;
  END IF;
  IF NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL THEN
    NEW.timing_out_at := statement_timestamp() + NEW.timeout * interval '1 second';
  END IF;
  NEW.unique_key_held := NEW.unique_key IS NOT NULL
                         AND NEW.status IN ('ready', 'processing', 'sleep', 'err');
  RETURN NEW;
END;
$$;

-- When an unfinished job inserted in this state may first run: now or at next_run_at when it
-- is ready or err, never for a manual step (a person finishes it) or a sleeping job.
CREATE OR REPLACE FUNCTION postjob._first_run_at(p_status postjob.statuses, p_workflow varchar,
                                                 p_next_run_at timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN p_status IN ('ready', 'err') AND p_workflow <> '__manual__'
              THEN COALESCE(p_next_run_at, statement_timestamp()) END
$$;

-- Row by row, after an insert that did not queue the job itself: its row in
-- postjob.unfinished (a unique key another unfinished job holds fails the insert, as a
-- unique index would), and a wake-up for an idle worker when it has a time to run.
CREATE OR REPLACE FUNCTION postjob._job_added() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  v_run_at timestamptz := postjob._first_run_at(NEW.status, NEW.workflow, NEW.next_run_at);
BEGIN
  IF NEW.status NOT IN ('ready', 'err', 'sleep') THEN
    RETURN NULL;  -- inserted finished: nothing waits
  END IF;
  INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, queue, priority,
                                  run_at, due, timing_out_at, parent_id, unique_key)
  VALUES (NEW.id, NEW.status, NEW.workflow, NEW.workflow_version, NEW.queue, NEW.priority,
          v_run_at, COALESCE(v_run_at <= statement_timestamp(), false), NEW.timing_out_at,
          NEW.parent_id, CASE WHEN NEW.unique_key_held THEN NEW.unique_key END);
  IF v_run_at IS NOT NULL THEN
    PERFORM postjob._wake_for(1, NEW.workflow, NEW.workflow_version, NEW.queue);
  END IF;
  RETURN NULL;
END;
$$;

-- Whether a worker that registered these workflows (names), their versions (in the same
-- order; NULL: not said, every version) and queues (NULL: all) serves jobs of (p_workflow,
-- p_version, p_queue). A job of version '' runs on any version of its workflow.
CREATE OR REPLACE FUNCTION postjob._serves(p_workflows text[], p_versions text[],
                                           p_queues text[], p_workflow varchar,
                                           p_version varchar, p_queue varchar)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
  SELECT (p_queues IS NULL OR p_queue = ANY (p_queues))
     AND p_workflow = ANY (p_workflows)
     AND (p_version = '' OR p_versions IS NULL
          OR EXISTS (SELECT 1 FROM unnest(p_workflows, p_versions) AS s(name, version)
                     WHERE s.name = p_workflow AND s.version = p_version))
$$;

-- Whether jobs due now and not running include one that a worker registered with these
-- workflows, versions and queues serves (a look at the due jobs of its workflows).
CREATE OR REPLACE FUNCTION postjob._serves_due(p_workflows text[], p_versions text[],
                                               p_queues text[])
RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM postjob.unfinished u
                 WHERE u.workflow = ANY (p_workflows) AND u.due AND u.lease_token IS NULL
                   AND postjob._serves(p_workflows, p_versions, p_queues, u.workflow,
                                       u.workflow_version, u.queue))
$$;

-- Wake idle workers for p_count new jobs of (p_workflow, p_version, p_queue): up to p_count
-- of the workers waiting for work that serve them (the longest waiting first) each get a
-- notification on a channel of their own, so that one new job wakes one worker that can run
-- it, not every one, and never one that cannot. A worker marks itself waiting before its
-- wait (worker_idle) and is unmarked here; when fewer than p_count of those are waiting (all
-- busy, or marked by a transaction that has not committed, or no worker is known to serve
-- the jobs), every listening worker is told on postjob_notifications instead, so no wake-up
-- is lost to a worker that is just going idle. Notifications go out when the transaction
-- commits. A worker's notification carries when it was sent (epoch seconds): a worker that
-- cannot use it passes it on with that moment (pass_wakeup_v1).
CREATE OR REPLACE FUNCTION postjob._wake_for(p_count integer, p_workflow varchar,
                                             p_version varchar, p_queue varchar)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_woken integer := 0;
BEGIN
  FOR v_id IN
    UPDATE postjob.workers w SET waiting_since = NULL
    WHERE w.id = ANY (ARRAY(
      SELECT x.id FROM postjob.workers x
      WHERE x.waiting_since IS NOT NULL AND x.expires_at > statement_timestamp()
        AND postjob._serves(x.workflows, x.workflow_versions, x.queues, p_workflow,
                            p_version, p_queue)
      ORDER BY x.waiting_since LIMIT p_count
      FOR NO KEY UPDATE SKIP LOCKED))
    RETURNING w.id
  LOOP
    PERFORM pg_notify('postjob_worker_' || v_id,
                      extract(epoch FROM statement_timestamp())::text);
    v_woken := v_woken + 1;
  END LOOP;
  IF v_woken < p_count AND EXISTS (SELECT 1 FROM postjob.workers x
                                   WHERE x.expires_at > statement_timestamp()) THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
END;
$$;

-- Wake idle workers for p_count jobs that became runnable, when what they are is not at hand
-- (a run's end that freed a place, a retry due at once, an event, a reset): as _wake_for,
-- among the waiting workers that serve a job due now and not running (a look at the due jobs
-- of each waiting worker's workflows, the longest waiting first, until p_count are found).
CREATE OR REPLACE FUNCTION postjob._wake(p_count integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_woken integer := 0;
BEGIN
  FOR v_id IN
    UPDATE postjob.workers w SET waiting_since = NULL
    WHERE w.id = ANY (ARRAY(
      SELECT x.id FROM postjob.workers x
      WHERE x.waiting_since IS NOT NULL AND x.expires_at > statement_timestamp()
        AND postjob._serves_due(x.workflows, x.workflow_versions, x.queues)
      ORDER BY x.waiting_since LIMIT p_count
      FOR NO KEY UPDATE SKIP LOCKED))
    RETURNING w.id
  LOOP
    PERFORM pg_notify('postjob_worker_' || v_id,
                      extract(epoch FROM statement_timestamp())::text);
    v_woken := v_woken + 1;
  END LOOP;
  IF v_woken < p_count AND EXISTS (SELECT 1 FROM postjob.workers x
                                   WHERE x.expires_at > statement_timestamp()) THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
END;
$$;

-- A worker woken by a notification of its own (sent at p_since, its payload) whose checkout
-- then found nothing to take (another worker took the job first, or the due jobs it serves
-- cannot start now) passes the wake-up on: to the worker waiting longest among those that
-- were waiting already when it was sent and serve a job due now. A woken worker waits again
-- from a later moment, so a wake-up reaches each worker at most once.
CREATE OR REPLACE FUNCTION postjob.pass_wakeup_v1(p_worker_id bigint, p_since text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
BEGIN
  UPDATE postjob.workers w SET waiting_since = NULL
  WHERE w.id = (
    SELECT x.id FROM postjob.workers x
    WHERE x.waiting_since < to_timestamp(p_since::double precision)
      AND x.id <> p_worker_id AND x.expires_at > statement_timestamp()
      AND postjob._serves_due(x.workflows, x.workflow_versions, x.queues)
    ORDER BY x.waiting_since LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED)
  RETURNING w.id INTO v_id;
  IF v_id IS NOT NULL THEN
    PERFORM pg_notify('postjob_worker_' || v_id, p_since);
  END IF;
END;
$$;

-- A root job, queued by postjob_sa's enqueue: its row in postjob.unfinished and its record
-- written by the same call (no trigger runs), an idle worker woken; its id, or NULL when an
-- unfinished job holds the unique key (ON CONFLICT: a concurrent enqueue of the same key
-- waits for the other transaction instead of failing). A function, so that its statements'
-- plans are kept for the session's next call.
CREATE OR REPLACE FUNCTION postjob.enqueue_v1(
  p_workflow varchar, p_args jsonb, p_queue varchar, p_max_attempts integer,
  p_timeout double precision, p_version varchar, p_tags jsonb, p_run_at timestamptz,
  p_priority integer, p_unique_key varchar, p_trace_context jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint;
  v_run_at timestamptz := COALESCE(p_run_at, statement_timestamp());
  v_timing_out_at timestamptz := statement_timestamp() + p_timeout * interval '1 second';
BEGIN
  -- the id is drawn by the insert, after its lock of postjob.unfinished: the tables first,
  -- then the sequence, as a migration that locks the tables and then alters the sequence does
  INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, queue, priority,
                                  run_at, due, timing_out_at, unique_key)
  VALUES (nextval('postjob.postjobs_id_seq'), 'ready', p_workflow, p_version, p_queue,
          p_priority, v_run_at, v_run_at <= statement_timestamp(), v_timing_out_at, p_unique_key)
  ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
  RETURNING job_id INTO v_id;
  IF v_id IS NULL THEN
    RETURN NULL;
  END IF;
  INSERT INTO postjob.postjobs (id, root_id, full_id, workflow, args, queue, max_attempts,
                                timeout, timing_out_at, workflow_version, tags, next_run_at,
                                priority, unique_key, unique_key_held, trace_context, queued)
  VALUES (v_id, v_id, v_id::varchar, p_workflow, p_args, p_queue, p_max_attempts, p_timeout,
          v_timing_out_at, p_version, p_tags, v_run_at, p_priority, p_unique_key,
          p_unique_key IS NOT NULL, p_trace_context, true);
  PERFORM postjob._wake_for(1, p_workflow, p_version, p_queue);
  RETURN v_id;
END;
$$;

-- Once per statement, after a DELETE (retention, or a tree removed by its root): what the
-- deleted jobs waited or held goes with them, their steps, event waits and tokens, and their
-- children (whose removal comes back here: a tree goes whole). A child has a later id than
-- its parent, which prunes the ranges of the record the children are looked for in.
CREATE OR REPLACE FUNCTION postjob._jobs_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM removed) THEN
    RETURN NULL;  -- the statement removed nothing (the last generation had no children)
  END IF;
  DELETE FROM postjob.postjobs c
    WHERE c.parent_id IS NOT NULL AND c.id > (SELECT min(r.id) FROM removed r)
      AND c.parent_id IN (SELECT r.id FROM removed r);
  DELETE FROM postjob.tokens t USING removed r WHERE t.postjob_id = r.id;
  DELETE FROM postjob.unfinished u USING removed r WHERE u.job_id = r.id;
  UPDATE postjob.queue_slots s SET job_id = NULL FROM removed r WHERE s.job_id = r.id;
  DELETE FROM postjob.steps s USING removed r WHERE s.job_id = r.id;
  DELETE FROM postjob.event_waits e USING removed r WHERE e.job_id = r.id;
  DELETE FROM postjob.wakeups w USING removed r WHERE w.job_id = r.id;
  RETURN NULL;
END;
$$;

-- TRUNCATE of the jobs empties what refers to them.
CREATE OR REPLACE FUNCTION postjob._jobs_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  TRUNCATE postjob.unfinished, postjob.steps, postjob.event_waits, postjob.wakeups;
  DELETE FROM postjob.tokens;  -- a DELETE: the same statement may truncate it too
  UPDATE postjob.queue_slots SET job_id = NULL WHERE job_id IS NOT NULL;
  RETURN NULL;
END;
$$;

-- A write that only a function body of an earlier release makes: the lease columns of the
-- record, the narrow tables of pj0008. Such a body runs only in a call that began before
-- the upgrade and waited for its lock; it is refused with a serialization failure, which the
-- released worker (or app) tries again, and the call then reaches this revision's functions.
CREATE OR REPLACE FUNCTION postjob._stale_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'postjob: a call that began before the upgrade of this database wrote %: '
    'refused (try again)', TG_TABLE_NAME USING ERRCODE = 'serialization_failure';
END;
$$;
