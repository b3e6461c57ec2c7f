"""Priorities, unique jobs, cancellation, per-queue limits and schedules.

Revision ID: pj0004
Revises: pj0003
Create Date: 2026-12-01

What changes, block by block (each block below is one step of ``upgrade()``):

- **cancelled**: the status ``cancelled`` (final, distinct from failed), added on its own
  outside the transaction (a value added in a transaction cannot be used in it).
- **columns and tables**: ``priority`` (higher first) and ``unique_key`` on jobs;
  ``postjob.queue_limits`` (concurrency and rate per queue, and the rate's recent starts);
  ``postjob.schedules`` (one row per periodic workflow, with its last and next tick).
- **indexes** (built CONCURRENTLY): the runnable index becomes (workflow, version, priority,
  queue, next_run_at, id), so checkout reads each (priority, queue) group of a pair as one
  short range in FIFO order and never walks past jobs that are not due or not allowed; a
  partial unique index on the ``unique_key`` of unfinished jobs; processing jobs by queue
  (concurrency counts).
- **checkout**: ``checkout_v2`` and ``time_to_next_job_v2`` (same arguments) go down the
  priorities in use, highest first, and stop at the first level that fills the batch: a
  checkout costs a few index probes per pair whatever the number of levels below, and obeys
  the queue limits.
- **endings**: ``_jobs_ended`` treats a cancelled child as a failed one (its parent is woken
  and sees ChildFailed); ``resolve`` refuses a cancelled job; ``reset_jobs`` also resets
  cancelled descendants; ``cancel_jobs`` is new.
- **schedules**: ``schedule_tick`` claims one tick of a schedule (a conditional UPDATE) and
  enqueues its job in the same transaction: one job per tick whatever the number of workers.

Workers of pj0001 and pj0002 code keep working on this schema (the functions they call keep
their arguments and results), so ``oldest_served_code`` stays pj0001.
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import index_step, sends_scripts_whole
from postjob_sa.alembic.versions import pj0002_edges, pj0003_dashboard_index

revision = "pj0004"
down_revision = "pj0003"
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"

# ALTER TYPE ... ADD VALUE runs outside the transaction (index_step's autocommit block): the
# new value cannot be used by the transaction that added it. Nothing below names 'cancelled'
# where it is checked at creation time (plpgsql bodies are compiled when first called).
ENUM_UP = "ALTER TYPE postjob.statuses ADD VALUE IF NOT EXISTS 'cancelled'"

INVALID_INDEXES_DROP = r"""
DO $$
DECLARE
  v_name text;
BEGIN
  FOR v_name IN
    SELECT c.relname FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'postjob' AND NOT i.indisvalid
       AND c.relname IN ('postjobs_runnable_by_group_idx', 'postjobs_unique_key_idx',
                         'postjobs_processing_by_queue_idx')
  LOOP
    EXECUTE format('DROP INDEX postjob.%I', v_name);
  END LOOP;
END
$$
"""
INDEXES_UP = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_runnable_by_group_idx "
    "ON postjob.postjobs (workflow, workflow_version, priority, queue, next_run_at, id) "
    "WHERE status IN ('ready', 'err')",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS postjobs_unique_key_idx "
    "ON postjob.postjobs (unique_key) "
    "WHERE unique_key IS NOT NULL AND status IN ('ready', 'processing', 'sleep', 'err')",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_processing_by_queue_idx "
    "ON postjob.postjobs (queue) WHERE status = 'processing'",
)
OLD_INDEX_DOWN = "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_runnable_by_workflow_idx"
OLD_INDEX_UP = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_runnable_by_workflow_idx "
    "ON postjob.postjobs (workflow, workflow_version, next_run_at) "
    "WHERE status IN ('ready', 'err')"
)
INDEXES_DOWN = (
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_runnable_by_group_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_unique_key_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_processing_by_queue_idx",
)

# Adding a column with a constant default rewrites nothing (PostgreSQL 11+).
COLUMNS_SQL = r"""
ALTER TABLE postjob.postjobs ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;
ALTER TABLE postjob.postjobs ADD COLUMN IF NOT EXISTS unique_key varchar;

