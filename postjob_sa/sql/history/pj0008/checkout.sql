-- Checkout: hand due jobs to a worker (or to JobQueue.checkout), highest priority first, then
-- the earliest due, each under one lease token.
--
-- Only postjob.waiting is searched, and only its index of due jobs (waiting_due_idx, keyed by
-- workflow, version, queue, then priority and time). What a worker cannot take now costs it
-- nothing: finished jobs are not in the table, manual steps, sleeping parents and jobs whose
-- time has not come are not in the index, other workflows and unserved queues are other key
-- ranges, and a limited queue at its cap is left after one look at its places.
--
-- A checkout takes its jobs as it reads them (FOR UPDATE SKIP LOCKED: a job another checkout
-- holds is passed over, never waited for), deletes their waiting rows and marks them
-- processing in postjob.postjobs (a HOT update).

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
-- the earliest first; rows another transaction holds are left for the next call). Called
-- where it commits at once (a worker's cycle and idle wait, reaping): a row it sets stays
-- locked until its transaction ends.
CREATE OR REPLACE FUNCTION postjob._promote(p_workflows text[], p_versions text[],
                                            p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_count integer;
BEGIN
  UPDATE postjob.waiting w SET due = true
  WHERE w.job_id = ANY (ARRAY(
    SELECT s.job_id
    FROM postjob._served_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT s.job_id FROM postjob.waiting s
      WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND NOT s.due AND s.run_at IS NOT NULL AND s.run_at <= statement_timestamp()
      ORDER BY s.run_at
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED) s))
    AND NOT w.due;
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
      SELECT w.workflow, w.workflow_version, w.queue, w.priority, w.run_at
      FROM postjob.waiting w
      WHERE w.workflow = k.workflow AND w.workflow_version = k.workflow_version AND w.due
      ORDER BY w.queue, w.priority DESC, w.run_at, w.job_id
      LIMIT 1) t
    WHERE p_queues IS NULL
    UNION ALL
    SELECT t.workflow, t.workflow_version, t.queue, t.priority, t.run_at
    FROM g CROSS JOIN LATERAL (
      SELECT w.workflow, w.workflow_version, w.queue, w.priority, w.run_at
      FROM postjob.waiting w
      WHERE w.workflow = g.workflow AND w.workflow_version = g.workflow_version AND w.due
        AND w.queue > g.queue
      ORDER BY w.queue, w.priority DESC, w.run_at, w.job_id
      LIMIT 1) t
  )
  SELECT g.workflow, g.workflow_version, g.queue, g.priority, g.run_at FROM g
  UNION ALL
  SELECT t.workflow, t.workflow_version, t.queue, t.priority, t.run_at
  FROM postjob._served_keys(p_workflows, p_versions) k
  CROSS JOIN unnest(p_queues) AS q(queue)
  CROSS JOIN LATERAL (
    SELECT w.workflow, w.workflow_version, w.queue, w.priority, w.run_at
    FROM postjob.waiting w
    WHERE w.workflow = k.workflow AND w.workflow_version = k.workflow_version
      AND w.queue = q.queue AND w.due
    ORDER BY w.priority DESC, w.run_at, w.job_id
    LIMIT 1) t
  WHERE p_queues IS NOT NULL
$$;

-- Lock up to p_counts[i] due jobs of each group i (SKIP LOCKED: passed over when another
-- transaction holds them) and hand them out under p_token: their waiting rows go, their
-- records become processing (a HOT update: no index of postjob.postjobs covers what changes),
-- and the lease row names them. Returns them in the order to run them, each with its group.
CREATE OR REPLACE FUNCTION postjob._take(
  p_workflows varchar[], p_versions varchar[], p_queues varchar[], p_counts integer[],
  p_token bigint, p_worker_id bigint, p_identifier varchar, p_lease double precision)
