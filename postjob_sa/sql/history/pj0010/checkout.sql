-- Checkout: hand due jobs to a worker (or to JobQueue.checkout), highest priority first, then
-- the earliest due, each under one lease token.
--
-- Only postjob.unfinished is searched, and only its index of due jobs (unfinished_due_idx,
-- keyed by workflow, version, queue, then priority and time). What a worker cannot take now
-- costs it nothing: finished jobs are not in the table; manual steps, sleeping jobs, running
-- jobs and jobs whose time has not come are not in the index; other workflows and unserved
-- queues are other key ranges; a limited queue at its cap is left after one look.
--
-- A checkout takes its jobs as it reads them (FOR UPDATE SKIP LOCKED: a job another checkout
-- holds is passed over, never waited for) and writes their lease into their rows. A worker's
-- checkout writes nothing else; one through the API (in the caller's transaction) also names
-- its holder in the records.

-- The (workflow, version) pairs a worker's jobs may have: a job enqueued without a version
-- runs on any version of its workflow.
CREATE OR REPLACE FUNCTION postjob._served_keys(p_workflows text[], p_versions text[])
RETURNS TABLE (workflow text, workflow_version text)
LANGUAGE sql IMMUTABLE AS $$
  SELECT DISTINCT w.name, v.version
  FROM unnest(p_workflows, p_versions) AS w(name, version)
  CROSS JOIN LATERAL (VALUES (''::text), (w.version)) AS v(version)
$$;

-- Make due the waiting jobs of these workflows whose time has come (at most p_limit of them,
-- the earliest first; rows another transaction holds are left for the next call), after
-- telling the families of jobs whose ends are still to be told (postjob.wakeups). Called
-- where it commits at once (a worker's cycle and idle wait, reaping): a row it sets stays
-- locked until its transaction ends, so never inside a caller's transaction.
CREATE OR REPLACE FUNCTION postjob._promote(p_workflows text[], p_versions text[],
                                            p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_count integer;
BEGIN
  IF EXISTS (SELECT 1 FROM postjob.wakeups) THEN  -- ends still to be told
    PERFORM postjob._tell_pending();
  END IF;
  UPDATE postjob.unfinished u SET due = true
  WHERE u.job_id = ANY (ARRAY(
    SELECT s.job_id
    FROM postjob._served_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT s.job_id FROM postjob.unfinished s
      WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND NOT s.due AND s.run_at IS NOT NULL AND s.lease_token IS NULL
        AND s.run_at <= statement_timestamp()
      ORDER BY s.run_at
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED) s))
    AND NOT u.due;
  GET DIAGNOSTICS v_count = ROW_COUNT;
  RETURN v_count;
END;
$$;

-- The (workflow, version, queue) groups with due jobs for this worker, each with its first
-- job's priority and time. With p_queues, one look per served queue and pair; without, a
-- loose scan of the index: one look per queue that has due jobs. (One SQL statement, so that
-- the checkout's own statement takes it in: no function call of its own at every checkout.)
CREATE OR REPLACE FUNCTION postjob._due_groups(p_workflows text[], p_versions text[],
                                               p_queues text[])
RETURNS TABLE (workflow varchar, workflow_version varchar, queue varchar, priority integer,
               run_at timestamptz)
LANGUAGE sql STABLE AS $$
  WITH RECURSIVE g AS (
    SELECT t.workflow, t.workflow_version, t.queue, t.priority, t.run_at
    FROM postjob._served_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT u.workflow, u.workflow_version, u.queue, u.priority, u.run_at
      FROM postjob.unfinished u
      WHERE u.workflow = k.workflow AND u.workflow_version = k.workflow_version AND u.due
        AND u.lease_token IS NULL
      ORDER BY u.queue, u.priority DESC, u.run_at, u.job_id
      LIMIT 1) t
    WHERE p_queues IS NULL
    UNION ALL
    SELECT t.workflow, t.workflow_version, t.queue, t.priority, t.run_at
    FROM g CROSS JOIN LATERAL (
      SELECT u.workflow, u.workflow_version, u.queue, u.priority, u.run_at
      FROM postjob.unfinished u
      WHERE u.workflow = g.workflow AND u.workflow_version = g.workflow_version AND u.due
        AND u.lease_token IS NULL AND u.queue > g.queue
      ORDER BY u.queue, u.priority DESC, u.run_at, u.job_id
      LIMIT 1) t
  )
  SELECT g.workflow, g.workflow_version, g.queue, g.priority, g.run_at FROM g
  UNION ALL
  SELECT t.workflow, t.workflow_version, t.queue, t.priority, t.run_at
  FROM postjob._served_keys(p_workflows, p_versions) k
  CROSS JOIN unnest(p_queues) AS q(queue)
  CROSS JOIN LATERAL (
    SELECT u.workflow, u.workflow_version, u.queue, u.priority, u.run_at
    FROM postjob.unfinished u
    WHERE u.workflow = k.workflow AND u.workflow_version = k.workflow_version
      AND u.queue = q.queue AND u.due AND u.lease_token IS NULL
    ORDER BY u.priority DESC, u.run_at, u.job_id
    LIMIT 1) t
  WHERE p_queues IS NOT NULL
$$;

-- A stored period as an interval, kept within what timestamps can take: a checkout never
-- fails because of a stored limit (JobQueue.set_queue_limits refuses such periods anyway).
CREATE OR REPLACE FUNCTION postjob._period(p_seconds double precision)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
  SELECT least(greatest(p_seconds, 0.001), 1e9) * interval '1 second'
$$;

-- How many of a limited queue's jobs a checkout may start now, at most p_want: its free
-- places and free starts as this transaction sees them (an estimate: another transaction may
-- hold some; what the checkout locks is what counts).
CREATE OR REPLACE FUNCTION postjob._permits_free(p_limits postjob.queue_limits, p_want integer)
RETURNS integer
LANGUAGE sql STABLE AS $$
  SELECT least(
    p_want,
    CASE WHEN p_limits.concurrency IS NULL THEN p_want WHEN p_limits.concurrency = 0 THEN 0 ELSE (
      SELECT count(*)::integer FROM (
        SELECT 1 FROM postjob.queue_slots s
        WHERE s.queue = p_limits.queue AND s.slot <= p_limits.concurrency AND s.job_id IS NULL
        LIMIT p_want) f) END,
    CASE WHEN p_limits.rate IS NULL THEN p_want WHEN p_limits.rate = 0 THEN 0 ELSE (
      SELECT count(*)::integer FROM (
        SELECT 1 FROM postjob.queue_starts s
        WHERE s.queue = p_limits.queue AND s.n <= p_limits.rate
          AND (s.started_at IS NULL
               OR s.started_at <= statement_timestamp() - postjob._period(p_limits.period))
        ORDER BY s.started_at NULLS FIRST
        LIMIT p_want) f) END)
$$;

-- The limited queues a worker's checkout may meet (all, or those of p_queues), and whether
-- one of them has due jobs of its workflows and room to start one now: then the checkout must
-- count the queue's places and starts (see _checkout_counted). A limit at its cap, the
-- common case beside a backlog, is not room. One look at the (small) table of limits.
CREATE OR REPLACE FUNCTION postjob._limited_queues(p_workflows text[], p_versions text[],
                                                   p_queues text[])
RETURNS TABLE (queues varchar[], room boolean) LANGUAGE sql STABLE AS $$
  SELECT COALESCE(array_agg(l.queue), '{}'), COALESCE(bool_or(
           (l.concurrency IS NULL OR (l.concurrency > 0 AND EXISTS (
              SELECT 1 FROM postjob.queue_slots s
              WHERE s.queue = l.queue AND s.slot <= l.concurrency AND s.job_id IS NULL)))
           AND (l.rate IS NULL OR (l.rate > 0 AND EXISTS (
              SELECT 1 FROM postjob.queue_starts s
              WHERE s.queue = l.queue AND s.n <= l.rate
                AND (s.started_at IS NULL
                     OR s.started_at <= statement_timestamp() - postjob._period(l.period)))))
           AND EXISTS (
              SELECT 1 FROM postjob._served_keys(p_workflows, p_versions) k
              JOIN postjob.unfinished u ON u.workflow = k.workflow
               AND u.workflow_version = k.workflow_version AND u.queue = l.queue
              WHERE u.due AND u.lease_token IS NULL)), false)
  FROM postjob.queue_limits l
  WHERE p_queues IS NULL OR l.queue = ANY (p_queues)
$$;

-- Check out up to p_limit due jobs of the given (workflow, version) pairs (and queues, when
-- p_queues is not NULL) under one lease of p_lease seconds, held by the worker p_worker_id as
-- long as it beats, or, for a checkout through the API (p_holder names it; p_worker_id is
-- NULL), until the lease expires. With p_scheduled (the API: it makes nothing due, see
-- _promote) it also takes jobs whose time has come that no worker has made due yet. A
-- worker's checkout reaps first (p_reap) and makes due what has come due (p_promote) when it
-- asks. Returns the jobs in the order to run them, with the attempt each run is.
--
-- The common case, a worker with no limited queue to count: one statement. The due groups'
-- first jobs are merged by priority and time into each group's share (for one group, the
-- whole batch), each group takes its share as it reads it, the rows get the lease, and the
-- records give the jobs' arguments.
CREATE OR REPLACE FUNCTION postjob.checkout_v4(
  p_worker_id bigint, p_holder varchar, p_workflows text[], p_versions text[],
  p_queues text[], p_limit integer, p_lease double precision, p_scheduled boolean,
  p_reap boolean, p_promote boolean)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint,
               attempt integer, max_attempts integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_token bigint;
  v_limited varchar[];
  v_room boolean;
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap_v4();
  END IF;
  IF p_promote THEN  -- (a worker's first checkout after a wait: it waits no more)
    PERFORM postjob._promote(p_workflows, p_versions);
    UPDATE postjob.workers SET waiting_since = NULL
    WHERE id = p_worker_id AND waiting_since IS NOT NULL;
  END IF;
  IF p_limit IS NULL OR p_limit < 1 THEN
    RETURN;
  END IF;
  v_token := nextval('postjob.lease_tokens');
  SELECT l.queues, l.room INTO v_limited, v_room
    FROM postjob._limited_queues(p_workflows, p_versions, p_queues) l;
  IF p_holder IS NOT NULL OR p_scheduled OR v_room THEN
    RETURN QUERY SELECT * FROM postjob._checkout_counted(
      v_token, p_worker_id, p_holder, p_workflows, p_versions, p_queues, p_limit, p_lease,
      p_scheduled);
    RETURN;
  END IF;
  RETURN QUERY
  WITH groups AS MATERIALIZED (
    SELECT g.workflow, g.workflow_version, g.queue,
           row_number() OVER (ORDER BY g.priority DESC, g.run_at) AS i, count(*) OVER () AS n
    FROM postjob._due_groups(p_workflows, p_versions, p_queues) g
    WHERE g.queue <> ALL (v_limited)
  ), merged AS (  -- several groups: the batch's first jobs across them
    SELECT f.i FROM groups g CROSS JOIN LATERAL (
      SELECT g.i, u.priority, u.run_at, u.job_id FROM postjob.unfinished u
      WHERE u.workflow = g.workflow AND u.workflow_version = g.workflow_version
        AND u.queue = g.queue AND u.due AND u.lease_token IS NULL
        AND (u.timing_out_at IS NULL OR u.timing_out_at > v_now)
      ORDER BY u.priority DESC, u.run_at, u.job_id LIMIT p_limit) f
    WHERE g.n > 1
    ORDER BY f.priority DESC, f.run_at, f.job_id LIMIT p_limit
  ), picked AS (
    SELECT t.job_id FROM groups g CROSS JOIN LATERAL (
      SELECT u.job_id FROM postjob.unfinished u
      WHERE u.workflow = g.workflow AND u.workflow_version = g.workflow_version
        AND u.queue = g.queue AND u.due AND u.lease_token IS NULL
        AND (u.timing_out_at IS NULL OR u.timing_out_at > v_now)
      ORDER BY u.priority DESC, u.run_at, u.job_id
      LIMIT CASE WHEN g.n = 1 THEN p_limit ELSE (SELECT count(*) FROM merged m WHERE m.i = g.i) END
      FOR UPDATE SKIP LOCKED) t
  ), taken AS (
    UPDATE postjob.unfinished u SET
      lease_token = v_token, worker_id = p_worker_id, started_at = v_now, woken = false,
      lease_expires_at = v_now + p_lease * interval '1 second'
    WHERE u.job_id = ANY (ARRAY(SELECT p.job_id FROM picked p))
    RETURNING u.job_id, u.priority, u.run_at
  )
  SELECT j.id, v_token, j.workflow, j.workflow_version, j.args, j.queue, j.root_id, j.full_id,
         j.parent_id, j.failed_attempts + 1, j.max_attempts
  FROM taken t JOIN postjob.postjobs j ON j.id = t.job_id
  WHERE j.id = ANY (ARRAY(SELECT t.job_id FROM taken t))
  ORDER BY t.priority DESC, t.run_at, t.job_id;
END;
$$;