-- Per-queue limits, set by operators (postjob queue limit). A checkout that hands out jobs of
-- a limited queue locks its row (SKIP LOCKED: a worker never waits for another's checkout),
-- counts the queue's processing jobs, and records its starts in slots of period/20 seconds:
-- a slot counts as long as any part of it lies within the last period, so no window of
-- `period` seconds ever holds more than `rate` starts.
CREATE TABLE IF NOT EXISTS postjob.queue_limits (
  queue        varchar PRIMARY KEY,
  concurrency  integer,
  rate         integer,
  period       double precision NOT NULL DEFAULT 1,
  rate_slots   bigint[] NOT NULL DEFAULT '{}',
  rate_counts  integer[] NOT NULL DEFAULT '{}',
  updated_at   timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT queue_limits_concurrency_range CHECK (concurrency IS NULL OR concurrency >= 0),
  CONSTRAINT queue_limits_rate_range CHECK (rate IS NULL OR rate >= 0),
  CONSTRAINT queue_limits_period_positive CHECK (period > 0)
);

-- Periodic workflows, declared in code (@workflow(cron=...) or @workflow(every=...)) and
-- written here by the workers that register them. last_tick_at is the last tick handled
-- (enqueued or skipped); a tick is claimed by moving it forward with a conditional UPDATE.
CREATE TABLE IF NOT EXISTS postjob.schedules (
  name           varchar PRIMARY KEY,
  cron           varchar,
  timezone       varchar,
  every          double precision,
  skip_missed    boolean NOT NULL DEFAULT false,
  last_tick_at   timestamptz,
  next_tick_at   timestamptz,
  last_run_at    timestamptz,
  last_job_id    bigint,
  registered_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT schedules_cron_or_every CHECK ((cron IS NULL) <> (every IS NULL))
);

CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0004'::text
$$;
"""

CHECKOUT_SQL = r"""
-- The runnable (priority, queue) groups of one (workflow, version) pair, each with its
-- earliest next_run_at: a loose index scan, one descent of the runnable index per group (the
-- first entry of a group is its earliest job). For the idle worker's wait and the contended
-- checkout; the uncontended checkout reads one priority at a time (_due_jobs).
CREATE OR REPLACE FUNCTION postjob._runnable_groups(p_workflow text, p_version text)
RETURNS TABLE (queue varchar, priority integer, next_run_at timestamptz)
LANGUAGE sql STABLE AS $$
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
$$;

-- The queues of one pair's runnable jobs at one priority: a loose index scan, one descent per
-- queue, backward: each lands at its queue's latest job, never on the entries of the jobs
-- checked out lately (a queue's earliest, dead in the index until the next vacuum), which the
-- due range read after it walks once.
CREATE OR REPLACE FUNCTION postjob._runnable_queues(p_workflow text, p_version text,
                                                    p_priority integer)
RETURNS TABLE (queue varchar)
LANGUAGE sql STABLE AS $$
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
$$;

-- Up to p_limit due jobs of the given pairs, highest priority first, then earliest due, then
-- oldest. The priorities in use are visited from the highest down (one backward probe of the
-- runnable index per pair finds the next), and the visit stops at the level that fills the
-- batch; at each level every due (priority, queue) group is one range of the index. Queues in
-- p_blocked are left out; a group of a queue in p_capped gives at most that queue's p_caps
-- jobs. Nothing is locked.
CREATE OR REPLACE FUNCTION postjob._due_jobs(
  p_workflows text[], p_versions text[], p_queues text[], p_limit integer,
  p_blocked text[], p_capped text[], p_caps integer[])
RETURNS TABLE (id bigint, queue varchar, priority integer, next_run_at timestamptz)
LANGUAGE plpgsql STABLE
-- its generic plans' estimates pass jit_above_cost, and compiling costs far more than the
-- few index probes the statements run (20 ms against 1 ms for a batch of 100)
SET jit = off
AS $$
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
$$;

-- Under contention: lock up to p_limit due jobs (not p_skip) group by group, highest priority
-- first, each group's rows locked as they are read (SKIP LOCKED), stopping once there are
-- enough, so no row is locked that is not handed out.
CREATE OR REPLACE FUNCTION postjob._lock_due_jobs(
  p_workflows text[], p_versions text[], p_queues text[], p_limit integer,
  p_blocked text[], p_skip bigint[])
RETURNS bigint[] LANGUAGE plpgsql
SET jit = off  -- as _due_jobs
AS $$
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
$$;

-- How many jobs a limited queue may start now (its row locked by the caller): the free
-- concurrency slots and what is left of the rate in the last period, whichever is less.
CREATE OR REPLACE FUNCTION postjob._queue_allowance(p_limits postjob.queue_limits)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  v_allowed integer := 2147483647;
  v_width double precision := p_limits.period / 20;
  v_oldest bigint;
  v_started integer;
BEGIN
  IF p_limits.concurrency IS NOT NULL THEN
    v_allowed := p_limits.concurrency - (
      SELECT count(*) FROM postjob.postjobs
      WHERE queue = p_limits.queue AND status = 'processing');
  END IF;
  IF p_limits.rate IS NOT NULL THEN
    v_oldest := floor((EXTRACT(EPOCH FROM statement_timestamp()) - p_limits.period) / v_width);
    SELECT COALESCE(sum(c), 0) INTO v_started
      FROM unnest(p_limits.rate_slots, p_limits.rate_counts) AS r(s, c) WHERE r.s >= v_oldest;
    v_allowed := least(v_allowed, p_limits.rate - v_started);
  END IF;
  RETURN greatest(v_allowed, 0);
END;
$$;

-- Check out up to p_limit due jobs of the given (workflow, version) pairs, highest priority
-- first, then earliest due, each with a lease of p_lease seconds and a fresh lease token (the
-- fencing token every later write must present), in pj0002's columns (never the row type). No
-- reaping here: a checkout inside the caller's transaction must lock only the jobs it hands
-- out (and the limits of their queues).
--
-- The due jobs are first picked without locks and then locked (SKIP LOCKED); only when some
-- were taken meanwhile by another worker does a second pass lock as it scans.
--
-- Limited queues: when candidates belong to queues with limits, the limit rows of those
-- queues are locked (SKIP LOCKED: a queue whose row another checkout holds gives nothing this
-- time, and nobody ever waits), each queue's allowance is read, and the candidates are picked
-- again within the allowances (again, until no new limited queue turns up). The limit rows
-- record the starts, and their locks are held until the checkout commits, so the next
-- checkout of those queues counts these jobs. A checkout whose candidates are all of
-- unlimited queues touches no limit row: one look-up in the (small) table of limits.
CREATE OR REPLACE FUNCTION postjob.checkout_v2(
  p_worker_id bigint,
  p_identifier varchar,
  p_workflows text[],
  p_versions text[],
  p_queues text[],
  p_limit integer,
  p_lease double precision)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint)
LANGUAGE plpgsql
-- one cached plan whatever the arguments (custom plans would be re-planned on every call)
SET plan_cache_mode = force_generic_plan
SET jit = off  -- as _due_jobs
AS $$
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
BEGIN
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
      rate_slots = t.slots, rate_counts = t.counts, updated_at = v_now
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
$$;

-- Seconds until a worker for these pairs has something to do (negative: overdue; NULL:
-- nothing scheduled): its own due jobs (the earliest job of each group), and leases and
-- deadlines of any job (any worker reaps).
CREATE OR REPLACE FUNCTION postjob.time_to_next_job_v2(
  p_workflows text[], p_versions text[], p_queues text[])
RETURNS double precision LANGUAGE sql STABLE AS $$
  SELECT EXTRACT(EPOCH FROM LEAST(
    (SELECT min(lease_expires_at) FROM postjob.postjobs WHERE status = 'processing'),
    (SELECT min(timing_out_at) FROM postjob.postjobs
      WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL),
    (SELECT min(g.next_run_at)
       FROM postjob._runnable_keys(p_workflows, p_versions) k
       CROSS JOIN LATERAL postjob._runnable_groups(k.workflow, k.workflow_version) g
       WHERE p_queues IS NULL OR g.queue = ANY (p_queues))
  ) - statement_timestamp())::double precision
$$;
"""

ENDINGS_SQL = r"""
-- What happens when jobs reach a final state (see pj0002): a cancelled child now counts as
-- a failed one for its parent (a sleeping parent wakes and sees ChildFailed; a processing one
-- is marked so that its coming sleep turns into ready), and a cancelled descendant of a
-- failed job stays cancelled.
CREATE OR REPLACE FUNCTION postjob._jobs_ended(p_final_ids bigint[], p_failed_ids bigint[])
RETURNS void LANGUAGE plpgsql AS $$
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
$$;

-- Cancel these jobs and their unfinished descendants: status cancelled (final) at once, the
-- lease of a running one revoked (its run learns it at its next fenced write or heartbeat and
-- its outcome is not recorded). Parents outside the cancelled trees are woken as for a failed
-- child. Returns the ids cancelled.
CREATE OR REPLACE FUNCTION postjob.cancel_jobs(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
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
$$;

-- Finish a manual job by its token (see pj0002); a cancelled job is final too.
CREATE OR REPLACE FUNCTION postjob.resolve(
  p_token uuid, p_result jsonb, p_error varchar DEFAULT NULL, p_message varchar DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
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
$$;

-- Operator reset (see pj0002): cancelled descendants are reset with failed and timed-out ones.
CREATE OR REPLACE FUNCTION postjob.reset_jobs(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
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
$$;
"""

SCHEDULES_SQL = r"""
-- Claim one tick of a schedule and, unless p_skip, enqueue its job, in one transaction: the
-- conditional UPDATE lets exactly one caller move last_tick_at to p_tick (a concurrent one
-- waits for the row, re-reads it and finds the tick taken). Returns the job's id, or NULL when
-- the tick was taken already or skipped.
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
"""


@sends_scripts_whole
def upgrade() -> None:
    index_step(ENUM_UP)
    index_step(INVALID_INDEXES_DROP)
    op.execute(LOCK_TIMEOUT)
    op.execute(COLUMNS_SQL)
    index_step(*INDEXES_UP)
    op.execute(LOCK_TIMEOUT)
    for block in (CHECKOUT_SQL, ENDINGS_SQL, SCHEDULES_SQL):
        op.execute(block)
    index_step(OLD_INDEX_DOWN)


# -- downgrade: back to pj0003 exactly --------------------------------------------------------

# Enum values cannot be dropped: the type is built again without 'cancelled' (the column is
# rewritten; a downgrade takes the table's lock for that long). Cancelled jobs become failed.
DOWN_STATUS_SQL = r"""
UPDATE postjob.postjobs SET status = 'failed', error = COALESCE(error, 'Cancelled')
WHERE status::text = 'cancelled';
DROP INDEX postjob.postjobs_unique_key_idx;
DROP INDEX postjob.postjobs_processing_by_queue_idx;
DROP INDEX postjob.postjobs_runnable_by_group_idx;
ALTER TYPE postjob.statuses RENAME TO statuses_pj0004;
CREATE TYPE postjob.statuses AS ENUM (
  'ready', 'processing', 'sleep', 'failed', 'err', 'timeout', 'ok'
);
DROP INDEX postjob.postjobs_timing_out_idx;
DROP INDEX postjob.postjobs_lease_idx;
DROP INDEX postjob.postjobs_settled_idx;
ALTER TABLE postjob.postjobs DROP CONSTRAINT postjobs_lease_while_processing;
ALTER TABLE postjob.postjobs
  ALTER COLUMN status DROP DEFAULT,
  ALTER COLUMN status TYPE postjob.statuses USING status::text::postjob.statuses,
  ALTER COLUMN status SET DEFAULT 'ready';
ALTER TABLE postjob.postjobs ADD CONSTRAINT postjobs_lease_while_processing
  CHECK ((status = 'processing') = (lease_token IS NOT NULL));
CREATE INDEX postjobs_runnable_by_workflow_idx
  ON postjob.postjobs (workflow, workflow_version, next_run_at)
  WHERE status IN ('ready', 'err');
CREATE INDEX postjobs_timing_out_idx ON postjob.postjobs (timing_out_at)
  WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL;
CREATE INDEX postjobs_lease_idx ON postjob.postjobs (lease_expires_at)
  WHERE status = 'processing';
CREATE INDEX postjobs_settled_idx ON postjob.postjobs (status, updated_at) INCLUDE (queue)
  WHERE status IN ('sleep', 'failed', 'timeout', 'ok');
"""

# pj0002's checkout and finish_and_checkout (for pj0001 workers) return a status column: they
# name the renamed type until they are made again, and only then can it go.
DOWN_OLD_TYPE_SQL = "DROP TYPE postjob.statuses_pj0004"

DOWN_FUNCTIONS_SQL = r"""
DROP FUNCTION postjob.schedule_tick(varchar, timestamptz, timestamptz, boolean, varchar,
                                    integer, double precision, jsonb);
DROP FUNCTION postjob.cancel_jobs(bigint[]);
DROP FUNCTION postjob._lock_due_jobs(text[], text[], text[], integer, text[], bigint[]);
DROP FUNCTION postjob._due_jobs(text[], text[], text[], integer, text[], text[], integer[]);
DROP FUNCTION postjob._queue_allowance(postjob.queue_limits);
DROP TABLE postjob.schedules;
DROP TABLE postjob.queue_limits;
ALTER TABLE postjob.postjobs DROP COLUMN unique_key;
ALTER TABLE postjob.postjobs DROP COLUMN priority;

"""

# the checkout functions the downgraded ones call; dropped after them
DOWN_GROUPS_SQL = """
DROP FUNCTION postjob._runnable_groups(text, text);
DROP FUNCTION postjob._runnable_queues(text, text, integer);
"""


@sends_scripts_whole
def downgrade() -> None:
    op.execute(LOCK_TIMEOUT)
    op.execute(DOWN_STATUS_SQL)
    op.execute(pj0002_edges.SHAPES_SQL)
    op.execute(pj0002_edges.COMPAT_SQL)
    op.execute(DOWN_OLD_TYPE_SQL)
    # pj0002's bodies of checkout_v2, time_to_next_job_v2, _jobs_ended, reset_jobs and resolve (that
    # revision is frozen: its text is the history)
    for block in (pj0002_edges.CHECKOUT_SQL, pj0002_edges.WAKEUPS_SQL,
                  pj0002_edges.OPERATORS_SQL, pj0002_edges.RESOLVE_SQL):
        op.execute(block)
    op.execute(DOWN_GROUPS_SQL)
    op.execute(DOWN_FUNCTIONS_SQL)
    op.execute(pj0003_dashboard_index.VERSION_UP)