RETURNS TABLE (id bigint, workflow varchar, workflow_version varchar, args jsonb,
               queue varchar, root_id bigint, full_id varchar, parent_id bigint,
               attempt integer, max_attempts integer, grp integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
BEGIN
  RETURN QUERY
  WITH picked AS (
    SELECT p.job_id, g.i
    FROM unnest(p_workflows, p_versions, p_queues, p_counts)
      WITH ORDINALITY AS g(workflow, version, queue, n, i)
    CROSS JOIN LATERAL (
      SELECT w.job_id FROM postjob.waiting w
      WHERE w.workflow = g.workflow AND w.workflow_version = g.version AND w.queue = g.queue
        AND w.due AND (w.timing_out_at IS NULL OR w.timing_out_at > v_now)
      ORDER BY w.priority DESC, w.run_at, w.job_id
      LIMIT g.n
      FOR UPDATE SKIP LOCKED) p
  ), gone AS (
    -- by id from an array, never a join: a generic plan would not know picked is small and
    -- might hash the whole table
    DELETE FROM postjob.waiting w WHERE w.job_id = ANY (ARRAY(SELECT p.job_id FROM picked p))
    RETURNING w.job_id, w.priority, w.run_at
  ), taken AS (
    UPDATE postjob.postjobs j SET
      status = 'processing',
      next_run_at = NULL,
      error = NULL,
      error_message = NULL,
      error_backtrace = NULL,
      awaiting_id = NULL,
      processing_client = host(inet_client_addr()) || ':' || inet_client_port(),
      processing_client_identifier = COALESCE(p_identifier, postjob._client_identifier()),
      processing_started_at = v_now,
      processing_max_duration = p_lease,
      lease_expires_at = v_now + p_lease * interval '1 second',
      lease_token = p_token,
      worker_id = p_worker_id,
      updated_at = v_now
    FROM gone
    WHERE j.id = ANY (ARRAY(SELECT g.job_id FROM gone g)) AND j.id = gone.job_id
    RETURNING j.id, j.workflow, j.workflow_version, j.args, j.queue, j.root_id, j.full_id,
              j.parent_id, j.failed_attempts + 1 AS attempt, j.max_attempts, gone.priority,
              gone.run_at
  ), held AS (
    INSERT INTO postjob.leases (token, worker_id, expires_at, job_ids)
    SELECT p_token, p_worker_id, v_now + p_lease * interval '1 second', array_agg(t.id)
    FROM taken t HAVING count(*) > 0
    ON CONFLICT (token) DO UPDATE SET job_ids = postjob.leases.job_ids || EXCLUDED.job_ids
  )
  SELECT t.id, t.workflow, t.workflow_version, t.args, t.queue, t.root_id, t.full_id,
         t.parent_id, t.attempt, t.max_attempts, p.i::integer
  FROM taken t JOIN picked p ON p.job_id = t.id
  ORDER BY t.priority DESC, t.run_at, t.id;
END;
$$;

-- How many of a limited queue's jobs a checkout may start now, at most p_want: its free
-- places and free starts as this transaction sees them (an estimate: another transaction may
-- hold some; what the checkout locks is what counts).
CREATE OR REPLACE FUNCTION postjob._permits_free(p_limits postjob.queue_limits, p_want integer)
RETURNS integer
LANGUAGE sql STABLE AS $$
  SELECT least(
    p_want,
    CASE WHEN p_limits.concurrency IS NULL THEN p_want ELSE (
      SELECT count(*)::integer FROM (
        SELECT 1 FROM postjob.queue_slots s
        WHERE s.queue = p_limits.queue AND s.slot <= p_limits.concurrency AND s.job_id IS NULL
        LIMIT p_want) f) END,
    CASE WHEN p_limits.rate IS NULL THEN p_want ELSE (
      SELECT count(*)::integer FROM (
        SELECT 1 FROM postjob.queue_starts s
        WHERE s.queue = p_limits.queue AND s.n <= p_limits.rate
          AND (s.started_at IS NULL
               OR s.started_at <= statement_timestamp() - postjob._period(p_limits.period))
        ORDER BY s.started_at NULLS FIRST
        LIMIT p_want) f) END)
$$;

-- A stored period as an interval, kept within what timestamps can take: a checkout never
-- fails because of a stored limit (JobQueue.set_queue_limits refuses such periods anyway).
CREATE OR REPLACE FUNCTION postjob._period(p_seconds double precision)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
  SELECT least(greatest(p_seconds, 0.001), 1e9) * interval '1 second'
$$;

-- Check out up to p_limit due jobs of the given (workflow, version) pairs (and queues, when
-- p_queues is not NULL) under one lease of p_lease seconds: held by the worker p_worker_id as
-- long as it beats, or (NULL) until the lease expires. p_promote first makes due the jobs of
-- these workflows whose time has come (only where the checkout commits at once: see
-- _promote). Returns the jobs in the order to run them, with the attempt each run is.
--
-- One group (one pair and queue has due jobs) and no limit, the common case: one statement
-- takes its first jobs. Otherwise the first jobs of every group are read without locks and
-- merged by priority and time, a limited queue offering no more than its free places and
-- starts, and each group takes its share. A limited queue's jobs take its places and starts,
-- locked one by one with SKIP LOCKED: nothing locks the queue as a whole, so transactional
-- jobs of a limited queue run side by side and no checkout waits for another. A share that a
-- queue could not fill (its permits or jobs were taken meanwhile) goes to the other groups in
-- a second round.
CREATE OR REPLACE FUNCTION postjob.checkout_v3(
  p_worker_id bigint,
  p_identifier varchar,
  p_workflows text[],
  p_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision,
  p_promote boolean)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint,
               attempt integer, max_attempts integer)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_token bigint;
  v_wfs varchar[];
  v_versions varchar[];
  v_queues varchar[];
  v_counts integer[];
  v_limited varchar[];
  v_full varchar[];
  v_limits postjob.queue_limits;
  v_left integer := p_limit;
  v_round integer := 0;
  v_q varchar;
  v_want integer;
  v_got integer;
  v_i integer;
  v_slots integer[];
  v_starts integer[];
  v_slot_queues varchar[];
  v_slot_numbers integer[];
  v_start_queues varchar[];
  v_start_numbers integer[];
  v_taken_ids bigint[];
  v_taken_queues varchar[];
  v_taken_groups integer[];
  v_dry integer[] := '{}';  -- groups that gave less than their share
  v_row record;
