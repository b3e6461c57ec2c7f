-- The checkout that counts (checkout_v4 hands it what its one statement does not take on):
-- a limited queue with room, whose places and starts are locked one by one; a checkout
-- through the API, which names its holder in the records and takes the jobs whose time has
-- come even when no worker has made them due (it makes nothing due itself: a row it made due
-- would stay locked until the caller commits). It locks only the jobs it hands out.

-- The groups this checkout may take from, with how many each offers: the due groups (a
-- limited queue's at most its free places and starts), and with p_scheduled one group per
-- served pair for the jobs of unlimited queues whose time has come. Then each group's share:
-- the first p_limit of all the groups' first jobs by priority and time.
CREATE OR REPLACE FUNCTION postjob._checkout_shares(
  p_workflows text[], p_versions text[], p_queues text[], p_limit integer,
  p_scheduled boolean)
RETURNS TABLE (workflow varchar, workflow_version varchar, queue varchar, scheduled boolean,
               share integer)
LANGUAGE sql STABLE AS $$
  WITH groups AS (
    SELECT g.workflow, g.workflow_version, g.queue, false AS scheduled,
           (SELECT postjob._permits_free(l, p_limit) FROM postjob.queue_limits l
            WHERE l.queue = g.queue) AS offer
    FROM postjob._due_groups(p_workflows, p_versions, p_queues) g
    UNION ALL
    SELECT k.workflow, k.workflow_version, NULL, true, NULL
    FROM postjob._served_keys(p_workflows, p_versions) k WHERE p_scheduled
  ), first AS (
    SELECT g.workflow, g.workflow_version, g.queue, g.scheduled, f.priority, f.run_at, f.job_id
    FROM groups g CROSS JOIN LATERAL (
      SELECT u.priority, u.run_at, u.job_id FROM postjob.unfinished u
      WHERE u.workflow = g.workflow AND u.workflow_version = g.workflow_version
        AND u.lease_token IS NULL AND NOT g.scheduled AND u.queue = g.queue AND u.due
        AND (u.timing_out_at IS NULL OR u.timing_out_at > statement_timestamp())
      ORDER BY u.priority DESC, u.run_at, u.job_id LIMIT COALESCE(g.offer, p_limit)) f
    UNION ALL
    SELECT g.workflow, g.workflow_version, NULL, true, f.priority, f.run_at, f.job_id
    FROM groups g CROSS JOIN LATERAL (
      SELECT u.priority, u.run_at, u.job_id FROM postjob.unfinished u
      WHERE u.workflow = g.workflow AND u.workflow_version = g.workflow_version
        AND g.scheduled AND NOT u.due AND u.run_at <= statement_timestamp()
        AND u.lease_token IS NULL AND (p_queues IS NULL OR u.queue = ANY (p_queues))
        AND NOT EXISTS (SELECT 1 FROM postjob.queue_limits l WHERE l.queue = u.queue)
        AND (u.timing_out_at IS NULL OR u.timing_out_at > statement_timestamp())
      ORDER BY u.run_at LIMIT p_limit) f
  )
  SELECT m.workflow, m.workflow_version, m.queue, m.scheduled, count(*)::integer
  FROM (SELECT * FROM first ORDER BY priority DESC, run_at, job_id LIMIT p_limit) m
  GROUP BY m.workflow, m.workflow_version, m.queue, m.scheduled
$$;

-- Lock up to p_want free places and starts of a limited queue (SKIP LOCKED); left_over is
-- how many jobs they let start.
CREATE OR REPLACE FUNCTION postjob._permits_lock(p_limits postjob.queue_limits, p_want integer,
                                                 p_now timestamptz)
RETURNS TABLE (slots integer[], starts integer[], left_over integer)
LANGUAGE plpgsql AS $$
DECLARE
  v_left integer := p_want;
BEGIN
  slots := ARRAY(
    SELECT s.slot FROM postjob.queue_slots s
    WHERE p_limits.concurrency IS NOT NULL AND s.queue = p_limits.queue
      AND s.slot <= p_limits.concurrency AND s.job_id IS NULL
    ORDER BY s.slot LIMIT v_left FOR UPDATE SKIP LOCKED);
  IF p_limits.concurrency IS NOT NULL THEN
    v_left := cardinality(slots);
  END IF;
  starts := ARRAY(
    SELECT s.n FROM postjob.queue_starts s
    WHERE p_limits.rate IS NOT NULL AND s.queue = p_limits.queue AND s.n <= p_limits.rate
      AND (s.started_at IS NULL OR s.started_at <= p_now - postjob._period(p_limits.period))
    ORDER BY s.started_at NULLS FIRST, s.n LIMIT v_left FOR UPDATE SKIP LOCKED);
  IF p_limits.rate IS NOT NULL THEN
    v_left := cardinality(starts);
  END IF;
  left_over := v_left;
  RETURN NEXT;
END;
$$;

-- Lock up to p_limit jobs of one share (SKIP LOCKED): due ones of a queue, or with
-- p_scheduled those of unlimited queues whose time has come. Two statements, not one with a
-- CASE: each is served by its own partial index, where a generic plan of one statement
-- could choose neither and would scan the table.
CREATE OR REPLACE FUNCTION postjob._pick(
  p_workflow varchar, p_version varchar, p_queue varchar, p_scheduled boolean,
  p_queues text[], p_limit integer, p_now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
  IF p_scheduled THEN
    RETURN ARRAY(
      SELECT u.job_id FROM postjob.unfinished u
      WHERE u.workflow = p_workflow AND u.workflow_version = p_version
        AND NOT u.due AND u.run_at IS NOT NULL AND u.lease_token IS NULL AND u.run_at <= p_now
        AND (u.timing_out_at IS NULL OR u.timing_out_at > p_now)
        AND (p_queues IS NULL OR u.queue = ANY (p_queues))
        AND NOT EXISTS (SELECT 1 FROM postjob.queue_limits l WHERE l.queue = u.queue)
      ORDER BY u.priority DESC, u.run_at, u.job_id LIMIT p_limit FOR UPDATE SKIP LOCKED);
  END IF;
  RETURN ARRAY(
    SELECT u.job_id FROM postjob.unfinished u
    WHERE u.workflow = p_workflow AND u.workflow_version = p_version AND u.queue = p_queue
      AND u.due AND u.lease_token IS NULL AND (u.timing_out_at IS NULL OR u.timing_out_at > p_now)
    ORDER BY u.priority DESC, u.run_at, u.job_id LIMIT p_limit FOR UPDATE SKIP LOCKED);
END;
$$;

-- See the top of this file. A limited queue's share is what it can lock of its places and
-- starts (SKIP LOCKED: nothing locks the queue as a whole, so checkouts of several
-- transactions never share a place and never wait for each other); each job it hands out
-- takes one of them, and the ones left over stay free.
CREATE OR REPLACE FUNCTION postjob._checkout_counted(
  p_token bigint, p_worker_id bigint, p_holder varchar, p_workflows text[], p_versions text[],
  p_queues text[], p_limit integer, p_lease double precision, p_scheduled boolean)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint,
               attempt integer, max_attempts integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_shares record;
  v_limits postjob.queue_limits;
  v_taken bigint[] := '{}';
  v_got bigint[];
  v_picked bigint[];
  v_slots integer[];
  v_starts integer[];
  v_left integer;
BEGIN
  FOR v_shares IN
    SELECT s.* FROM postjob._checkout_shares(p_workflows, p_versions, p_queues, p_limit,
                                             p_scheduled) s
    ORDER BY s.queue NULLS LAST, s.workflow, s.workflow_version
  LOOP
    v_left := v_shares.share;
    SELECT * INTO v_limits FROM postjob.queue_limits l WHERE l.queue = v_shares.queue;
    IF FOUND THEN  -- lock the places and starts first: the share is what could be locked
      SELECT p.slots, p.starts, p.left_over INTO v_slots, v_starts, v_left
        FROM postjob._permits_lock(v_limits, v_left, v_now) p;
    END IF;
    CONTINUE WHEN v_left < 1;
    v_picked := postjob._pick(v_shares.workflow, v_shares.workflow_version, v_shares.queue,
                              v_shares.scheduled, p_queues, v_left, v_now);
    WITH taken AS (
      UPDATE postjob.unfinished u SET
        lease_token = p_token, worker_id = p_worker_id, holder = p_holder, started_at = v_now,
        lease_expires_at = v_now + p_lease * interval '1 second', due = true, woken = false
      WHERE u.job_id = ANY (v_picked)
      RETURNING u.job_id
    )
    SELECT COALESCE(array_agg(t.job_id ORDER BY t.job_id), '{}') INTO v_got FROM taken t;
    v_taken := v_taken || v_got;
    IF v_limits.queue IS NOT NULL THEN  -- each job takes one of the places and starts
      UPDATE postjob.queue_slots s SET job_id = x.job_id
      FROM unnest(v_slots[1:cardinality(v_got)], v_got) AS x(slot, job_id)
      WHERE s.queue = v_limits.queue AND s.slot = x.slot;
      UPDATE postjob.queue_starts s SET started_at = v_now
      WHERE s.queue = v_limits.queue AND s.n = ANY (v_starts[1:cardinality(v_got)]);
      v_limits := NULL;
    END IF;
  END LOOP;
  IF p_holder IS NOT NULL AND cardinality(v_taken) > 0 THEN  -- the caller's transaction
    UPDATE postjob.postjobs j SET
      processing_client = host(inet_client_addr()) || ':' || inet_client_port(),
      processing_client_identifier = p_holder, processing_started_at = v_now,
      processing_max_duration = p_lease, updated_at = v_now
    WHERE j.id = ANY (v_taken);
  END IF;
  RETURN QUERY
  SELECT j.id, p_token, j.workflow, j.workflow_version, j.args, j.queue, j.root_id, j.full_id,
         j.parent_id, j.failed_attempts + 1, j.max_attempts
  FROM postjob.unfinished u JOIN postjob.postjobs j ON j.id = u.job_id
  WHERE u.job_id = ANY (v_taken) AND j.id = ANY (v_taken)
  ORDER BY u.priority DESC, u.run_at, u.job_id;
END;
$$;
