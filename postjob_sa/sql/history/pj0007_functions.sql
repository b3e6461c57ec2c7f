-- What pj0007 left in the database: the definition of every function of the postjob schema
-- at that revision, as pg_get_functiondef gives it (frozen history: pj0008 downgrades to it).

CREATE OR REPLACE FUNCTION postjob._backoff(p_failed_attempts integer, p_fast_mode boolean)
 RETURNS interval
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT (CASE WHEN p_fast_mode THEN 0.01 ELSE 10 END)
         * power(1.5, p_failed_attempts) * interval '1 second'
$function$
;
CREATE OR REPLACE FUNCTION postjob._client_identifier()
 RETURNS character varying
 LANGUAGE sql
 STABLE
AS $function$
  SELECT NULLIF(current_setting('postjob.client_identifier', true), '')
$function$
;
CREATE OR REPLACE FUNCTION postjob._due_jobs(p_workflows text[], p_versions text[], p_queues text[], p_limit integer, p_blocked text[], p_capped text[], p_caps integer[])
 RETURNS TABLE(id bigint, queue character varying, priority integer, next_run_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_below bigint := 2147483648;  -- above every priority
  v_priority integer;
  v_left integer := p_limit;
  v_found integer;
BEGIN
  LOOP
    v_priority := (
      SELECT max(t.priority)
      FROM postjob._runnable_keys(p_workflows, p_versions) k
      CROSS JOIN LATERAL (
        SELECT s.priority FROM postjob.postjobs s
        WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
          AND s.status IN ('ready', 'err') AND s.priority < v_below
        ORDER BY s.priority DESC
        LIMIT 1) t);
    EXIT WHEN v_priority IS NULL;
    RETURN QUERY
    SELECT c.id, c.queue, v_priority, c.next_run_at
    FROM postjob._runnable_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL postjob._runnable_queues(k.workflow, k.workflow_version, v_priority) g
    CROSS JOIN LATERAL (
      SELECT s.id, s.queue, s.next_run_at FROM postjob.postjobs s
      WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND s.priority = v_priority AND s.queue = g.queue
        AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
        AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
      ORDER BY s.next_run_at, s.id
      LIMIT CASE WHEN g.queue = ANY (p_capped)
                 THEN least(v_left, p_caps[array_position(p_capped, g.queue::text)])
                 ELSE v_left END) c
    WHERE (p_queues IS NULL OR g.queue = ANY (p_queues))
      AND g.queue <> ALL (p_blocked)
    ORDER BY c.next_run_at, c.id
    LIMIT v_left;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    v_left := v_left - v_found;
    EXIT WHEN v_left <= 0;
    v_below := v_priority;
  END LOOP;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob._fill_job_ids()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_root_id bigint;
  v_full_id varchar;
BEGIN
  IF NEW.parent_id IS NULL THEN
    NEW.root_id := NEW.id;
    NEW.full_id := NEW.id::varchar;
  ELSE
    SELECT p.root_id, p.full_id INTO v_root_id, v_full_id
      FROM postjob.postjobs p WHERE p.id = NEW.parent_id;
    NEW.root_id := COALESCE(v_root_id, NEW.parent_id);
    NEW.full_id := COALESCE(v_full_id, NEW.parent_id::varchar) || '.' || NEW.id;
  END IF;
  IF NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL THEN
    NEW.timing_out_at := statement_timestamp() + NEW.timeout * interval '1 second';
  END IF;
  RETURN NEW;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_wake bigint[];
  v_mark bigint[];
BEGIN
  IF cardinality(p_failed_ids) > 0 THEN
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
      updated_at = statement_timestamp()
    FROM postjob.postjobs a
    WHERE a.id = ANY (p_failed_ids)
      AND d.parent_id IS NOT NULL
      AND d.root_id = a.root_id
      AND d.full_id LIKE a.full_id || '.%'
      AND d.status IN ('ready', 'processing', 'sleep', 'err');
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
    UPDATE postjob.postjobs SET
      status = 'ready',
      next_run_at = statement_timestamp(),
      awaiting_id = NULL,
      updated_at = statement_timestamp()
    WHERE id = ANY (v_wake) AND status = 'sleep';
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob._lock_due_jobs(p_workflows text[], p_versions text[], p_queues text[], p_limit integer, p_blocked text[], p_skip bigint[])
 RETURNS bigint[]
 LANGUAGE plpgsql
 SET jit TO 'off'
AS $function$
DECLARE
  v_now timestamptz := statement_timestamp();
  v_ids bigint[] := '{}';
  v_group record;
BEGIN
  FOR v_group IN
    SELECT k.workflow, k.workflow_version, g.queue, g.priority
    FROM postjob._runnable_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL postjob._runnable_groups(k.workflow, k.workflow_version) g
    WHERE g.next_run_at <= v_now
      AND (p_queues IS NULL OR g.queue = ANY (p_queues))
      AND g.queue <> ALL (p_blocked)
    ORDER BY g.priority DESC, g.next_run_at
  LOOP
    EXIT WHEN cardinality(v_ids) >= p_limit;
    v_ids := v_ids || ARRAY(
      SELECT s.id FROM postjob.postjobs s
      WHERE s.workflow = v_group.workflow AND s.workflow_version = v_group.workflow_version
        AND s.queue = v_group.queue AND s.priority = v_group.priority
        AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
        AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
        AND s.id <> ALL (p_skip)
      ORDER BY s.next_run_at, s.id
      LIMIT p_limit - cardinality(v_ids)
      FOR UPDATE SKIP LOCKED);
  END LOOP;
  RETURN v_ids;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob._notify_workers()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  PERFORM pg_notify('postjob_notifications', '');
  RETURN NULL;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob._queue_allowance(p_limits postjob.queue_limits)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_allowed integer := 2147483647;
  v_width double precision := p_limits.period / 20;
  v_oldest bigint;
  v_started integer;
BEGIN
  IF p_limits.concurrency IS NOT NULL THEN
    v_allowed := p_limits.concurrency
      - cardinality(postjob._queue_processing(p_limits.queue, p_limits.processing_ids));
  END IF;
  IF p_limits.rate IS NOT NULL THEN
    v_oldest := floor((EXTRACT(EPOCH FROM statement_timestamp()) - p_limits.period) / v_width);
    SELECT COALESCE(sum(c), 0) INTO v_started
      FROM unnest(p_limits.rate_slots, p_limits.rate_counts) AS r(s, c) WHERE r.s >= v_oldest;
    v_allowed := least(v_allowed, p_limits.rate - v_started);
  END IF;
  RETURN greatest(v_allowed, 0);
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob._queue_processing(p_queue character varying, p_known bigint[])
 RETURNS bigint[]
 LANGUAGE sql
 STABLE
AS $function$
  SELECT CASE
    WHEN p_known IS NULL THEN ARRAY(
      SELECT p.id FROM postjob.postjobs p WHERE p.status = 'processing' AND p.queue = p_queue)
    ELSE ARRAY(
      SELECT p.id FROM postjob.postjobs p
      WHERE p.id = ANY (p_known) AND p.status = 'processing' AND p.queue = p_queue)
  END
$function$
;
CREATE OR REPLACE FUNCTION postjob._runnable_groups(p_workflow text, p_version text)
 RETURNS TABLE(queue character varying, priority integer, next_run_at timestamp with time zone)
 LANGUAGE sql
 STABLE
AS $function$
  WITH RECURSIVE g AS (
    (SELECT s.queue, s.priority, s.next_run_at FROM postjob.postjobs s
      WHERE s.workflow = p_workflow AND s.workflow_version = p_version
        AND s.status IN ('ready', 'err')
      ORDER BY s.priority, s.queue, s.next_run_at
      LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority, n.next_run_at
      FROM g CROSS JOIN LATERAL (
        SELECT s.queue, s.priority, s.next_run_at FROM postjob.postjobs s
         WHERE s.workflow = p_workflow AND s.workflow_version = p_version
           AND s.status IN ('ready', 'err')
           AND (s.priority, s.queue) > (g.priority, g.queue)
         ORDER BY s.priority, s.queue, s.next_run_at
         LIMIT 1) n
  )
  SELECT g.queue, g.priority, g.next_run_at FROM g
$function$
;
CREATE OR REPLACE FUNCTION postjob._runnable_keys(p_workflows text[], p_versions text[])
 RETURNS TABLE(workflow text, workflow_version text)
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT DISTINCT w.name, v.version
  FROM unnest(p_workflows, p_versions) AS w(name, version)
  CROSS JOIN LATERAL (VALUES (''::text), (w.version)) AS v(version)
$function$
;
CREATE OR REPLACE FUNCTION postjob._runnable_queues(p_workflow text, p_version text, p_priority integer)
 RETURNS TABLE(queue character varying)
 LANGUAGE sql
 STABLE
AS $function$
  WITH RECURSIVE g AS (
    (SELECT s.queue FROM postjob.postjobs s
      WHERE s.workflow = p_workflow AND s.workflow_version = p_version
        AND s.status IN ('ready', 'err') AND s.priority = p_priority
      ORDER BY s.queue DESC
      LIMIT 1)
    UNION ALL
    SELECT n.queue
      FROM g CROSS JOIN LATERAL (
        SELECT s.queue FROM postjob.postjobs s
         WHERE s.workflow = p_workflow AND s.workflow_version = p_version
           AND s.status IN ('ready', 'err') AND s.priority = p_priority
           AND s.queue < g.queue
         ORDER BY s.queue DESC
         LIMIT 1) n
  )
  SELECT g.queue FROM g
$function$
;
CREATE OR REPLACE FUNCTION postjob.cancel_jobs(p_ids bigint[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_targets bigint[];
  v_ids bigint[];
BEGIN
  v_targets := ARRAY(
    SELECT j.id FROM postjob.postjobs j
    WHERE j.id = ANY (p_ids) AND j.status IN ('ready', 'processing', 'sleep', 'err')
    UNION
    SELECT d.id FROM postjob.postjobs a
      JOIN postjob.postjobs d ON d.parent_id IS NOT NULL AND d.root_id = a.root_id
                              AND d.full_id LIKE a.full_id || '.%'
      WHERE a.id = ANY (p_ids) AND a.status IN ('ready', 'processing', 'sleep', 'err')
        AND d.status IN ('ready', 'processing', 'sleep', 'err'));
  -- lock in id order (no deadlock with another cancel or a batch of outcomes), then re-read
  PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_targets) ORDER BY id FOR UPDATE;
  WITH cancelled AS (
    UPDATE postjob.postjobs j SET
      status = 'cancelled',
      error = 'Cancelled',
      error_message = CASE WHEN j.id = ANY (p_ids) THEN 'cancelled'
                           ELSE 'cancelled with job ' || (
                             SELECT min(a.id) FROM postjob.postjobs a
                             WHERE a.id = ANY (p_ids) AND a.root_id = j.root_id
                               AND j.full_id LIKE a.full_id || '.%') END,
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
      updated_at = statement_timestamp()
    WHERE j.id = ANY (v_targets) AND j.status IN ('ready', 'processing', 'sleep', 'err')
    RETURNING j.id
  )
  SELECT array_agg(id ORDER BY id) INTO v_ids FROM cancelled;
  IF v_ids IS NOT NULL THEN
    PERFORM postjob._jobs_ended(v_ids, '{}');
  END IF;
  RETURN COALESCE(v_ids, '{}');
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.checkout(p_workflows text[], p_versions text[], p_queues text[] DEFAULT NULL::text[], p_limit integer DEFAULT 1, p_lease double precision DEFAULT 60, p_fast_mode boolean DEFAULT false, p_reap boolean DEFAULT true)
 RETURNS TABLE(id bigint, parent_id bigint, root_id bigint, full_id character varying, created_at timestamp with time zone, updated_at timestamp with time zone, queue character varying, workflow character varying, workflow_method character varying, workflow_version character varying, args jsonb, status postjob.statuses, next_run_at timestamp with time zone, timeout double precision, timing_out_at timestamp with time zone, failed_attempts integer, max_attempts integer, results jsonb, error character varying, error_message character varying, error_backtrace jsonb, workflow_status character varying, tags jsonb, awaiting_id bigint, processing_client character varying, processing_client_identifier character varying, processing_started_at timestamp with time zone, processing_max_duration double precision, lease_expires_at timestamp with time zone, lease_token bigint)
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_ids bigint[];
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap_v2();
  END IF;
  -- two statements: the second reads the rows as the first updated them
  v_ids := ARRAY(SELECT c.id FROM postjob.checkout_v2(NULL, NULL, p_workflows, p_versions,
                                                       p_queues, p_limit, p_lease) c);
  RETURN QUERY SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue, j.workflow,
    j.workflow_method, j.workflow_version, j.args, j.status, j.next_run_at, j.timeout,
    j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error, j.error_message,
    j.error_backtrace, j.workflow_status, j.tags, j.awaiting_id, j.processing_client,
    j.processing_client_identifier, j.processing_started_at, j.processing_max_duration,
    j.lease_expires_at, j.lease_token
    FROM postjob.postjobs j WHERE j.id = ANY (v_ids);
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.checkout_v2(p_worker_id bigint, p_identifier character varying, p_workflows text[], p_versions text[], p_queues text[], p_limit integer, p_lease double precision)
 RETURNS TABLE(id bigint, lease_token bigint, workflow character varying, workflow_version character varying, args jsonb, queue character varying, root_id bigint, full_id character varying, parent_id bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := statement_timestamp();
  v_candidates bigint[];
  v_queues text[];
  v_new text[];
  v_ids bigint[];
  v_blocked text[] := '{}';
  v_capped text[] := '{}';
  v_caps integer[] := '{}';
  v_limits postjob.queue_limits;
  v_cap integer;
  v_extra integer := 0;  -- capped queues' jobs fetched beyond p_limit, dropped over their caps
  v_found integer;
  v_top integer;
  v_limited boolean;
  v_taken integer;
  v_pairs integer;
  v_queue text;
  v_workflow text;
  v_version text;
  v_shared boolean;  -- a highest group shares its priority with another queue of its pair
  v_group_priorities integer[];
  v_workflows text[];
  v_versions text[];
  v_group_queues text[];
  v_read boolean := false;  -- several pairs' top groups, read in one statement, are the batch
BEGIN
  -- Each pair's highest (priority, queue) group (one backward descent), whether its queue is
  -- limited, and whether another queue shares its priority (one more descent); the groups are
  -- kept for the read of several pairs.
  SELECT count(*), max(t.priority), bool_or(t.limited), max(t.beside) IS NOT NULL,
         array_agg(k.workflow), array_agg(k.workflow_version), array_agg(t.priority),
         array_agg(t.queue)
    INTO v_pairs, v_top, v_limited, v_shared,
         v_workflows, v_versions, v_group_priorities, v_group_queues
    FROM postjob._runnable_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT s.priority, s.queue,
             EXISTS (SELECT 1 FROM postjob.queue_limits l WHERE l.queue = s.queue) AS limited,
             -- (a scalar subquery, never an EXISTS: that may be planned as a hash of the table)
             (SELECT o.queue FROM postjob.postjobs o
              WHERE o.workflow = k.workflow AND o.workflow_version = k.workflow_version
                AND o.status IN ('ready', 'err') AND o.priority = s.priority
                AND o.queue < s.queue
              ORDER BY o.queue DESC
              LIMIT 1) AS beside
      FROM postjob.postjobs s
      WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND s.status IN ('ready', 'err')
      ORDER BY s.priority DESC, s.queue DESC
      LIMIT 1) t;
  IF v_pairs = 0 THEN
    RETURN;  -- nothing runnable
  END IF;
  IF v_pairs = 1 THEN
    v_workflow := v_workflows[1];
    v_version := v_versions[1];
    v_queue := v_group_queues[1];
    IF NOT v_limited AND NOT v_shared AND (p_queues IS NULL OR v_queue = ANY (p_queues)) THEN
      -- The common case: one pair, its highest group alone at its priority, unlimited and
      -- served, so its due jobs rank first. One statement locks them as it reads the range
      -- (SKIP LOCKED: jobs another checkout holds are passed, not waited for, and never
      -- picked first and lost at the lock) and hands out all it locked: a checkout locks only
      -- the jobs it hands out.
      IF p_limit = 1 THEN  -- one job: nothing to order, no join
        RETURN QUERY
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
          lease_token = nextval('postjob.lease_tokens'),
          worker_id = p_worker_id,
          updated_at = v_now
        WHERE j.id = (
          SELECT s.id FROM postjob.postjobs s
          WHERE s.workflow = v_workflow AND s.workflow_version = v_version
            AND s.priority = v_top AND s.queue = v_queue
            AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
            AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
          ORDER BY s.next_run_at, s.id
          LIMIT 1
          FOR UPDATE SKIP LOCKED)
        RETURNING j.id, j.lease_token, j.workflow, j.workflow_version, j.args, j.queue,
                  j.root_id, j.full_id, j.parent_id;
      ELSE
        RETURN QUERY
        WITH picked AS (
          SELECT s.id, s.next_run_at FROM postjob.postjobs s
          WHERE s.workflow = v_workflow AND s.workflow_version = v_version
            AND s.priority = v_top AND s.queue = v_queue
            AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
            AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
          ORDER BY s.next_run_at, s.id
          LIMIT p_limit
          FOR UPDATE SKIP LOCKED
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
            lease_token = nextval('postjob.lease_tokens'),
            worker_id = p_worker_id,
            updated_at = v_now
          -- by id (a join with picked may be planned as a scan of the table when it is small)
          WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked p))
          RETURNING j.id, j.lease_token, j.workflow, j.workflow_version, j.args, j.queue,
                    j.root_id, j.full_id, j.parent_id
        )
        SELECT t.id, t.lease_token, t.workflow, t.workflow_version, t.args, t.queue, t.root_id,
               t.full_id, t.parent_id
        FROM taken t
        JOIN picked p ON p.id = t.id
        ORDER BY p.next_run_at, p.id;  -- a batch runs its most urgent jobs first
      END IF;
      GET DIAGNOSTICS v_taken = ROW_COUNT;
      IF v_taken = p_limit THEN
        RETURN;
      END IF;
      IF NOT EXISTS (
          SELECT 1 FROM postjob.postjobs s
          WHERE s.workflow = v_workflow AND s.workflow_version = v_version
            AND s.status IN ('ready', 'err') AND s.priority < v_top) THEN
        RETURN;  -- nothing ranks below the group
      END IF;
      p_limit := p_limit - v_taken;  -- the rest, from the levels below: the walk
    END IF;
  ELSIF NOT v_limited AND NOT v_shared THEN
    -- Several pairs, no highest group limited and each alone at its priority: the due jobs
    -- of the groups (found above) at the highest priority of all, if served. They are the
    -- batch when it is full (all else ranks lower: a pair whose highest group ranks lower
    -- gives nothing here), or when nothing else is runnable.
    SELECT array_agg(c.id ORDER BY c.next_run_at, c.id), count(c.id)
      INTO v_candidates, v_found
      FROM unnest(v_workflows, v_versions, v_group_priorities, v_group_queues)
        AS k(workflow, workflow_version, priority, queue)
      LEFT JOIN LATERAL (
        SELECT s.id, s.next_run_at FROM postjob.postjobs s
        WHERE k.priority = v_top AND (p_queues IS NULL OR k.queue = ANY (p_queues))
          AND s.workflow = k.workflow AND s.workflow_version = k.workflow_version
          AND s.priority = v_top AND s.queue = k.queue
          AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
          AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
        ORDER BY s.next_run_at, s.id
        LIMIT p_limit) c ON true;
    v_read := v_found >= p_limit OR NOT EXISTS (  -- or nothing else is runnable
      SELECT 1 FROM unnest(v_workflows, v_versions) AS k(workflow, workflow_version)
      CROSS JOIN LATERAL (
        SELECT 1 FROM postjob.postjobs s
        WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
          AND s.status IN ('ready', 'err') AND s.priority < v_top
        LIMIT 1) s);
  END IF;
  IF v_read THEN
    v_candidates := v_candidates[1:p_limit];
    IF v_candidates IS NULL THEN
      RETURN;
    END IF;
  ELSE
  LOOP
    SELECT array_agg(d.id ORDER BY d.priority DESC, d.next_run_at, d.id),
           array_agg(DISTINCT d.queue)
      INTO v_candidates, v_queues
      FROM postjob._due_jobs(p_workflows, p_versions, p_queues, p_limit + v_extra,
                             v_blocked, v_capped, v_caps) d;
    IF v_candidates IS NULL THEN
      RETURN;
    END IF;
    v_new := ARRAY(SELECT l.queue FROM postjob.queue_limits l
                   WHERE l.queue = ANY (v_queues) AND l.queue <> ALL (v_capped));
    EXIT WHEN cardinality(v_new) = 0;
    v_blocked := v_blocked || v_new;  -- unless its row is locked below
    FOR v_limits IN
      SELECT * FROM postjob.queue_limits l WHERE l.queue = ANY (v_new)
      ORDER BY l.queue FOR UPDATE SKIP LOCKED
    LOOP
      v_cap := postjob._queue_allowance(v_limits);
      IF v_cap > 0 THEN
        v_blocked := array_remove(v_blocked, v_limits.queue::text);
        v_capped := v_capped || v_limits.queue::text;
        v_caps := v_caps || least(v_cap, p_limit);
        v_extra := v_extra + least(v_cap, p_limit);
      END IF;
    END LOOP;
  END LOOP;
  END IF;
  IF cardinality(v_capped) > 0 THEN
    -- each capped queue gives at most its allowance over all its groups
    v_candidates := ARRAY(
      SELECT w.id FROM (
        SELECT s.id, s.priority, s.next_run_at,
               row_number() OVER (PARTITION BY s.queue
                                  ORDER BY s.priority DESC, s.next_run_at, s.id) AS n,
               c.cap
        FROM postjob.postjobs s
        LEFT JOIN unnest(v_capped, v_caps) AS c(q, cap) ON c.q = s.queue
        WHERE s.id = ANY (v_candidates)) w
      WHERE w.cap IS NULL OR w.n <= w.cap
      ORDER BY w.priority DESC, w.next_run_at, w.id
      LIMIT p_limit);
  END IF;
  v_ids := ARRAY(
    SELECT s.id FROM postjob.postjobs s
    WHERE s.id = ANY (v_candidates)
      AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
    FOR UPDATE SKIP LOCKED);
  IF cardinality(v_ids) < cardinality(v_candidates) THEN
    -- others got some of them first: scan again, locking as we go (limited queues left out:
    -- the jobs of those this checkout holds cannot have been taken by another)
    v_ids := v_ids || postjob._lock_due_jobs(
      p_workflows, p_versions, p_queues, p_limit - cardinality(v_ids),
      v_blocked || v_capped || ARRAY(SELECT l.queue::text FROM postjob.queue_limits l), v_ids);
  END IF;
  IF cardinality(v_capped) > 0 THEN
    -- record the starts of each limited queue: slots of period/20 seconds, the last period kept
    UPDATE postjob.queue_limits l SET
      rate_slots = t.slots, rate_counts = t.counts, updated_at = v_now,
      -- the ids a concurrency limit counts: its queue's processing jobs and the ones handed out
      processing_ids = CASE WHEN l.concurrency IS NULL THEN NULL
                            ELSE postjob._queue_processing(l.queue, l.processing_ids) || ARRAY(
                              SELECT s.id FROM postjob.postjobs s
                              WHERE s.id = ANY (v_ids) AND s.queue = l.queue) END
    FROM (
      SELECT l2.queue,
             COALESCE(array_agg(r.s ORDER BY r.s) FILTER (WHERE l2.rate IS NOT NULL), '{}') AS slots,
             COALESCE(array_agg(r.c ORDER BY r.s) FILTER (WHERE l2.rate IS NOT NULL), '{}') AS counts
      FROM postjob.queue_limits l2
      CROSS JOIN LATERAL (
        SELECT z.s, sum(z.c)::integer AS c FROM (
          SELECT u.s, u.c FROM unnest(l2.rate_slots, l2.rate_counts) AS u(s, c)
          UNION ALL
          SELECT floor(EXTRACT(EPOCH FROM v_now) / (l2.period / 20))::bigint, count(*)::integer
            FROM postjob.postjobs s WHERE s.id = ANY (v_ids) AND s.queue = l2.queue
        ) z
        WHERE z.s >= floor((EXTRACT(EPOCH FROM v_now) - l2.period) / (l2.period / 20))
        GROUP BY z.s
      ) r
      WHERE l2.queue = ANY (v_capped)
      GROUP BY l2.queue
    ) t
    WHERE l.queue = t.queue;
  END IF;
  IF cardinality(v_ids) = 1 THEN
    -- one job: nothing to order (the join and sort below cost more than the update)
    RETURN QUERY
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
      lease_token = nextval('postjob.lease_tokens'),
      worker_id = p_worker_id,
      updated_at = v_now
    WHERE j.id = ANY (v_ids)
    RETURNING j.id, j.lease_token, j.workflow, j.workflow_version, j.args, j.queue, j.root_id,
              j.full_id, j.parent_id;
    RETURN;
  END IF;
  -- handed out in checkout order (a batch runs its most urgent jobs first)
  RETURN QUERY
  WITH taken AS (
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
      lease_token = nextval('postjob.lease_tokens'),
      worker_id = p_worker_id,
      updated_at = v_now
    WHERE j.id = ANY (v_ids)
    RETURNING j.id, j.lease_token, j.workflow, j.workflow_version, j.args, j.queue, j.root_id,
              j.full_id, j.parent_id, j.priority
  )
  SELECT t.id, t.lease_token, t.workflow, t.workflow_version, t.args, t.queue, t.root_id,
         t.full_id, t.parent_id
  FROM taken t
  LEFT JOIN unnest(v_candidates) WITH ORDINALITY AS o(id, n) ON o.id = t.id
  ORDER BY t.priority DESC, o.n, t.id;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.extend_leases(p_ids bigint[], p_lease_tokens bigint[], p_lease double precision)
 RETURNS integer
 LANGUAGE sql
AS $function$
  WITH extended AS (
    UPDATE postjob.postjobs j SET
      lease_expires_at = statement_timestamp() + p_lease * interval '1 second',
      processing_max_duration = EXTRACT(EPOCH FROM statement_timestamp() - j.processing_started_at) + p_lease
    FROM unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
    WHERE j.id = h.id AND j.lease_token = h.lease_token
    RETURNING 1
  )
  SELECT count(*)::integer FROM extended
$function$
;
CREATE OR REPLACE FUNCTION postjob.finish_and_checkout(p_ids bigint[], p_lease_tokens bigint[], p_outcomes text[], p_results jsonb[], p_errors text[], p_messages text[], p_backtraces jsonb[], p_versions text[], p_awaiting bigint[], p_workflows text[], p_workflow_versions text[], p_queues text[], p_limit integer, p_lease double precision, p_fast_mode boolean, p_reap boolean DEFAULT true)
 RETURNS TABLE(id bigint, parent_id bigint, root_id bigint, full_id character varying, created_at timestamp with time zone, updated_at timestamp with time zone, queue character varying, workflow character varying, workflow_method character varying, workflow_version character varying, args jsonb, status postjob.statuses, next_run_at timestamp with time zone, timeout double precision, timing_out_at timestamp with time zone, failed_attempts integer, max_attempts integer, results jsonb, error character varying, error_message character varying, error_backtrace jsonb, workflow_status character varying, tags jsonb, awaiting_id bigint, processing_client character varying, processing_client_identifier character varying, processing_started_at timestamp with time zone, processing_max_duration double precision, lease_expires_at timestamp with time zone, lease_token bigint)
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF cardinality(p_ids) > 0 THEN
    PERFORM postjob.finish_jobs(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors,
                                p_messages, p_backtraces, p_versions, p_awaiting, p_fast_mode);
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY SELECT * FROM postjob.checkout(p_workflows, p_workflow_versions, p_queues,
                                                p_limit, p_lease, p_fast_mode, p_reap);
  END IF;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.finish_jobs(p_ids bigint[], p_lease_tokens bigint[], p_outcomes text[], p_results jsonb[], p_errors text[], p_messages text[], p_backtraces jsonb[], p_versions text[], p_awaiting bigint[], p_fast_mode boolean DEFAULT false)
 RETURNS bigint[]
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
DECLARE
  v_sleeping bigint[];
  v_awaited_final bigint[] := '{}';
  v_marked bigint[] := '{}';
  v_accepted bigint[];
  v_final bigint[];
  v_failed bigint[];
  v_runnable boolean;
BEGIN
  IF 'sleep' = ANY (p_outcomes) THEN
    SELECT array_agg(i.id) INTO v_sleeping
      FROM unnest(p_ids, p_outcomes) AS i(id, outcome) WHERE i.outcome = 'sleep';
    -- Lock first, read after, in separate statements (a status filter in the locking
    -- statement would be applied to the old row version, below the lock): a lock waits for
    -- a completion of an awaited child (or a failed child's mark on this job) that is
    -- committing right now, and the reads that follow take a new snapshot that sees it. The
    -- locks also hold back a completion that starts now until this sleep has committed, so
    -- it finds the job asleep. Children before parents, as a completion locks them.
    PERFORM 1 FROM postjob.postjobs WHERE id = ANY (p_awaiting) ORDER BY id FOR SHARE;
    PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_sleeping) ORDER BY id FOR UPDATE;
    SELECT COALESCE(array_agg(id), '{}') INTO v_awaited_final FROM postjob.postjobs
      WHERE id = ANY (p_awaiting) AND status IN ('ok', 'failed', 'timeout');
    SELECT COALESCE(array_agg(id), '{}') INTO v_marked FROM postjob.postjobs
      WHERE id = ANY (v_sleeping) AND status = 'processing' AND next_run_at IS NOT NULL;
  END IF;

  WITH updated AS (
    UPDATE postjob.postjobs j SET
      status = (CASE
        WHEN i.outcome = 'ok' THEN 'ok'
        WHEN i.outcome = 'failed' THEN 'failed'
        WHEN i.outcome = 'err' AND j.failed_attempts + 1 < j.max_attempts THEN 'err'
        WHEN i.outcome = 'err' THEN 'failed'
        WHEN i.outcome = 'sleep'
             AND (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked)) THEN 'ready'
        WHEN i.outcome = 'sleep' THEN 'sleep'
        WHEN i.outcome = 'release' THEN 'ready'
      END)::postjob.statuses,
      results = CASE WHEN i.outcome = 'ok' THEN i.result END,
      error = CASE WHEN i.outcome IN ('err', 'failed') THEN i.error END,
      error_message = CASE WHEN i.outcome IN ('err', 'failed') THEN i.message END,
      error_backtrace = CASE WHEN i.outcome IN ('err', 'failed') THEN i.backtrace END,
      failed_attempts = j.failed_attempts
        + CASE WHEN i.outcome IN ('err', 'failed') THEN 1 ELSE 0 END,
      next_run_at = CASE
        WHEN i.outcome = 'err' AND j.failed_attempts + 1 < j.max_attempts
          THEN statement_timestamp() + postjob._backoff(j.failed_attempts + 1, p_fast_mode)
        WHEN i.outcome = 'release'
          OR (i.outcome = 'sleep'
              AND (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked)))
          THEN statement_timestamp()
      END,
      awaiting_id = CASE WHEN i.outcome = 'sleep'
                          AND NOT (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked))
                         THEN i.awaiting END,
      workflow_version = COALESCE(i.version, j.workflow_version),
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      updated_at = statement_timestamp()
    FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors, p_messages,
                p_backtraces, p_versions, p_awaiting)
      AS i(id, lease_token, outcome, result, error, message, backtrace, version, awaiting)
    -- the lease token alone fences: it is set exactly while the job is processing (a check
    -- constraint says so), and matching it rather than the status keeps the planner on the
    -- primary key instead of the partial index of processing jobs
    WHERE j.id = i.id AND j.lease_token = i.lease_token
    RETURNING j.id, j.status, j.parent_id
  )
  SELECT array_agg(id),
         -- a final job matters to its parent, and a failed one to its descendants
         array_agg(id) FILTER (WHERE (parent_id IS NOT NULL AND status IN ('ok', 'failed'))
                                  OR status = 'failed'),
         array_agg(id) FILTER (WHERE status = 'failed'),
         bool_or(status IN ('err', 'ready'))
    INTO v_accepted, v_final, v_failed, v_runnable
    FROM updated;

  IF v_final IS NOT NULL THEN
    PERFORM postjob._jobs_ended(v_final, COALESCE(v_failed, '{}'));
  END IF;
  IF v_runnable THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  IF cardinality(v_accepted) IS DISTINCT FROM cardinality(p_ids) THEN
    RAISE NOTICE 'postjob: lease lost for jobs %',
      (SELECT array_agg(x) FROM unnest(p_ids) x WHERE x <> ALL (COALESCE(v_accepted, '{}')));
  END IF;
  RETURN COALESCE(v_accepted, '{}');
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.force_job(p_id bigint)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
  UPDATE postjob.postjobs SET
    status = CASE WHEN status = 'sleep' THEN 'ready'::postjob.statuses ELSE status END,
    next_run_at = statement_timestamp(),
    awaiting_id = NULL,
    updated_at = statement_timestamp()
  WHERE id = p_id AND status IN ('ready', 'err', 'sleep');
  IF FOUND THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN FOUND;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.manual_token(p_job_id bigint)
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION postjob.oldest_served_code()
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT 'pj0001'::text
$function$
;
CREATE OR REPLACE FUNCTION postjob.reap(p_fast_mode boolean DEFAULT false, p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE sql
AS $function$
  SELECT postjob.reap_v2(p_limit)
$function$
;
CREATE OR REPLACE FUNCTION postjob.reap_v2(p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_now timestamptz := statement_timestamp();
  v_zombies integer := 0;
  v_final bigint[];
  v_timeouts bigint[];
  v_retry boolean;
BEGIN
  IF EXISTS (SELECT 1 FROM postjob.postjobs z
             WHERE z.status = 'processing' AND z.lease_expires_at <= v_now
               AND NOT EXISTS (SELECT 1 FROM postjob.workers w
                               WHERE w.id = z.worker_id AND w.expires_at > v_now)) THEN
    WITH expired AS (
      SELECT z.id FROM postjob.postjobs z
      WHERE z.status = 'processing' AND z.lease_expires_at <= v_now
        AND NOT EXISTS (SELECT 1 FROM postjob.workers w
                        WHERE w.id = z.worker_id AND w.expires_at > v_now)
      ORDER BY z.lease_expires_at
      LIMIT p_limit
      FOR UPDATE OF z SKIP LOCKED
    ), reaped AS (
      UPDATE postjob.postjobs j SET
        status = (CASE WHEN j.failed_attempts + 1 < j.max_attempts
                       THEN 'err' ELSE 'failed' END)::postjob.statuses,
        failed_attempts = j.failed_attempts + 1,
        error = 'Zombie',
        error_message = 'zombie: the lease expired (worker ' ||
          COALESCE(j.processing_client_identifier, j.processing_client, 'unknown') || ')',
        error_backtrace = NULL,
        next_run_at = CASE WHEN j.failed_attempts + 1 < j.max_attempts THEN v_now END,
        processing_client = NULL,
        processing_client_identifier = NULL,
        processing_started_at = NULL,
        processing_max_duration = NULL,
        lease_expires_at = NULL,
        lease_token = NULL,
        worker_id = NULL,
        updated_at = v_now
      FROM expired WHERE j.id = expired.id
      RETURNING j.id, j.status
    )
    SELECT count(*), array_agg(id) FILTER (WHERE status = 'failed'), bool_or(status = 'err')
      INTO v_zombies, v_final, v_retry
      FROM reaped;
    IF v_final IS NOT NULL THEN
      PERFORM postjob._jobs_ended(v_final, v_final);
    END IF;
    IF v_retry THEN
      PERFORM pg_notify('postjob_notifications', '');
    END IF;
  END IF;

  IF EXISTS (SELECT 1 FROM postjob.postjobs
             WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at <= v_now) THEN
    WITH expired AS (
      SELECT id FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at <= v_now
      ORDER BY timing_out_at
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED
    ), reaped AS (
      UPDATE postjob.postjobs j SET
        status = 'timeout',
        failed_attempts = j.failed_attempts + 1,
        error = 'Timeout',
        error_message = 'timeout',
        error_backtrace = NULL,
        next_run_at = NULL,
        awaiting_id = NULL,
        updated_at = v_now
      FROM expired WHERE j.id = expired.id
      RETURNING j.id
    )
    SELECT array_agg(id) INTO v_timeouts FROM reaped;
    IF v_timeouts IS NOT NULL THEN
      PERFORM postjob._jobs_ended(v_timeouts, v_timeouts);
      v_zombies := v_zombies + cardinality(v_timeouts);
    END IF;
  END IF;

  DELETE FROM postjob.workers WHERE expires_at < v_now - interval '1 hour';
  RETURN v_zombies;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.register_worker(p_identifier character varying, p_lease double precision, p_code_revision character varying, p_workflows text[], p_queues text[])
 RETURNS bigint
 LANGUAGE sql
AS $function$
  INSERT INTO postjob.workers (identifier, expires_at, code_revision, workflows, queues)
  VALUES (p_identifier, statement_timestamp() + p_lease * interval '1 second',
          p_code_revision, COALESCE(p_workflows, '{}'), p_queues)
  RETURNING id
$function$
;
CREATE OR REPLACE FUNCTION postjob.reset_jobs(p_ids bigint[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_ids bigint[];
BEGIN
  WITH targets AS (
    SELECT j.id FROM postjob.postjobs j WHERE j.id = ANY (p_ids) AND j.status <> 'processing'
    UNION
    SELECT d.id FROM postjob.postjobs a
      JOIN postjob.postjobs d ON d.parent_id IS NOT NULL AND d.root_id = a.root_id
                              AND d.full_id LIKE a.full_id || '.%'
      WHERE a.id = ANY (p_ids) AND d.status IN ('failed', 'timeout', 'cancelled')
  ), reset AS (
    UPDATE postjob.postjobs j SET
      status = 'ready',
      next_run_at = statement_timestamp(),
      timing_out_at = CASE WHEN j.timeout IS NOT NULL
                           THEN statement_timestamp() + j.timeout * interval '1 second' END,
      results = NULL,
      failed_attempts = 0,
      error = NULL,
      error_message = NULL,
      error_backtrace = NULL,
      awaiting_id = NULL,
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      worker_id = NULL,
      updated_at = statement_timestamp()
    FROM targets t WHERE j.id = t.id AND j.status <> 'processing'
    RETURNING j.id
  )
  SELECT array_agg(id ORDER BY id) INTO v_ids FROM reset;
  IF v_ids IS NOT NULL THEN
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
  RETURN COALESCE(v_ids, '{}');
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.resolve(p_token uuid, p_result jsonb, p_error character varying DEFAULT NULL::character varying, p_message character varying DEFAULT NULL::character varying)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_id bigint;
  v_workflow varchar;
  v_status postjob.statuses;
BEGIN
  SELECT j.id, j.workflow, j.status INTO v_id, v_workflow, v_status
    FROM postjob.tokens t JOIN postjob.postjobs j ON j.id = t.postjob_id
    WHERE t.token = p_token
    FOR UPDATE OF j;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'postjob: no job has the token %', p_token USING ERRCODE = 'no_data_found';
  END IF;
  IF v_workflow <> '__manual__' THEN
    RAISE EXCEPTION 'postjob: job % is not a manual job', v_id
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
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
    next_run_at = NULL,
    updated_at = statement_timestamp()
  WHERE id = v_id;
  PERFORM postjob._jobs_ended(
    ARRAY[v_id], CASE WHEN p_error IS NULL THEN '{}'::bigint[] ELSE ARRAY[v_id] END);
  RETURN v_id;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.schedule_tick(p_name character varying, p_tick timestamp with time zone, p_next timestamp with time zone, p_skip boolean, p_queue character varying, p_max_attempts integer, p_timeout double precision, p_tags jsonb)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION postjob.schema_version()
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$ SELECT 'pj0007'::text $function$
;
CREATE OR REPLACE FUNCTION postjob.set_client_identifier(p_identifier character varying)
 RETURNS void
 LANGUAGE sql
AS $function$
  SELECT set_config('postjob.client_identifier', p_identifier, false);
$function$
;
CREATE OR REPLACE FUNCTION postjob.set_workflow_status(p_job_id bigint, p_lease_token bigint, p_status character varying)
 RETURNS boolean
 LANGUAGE sql
AS $function$
  WITH updated AS (
    UPDATE postjob.postjobs SET workflow_status = p_status, updated_at = statement_timestamp()
    WHERE id = p_job_id AND lease_token = p_lease_token
    RETURNING 1
  )
  SELECT EXISTS (SELECT 1 FROM updated)
$function$
;
CREATE OR REPLACE FUNCTION postjob.spawn_children(p_parent_id bigint, p_lease_token bigint, p_queues text[], p_workflows text[], p_args jsonb[], p_max_attempts integer[], p_timeouts double precision[])
 RETURNS TABLE(id bigint, workflow character varying, args jsonb, status text, results jsonb, error character varying, error_message character varying)
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION postjob.time_to_next_job(p_workflows text[], p_versions text[], p_queues text[] DEFAULT NULL::text[])
 RETURNS double precision
 LANGUAGE sql
 STABLE
AS $function$
  SELECT postjob.time_to_next_job_v2(p_workflows, p_versions, p_queues)
$function$
;
CREATE OR REPLACE FUNCTION postjob.time_to_next_job_v2(p_workflows text[], p_versions text[], p_queues text[])
 RETURNS double precision
 LANGUAGE sql
 STABLE
AS $function$
  SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(lease_expires_at) FROM postjob.postjobs WHERE status = 'processing'),
    (SELECT min(timing_out_at) FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL),
    (SELECT min(g.next_run_at)
       FROM postjob._runnable_keys(p_workflows, p_versions) k
       CROSS JOIN LATERAL postjob._runnable_groups(k.workflow, k.workflow_version) g
       WHERE p_queues IS NULL OR g.queue = ANY (p_queues))
  ) - statement_timestamp())::double precision
$function$
;
CREATE OR REPLACE FUNCTION postjob.unregister_worker(p_worker_id bigint)
 RETURNS void
 LANGUAGE sql
AS $function$
  DELETE FROM postjob.workers WHERE id = p_worker_id
$function$
;
CREATE OR REPLACE FUNCTION postjob.worker_cycle(p_worker_id bigint, p_identifier character varying, p_ids bigint[], p_lease_tokens bigint[], p_outcomes text[], p_results jsonb[], p_errors text[], p_messages text[], p_backtraces jsonb[], p_versions text[], p_awaiting bigint[], p_workflows text[], p_workflow_versions text[], p_queues text[], p_limit integer, p_lease double precision, p_fast_mode boolean, p_reap boolean)
 RETURNS TABLE(kind text, id bigint, status text, lease_token bigint, workflow character varying, workflow_version character varying, args jsonb, queue character varying, root_id bigint, full_id character varying, parent_id bigint, attempt integer)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_accepted bigint[];
BEGIN
  IF cardinality(p_ids) > 0 THEN
    v_accepted := postjob.finish_jobs(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors,
                                      p_messages, p_backtraces, p_versions, p_awaiting,
                                      p_fast_mode);
    -- the attempt each run was: an error counted it already, any other outcome did not
    RETURN QUERY SELECT 'done'::text, d.id, d.status::text, NULL::bigint, NULL::varchar,
                        NULL::varchar, NULL::jsonb, NULL::varchar, NULL::bigint,
                        NULL::varchar, NULL::bigint,
                        d.failed_attempts + CASE WHEN i.outcome IN ('err', 'failed') THEN 0
                                                 ELSE 1 END
      FROM postjob.postjobs d
      JOIN unnest(p_ids, p_outcomes) AS i(id, outcome) ON i.id = d.id
      WHERE d.id = ANY (v_accepted);
    RETURN QUERY SELECT 'lost'::text, x, NULL::text, NULL::bigint, NULL::varchar,
                        NULL::varchar, NULL::jsonb, NULL::varchar, NULL::bigint,
                        NULL::varchar, NULL::bigint, NULL::integer
      FROM unnest(p_ids) AS x WHERE x <> ALL (v_accepted);
  END IF;
  IF p_reap THEN
    PERFORM postjob.reap_v2();
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY SELECT 'job'::text, j.id, 'processing'::text, j.lease_token, j.workflow,
                        j.workflow_version, j.args, j.queue, j.root_id, j.full_id, j.parent_id,
                        NULL::integer
      FROM postjob.checkout_v2(p_worker_id, p_identifier, p_workflows, p_workflow_versions,
                               p_queues, p_limit, p_lease) j;
  END IF;
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.worker_heartbeat(p_worker_id bigint, p_lease double precision, p_ids bigint[], p_lease_tokens bigint[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
  v_lost bigint[];
BEGIN
  UPDATE postjob.workers SET
    heartbeat_at = statement_timestamp(),
    expires_at = statement_timestamp() + p_lease * interval '1 second'
  WHERE id = p_worker_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF cardinality(p_ids) > 0 THEN
    UPDATE postjob.postjobs j SET
      lease_expires_at = statement_timestamp() + p_lease * interval '1 second',
      processing_max_duration =
        EXTRACT(EPOCH FROM statement_timestamp() - j.processing_started_at) + p_lease
    WHERE j.id = ANY (ARRAY(
      SELECT s.id FROM postjob.postjobs s
        JOIN unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
          ON s.id = h.id AND s.lease_token = h.lease_token
      FOR NO KEY UPDATE OF s SKIP LOCKED));
    SELECT array_agg(h.id) INTO v_lost
      FROM unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
      WHERE NOT EXISTS (SELECT 1 FROM postjob.postjobs s
                        WHERE s.id = h.id AND s.lease_token = h.lease_token);
  END IF;
  RETURN COALESCE(v_lost, '{}');
END;
$function$
;
CREATE OR REPLACE FUNCTION postjob.worker_idle(p_workflows text[], p_versions text[], p_queues text[], p_reap boolean)
 RETURNS double precision
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF p_reap THEN
    PERFORM postjob.reap_v2();
  END IF;
  RETURN postjob.time_to_next_job_v2(p_workflows, p_versions, p_queues);
END;
$function$
;