BEGIN
  IF p_limit IS NULL OR p_limit < 1 THEN
    RETURN;
  END IF;
  IF p_promote THEN
    PERFORM postjob._promote(p_workflows, p_versions);
  END IF;
  -- the groups, their limited queues, and those of the limited ones with nothing free now
  -- (left out at once), in one statement
  SELECT array_agg(g.workflow ORDER BY g.priority DESC, g.run_at),
         array_agg(g.workflow_version ORDER BY g.priority DESC, g.run_at),
         array_agg(g.queue ORDER BY g.priority DESC, g.run_at),
         array_agg(DISTINCT l.queue) FILTER (WHERE l.queue IS NOT NULL),
         array_agg(DISTINCT l.queue) FILTER (WHERE
           (l.concurrency IS NOT NULL AND NOT EXISTS (
              SELECT 1 FROM postjob.queue_slots s
              WHERE s.queue = l.queue AND s.slot <= l.concurrency AND s.job_id IS NULL))
           OR (l.rate IS NOT NULL AND NOT EXISTS (
              SELECT 1 FROM postjob.queue_starts s
              WHERE s.queue = l.queue AND s.n <= l.rate
                AND (s.started_at IS NULL
                     OR s.started_at <= v_now - postjob._period(l.period)))))
    INTO v_wfs, v_versions, v_queues, v_limited, v_full
    FROM postjob._due_groups(p_workflows, p_versions, p_queues) g
    LEFT JOIN postjob.queue_limits l ON l.queue = g.queue;
  IF v_wfs IS NULL THEN
    RETURN;  -- nothing due
  END IF;
  IF v_full IS NOT NULL THEN
    SELECT array_agg(g.w ORDER BY g.i), array_agg(g.v ORDER BY g.i), array_agg(g.q ORDER BY g.i)
      INTO v_wfs, v_versions, v_queues
      FROM unnest(v_wfs, v_versions, v_queues) WITH ORDINALITY AS g(w, v, q, i)
      WHERE g.q <> ALL (v_full);
    IF v_wfs IS NULL THEN
      RETURN;  -- every group is in a queue at its limit
    END IF;
    v_limited := NULLIF(ARRAY(SELECT q FROM unnest(v_limited) AS q WHERE q <> ALL (v_full)),
                        '{}');
  END IF;
  v_token := nextval('postjob.lease_tokens');

  IF cardinality(v_wfs) = 1 AND v_limited IS NULL THEN
    RETURN QUERY
    SELECT t.id, v_token, t.workflow, t.workflow_version, t.args, t.queue, t.root_id,
           t.full_id, t.parent_id, t.attempt, t.max_attempts
    FROM postjob._take(v_wfs, v_versions, v_queues, ARRAY[p_limit], v_token, p_worker_id,
                       p_identifier, p_lease) t;
    RETURN;
  END IF;

  LOOP
    v_round := v_round + 1;
    -- each group's share: the first v_left of all the groups' first jobs by priority and
    -- time, a limited queue offering what it may start now
    v_counts := ARRAY(
      SELECT count(m.i)::integer
      FROM generate_subscripts(v_wfs, 1) AS s(i)
      LEFT JOIN (
        SELECT g.i FROM unnest(v_wfs, v_versions, v_queues) WITH ORDINALITY
          AS g(workflow, version, queue, i)
        CROSS JOIN LATERAL (
          SELECT w.priority, w.run_at, w.job_id FROM postjob.waiting w
          WHERE w.workflow = g.workflow AND w.workflow_version = g.version
            AND w.queue = g.queue AND w.due
            AND (w.timing_out_at IS NULL OR w.timing_out_at > v_now)
          ORDER BY w.priority DESC, w.run_at, w.job_id
          LIMIT CASE WHEN g.i = ANY (v_dry) THEN 0
                     WHEN g.queue = ANY (v_limited) THEN (
                       SELECT postjob._permits_free(l, v_left) FROM postjob.queue_limits l
                       WHERE l.queue = g.queue)
                     ELSE v_left END) w
        ORDER BY w.priority DESC, w.run_at, w.job_id
        LIMIT v_left) m ON m.i = s.i
      GROUP BY s.i ORDER BY s.i);
    EXIT WHEN (SELECT sum(n) FROM unnest(v_counts) AS c(n)) = 0;

    -- a limited queue's share is what it can lock of its places and starts, given to its
    -- groups best first
    FOREACH v_q IN ARRAY COALESCE(v_limited, '{}') LOOP
      SELECT * INTO v_limits FROM postjob.queue_limits l WHERE l.queue = v_q;
      SELECT COALESCE(sum(x.n), 0) INTO v_want
        FROM unnest(v_queues, v_counts) AS x(q, n) WHERE x.q = v_q;
      CONTINUE WHEN v_want = 0 OR NOT FOUND;
      v_got := v_want;
      IF v_limits.concurrency IS NOT NULL THEN
        v_slots := ARRAY(
          SELECT s.slot FROM postjob.queue_slots s
          WHERE s.queue = v_q AND s.slot <= v_limits.concurrency AND s.job_id IS NULL
          ORDER BY s.slot LIMIT v_got FOR UPDATE SKIP LOCKED);
        v_got := cardinality(v_slots);
        v_slot_queues := v_slot_queues || array_fill(v_q, ARRAY[v_got]);
        v_slot_numbers := v_slot_numbers || v_slots;
      END IF;
      IF v_limits.rate IS NOT NULL AND v_got > 0 THEN
        v_starts := ARRAY(
          SELECT s.n FROM postjob.queue_starts s
          WHERE s.queue = v_q AND s.n <= v_limits.rate
            AND (s.started_at IS NULL
                 OR s.started_at <= v_now - postjob._period(v_limits.period))
          ORDER BY s.started_at NULLS FIRST LIMIT v_got FOR UPDATE SKIP LOCKED);
        v_got := cardinality(v_starts);
        v_start_queues := v_start_queues || array_fill(v_q, ARRAY[v_got]);
        v_start_numbers := v_start_numbers || v_starts;
      END IF;
      FOR v_i IN 1 .. cardinality(v_queues) LOOP
        IF v_queues[v_i] = v_q THEN
          v_counts[v_i] := least(v_counts[v_i], v_got);
          v_got := v_got - v_counts[v_i];
        END IF;
      END LOOP;
    END LOOP;

    v_taken_ids := '{}';
    v_taken_queues := '{}';
    v_taken_groups := array_fill(0, ARRAY[cardinality(v_wfs)]);
    FOR v_row IN
      SELECT t.* FROM postjob._take(v_wfs, v_versions, v_queues, v_counts, v_token,
                                    p_worker_id, p_identifier, p_lease) t
    LOOP
      id := v_row.id; lease_token := v_token; workflow := v_row.workflow;
      workflow_version := v_row.workflow_version; args := v_row.args; queue := v_row.queue;
      root_id := v_row.root_id; full_id := v_row.full_id; parent_id := v_row.parent_id;
      attempt := v_row.attempt; max_attempts := v_row.max_attempts;
      RETURN NEXT;
      v_taken_ids := v_taken_ids || v_row.id;
      v_taken_queues := v_taken_queues || v_row.queue;
      v_taken_groups[v_row.grp] := v_taken_groups[v_row.grp] + 1;
    END LOOP;
    -- a group that gave less than its share has no more to give now
    v_dry := v_dry || ARRAY(SELECT i FROM generate_subscripts(v_counts, 1) AS i
                            WHERE v_taken_groups[i] < v_counts[i]);

    IF v_limited IS NOT NULL THEN
      -- each job of a limited queue takes one of the places and starts locked for it (the
      -- ones left over stay free; their locks end with the transaction)
      UPDATE postjob.queue_slots s SET job_id = m.job_id
      FROM (
        SELECT r.queue, r.slot, j.job_id
        FROM (SELECT x.queue, x.slot, row_number() OVER (PARTITION BY x.queue ORDER BY x.slot) AS k
              FROM unnest(v_slot_queues, v_slot_numbers) AS x(queue, slot)) r
        JOIN (SELECT y.queue, y.job_id, row_number() OVER (PARTITION BY y.queue ORDER BY y.job_id) AS k
              FROM unnest(v_taken_queues, v_taken_ids) AS y(queue, job_id)) j
          ON j.queue = r.queue AND j.k = r.k) m
      WHERE s.queue = m.queue AND s.slot = m.slot;
      UPDATE postjob.queue_starts s SET started_at = v_now
      FROM (
        SELECT r.queue, r.n
        FROM (SELECT x.queue, x.n, row_number() OVER (PARTITION BY x.queue ORDER BY x.n) AS k
              FROM unnest(v_start_queues, v_start_numbers) AS x(queue, n)) r
        JOIN (SELECT y.queue, count(*) AS taken FROM unnest(v_taken_queues) AS y(queue)
              GROUP BY y.queue) j
          ON j.queue = r.queue AND r.k <= j.taken) m
      WHERE s.queue = m.queue AND s.n = m.n;
      v_slot_queues := '{}'; v_slot_numbers := '{}';
      v_start_queues := '{}'; v_start_numbers := '{}';
    END IF;
    v_left := v_left - cardinality(v_taken_ids);
    EXIT WHEN v_left <= 0 OR v_round >= 2;
  END LOOP;
END;
$$;
