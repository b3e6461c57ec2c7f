"""A cheaper checkout: the common case in one statement, and no index for concurrency counts.

Revision ID: pj0005
Revises: pj0004
Create Date: 2026-12-01

pj0004's checkout went down the priority levels in use and the queues of each (a probe per
level, a loose scan of its queues, a range per queue) on every call, and every job it handed out
also entered an index of processing jobs by queue, kept for the concurrency limits' counts.
Measured against the code before pj0004, a checkout of one job cost about a third more and a
batch of 100 about two fifths more. What changes, block by block:

- **limits**: ``queue_limits.processing_ids`` holds the ids a concurrency limit counts (the
  jobs of its queue checked out while it was limited; NULL until a checkout first reads them
  from the table), kept by the checkout that holds the limit's row, so counting costs a few
  primary-key look-ups (as many as the limit allows) and ``postjobs_processing_by_queue_idx``
  goes: a job's checkout writes one index entry fewer.
- **plans**: ``worker_cycle`` and ``finish_jobs`` keep one cached plan per statement (they were
  planned again on every call: a third of a one-job cycle) and never JIT-compile.
- **checkout**: ``checkout_v2`` (same arguments and results) first reads each pair's highest
  (priority, queue) group and the group below it in one statement; when every pair's top group
  has the same priority and no limits, and either nothing else is runnable or the batch is full
  and all else ranks lower, those are the jobs (the common case: one priority, or a backlog at
  the highest one). Otherwise pj0004's walk of the levels picks them, unchanged. A checkout of
  one job returns it without the join and sort that order a batch.

Workers of earlier code keep working on this schema (the functions they call keep their
arguments and results), so ``oldest_served_code`` stays pj0001.
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import index_step, sends_scripts_whole
from postjob_sa.alembic.versions import pj0004_features

revision = "pj0005"
down_revision = "pj0004"
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"

COLUMN_UP = (
    "ALTER TABLE postjob.queue_limits ADD COLUMN IF NOT EXISTS processing_ids bigint[]"
)
COLUMN_DOWN = "ALTER TABLE postjob.queue_limits DROP COLUMN IF EXISTS processing_ids"

INDEX_DOWN = "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_processing_by_queue_idx"
INDEX_UP = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_processing_by_queue_idx "
    "ON postjob.postjobs (queue) WHERE status = 'processing'"
)
INVALID_INDEX_DROP = r"""
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE c.oid = to_regclass('postjob.postjobs_processing_by_queue_idx')
               AND NOT i.indisvalid) THEN
    DROP INDEX postjob.postjobs_processing_by_queue_idx;
  END IF;
END
$$
"""

CHECKOUT_SQL = r"""
-- The ids of a queue's processing jobs: among p_known when given (primary-key look-ups), else
-- read from the table (once per limit: its row keeps them from then on).
CREATE OR REPLACE FUNCTION postjob._queue_processing(p_queue varchar, p_known bigint[])
RETURNS bigint[] LANGUAGE sql STABLE AS $$
  SELECT CASE
    WHEN p_known IS NULL THEN ARRAY(
      SELECT p.id FROM postjob.postjobs p WHERE p.status = 'processing' AND p.queue = p_queue)
    ELSE ARRAY(
      SELECT p.id FROM postjob.postjobs p
      WHERE p.id = ANY (p_known) AND p.status = 'processing' AND p.queue = p_queue)
  END
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
$$;

-- Check out up to p_limit due jobs of the given (workflow, version) pairs, highest priority
-- first, then earliest due, each with a lease of p_lease seconds and a fresh lease token (as
-- in pj0004, whose walk of the priority levels and queue limits is the general case here).
-- The common case is one statement: see the first step below.
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
  v_found integer;
  v_top integer;
  v_low integer;
  v_unseen integer;
  v_limited boolean;
BEGIN
  -- The common case in one statement: each pair's highest (priority, queue) group (one
  -- backward descent), the priority of the group below it (one or two more: the next queue of
  -- that priority, else the next priority) and the top group's due jobs (if its queue is
  -- served). They are the batch when every pair's top group has the same priority and no
  -- limits, and either nothing else is runnable or the batch is full and all else ranks lower.
  SELECT array_agg(c.id ORDER BY c.next_run_at, c.id), count(c.id), max(t.priority),
         min(t.priority), max(b.priority), bool_or(t.limited)
    INTO v_candidates, v_found, v_top, v_low, v_unseen, v_limited
    FROM postjob._runnable_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT s.priority, s.queue,
             EXISTS (SELECT 1 FROM postjob.queue_limits l WHERE l.queue = s.queue) AS limited
      FROM postjob.postjobs s
      WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND s.status IN ('ready', 'err')
      ORDER BY s.priority DESC, s.queue DESC
      LIMIT 1) t
    CROSS JOIN LATERAL (
      SELECT COALESCE(
        (SELECT s.priority FROM postjob.postjobs s
         WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
           AND s.status IN ('ready', 'err') AND s.priority = t.priority AND s.queue < t.queue
         ORDER BY s.queue DESC
         LIMIT 1),
        (SELECT s.priority FROM postjob.postjobs s
         WHERE s.workflow = k.workflow AND s.workflow_version = k.workflow_version
           AND s.status IN ('ready', 'err') AND s.priority < t.priority
         ORDER BY s.priority DESC
         LIMIT 1)) AS priority
      OFFSET 0) b  -- once per pair (a projection alone would be pulled up: once per job)
    LEFT JOIN LATERAL (
      SELECT s.id, s.next_run_at FROM postjob.postjobs s
      WHERE (p_queues IS NULL OR t.queue = ANY (p_queues))
        AND s.workflow = k.workflow AND s.workflow_version = k.workflow_version
        AND s.priority = t.priority AND s.queue = t.queue
        AND s.status IN ('ready', 'err') AND s.next_run_at <= v_now
        AND (s.timing_out_at IS NULL OR s.timing_out_at > v_now)
      ORDER BY s.next_run_at, s.id
      LIMIT p_limit) c ON true;
  IF v_top IS NULL THEN
    RETURN;  -- nothing runnable
  END IF;
  IF v_top = v_low AND NOT v_limited
     AND (v_unseen IS NULL OR (v_found >= p_limit AND v_unseen < v_top)) THEN
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
$$;

"""

# The worker's cycle and the outcomes it records take arrays; with custom plans (the default
# after five calls, when a plan for the actual array looks cheaper than the generic one)
# PostgreSQL planned their statements again on every call: 2.3 ms for a cycle of one job, 1.6 ms
# with one cached plan each (interleaved, same table). Nested statements inherit the settings,
# JIT included (generic plans are costed for any array).
PLANS_UP = r"""
ALTER FUNCTION postjob.worker_cycle(bigint, varchar, bigint[], bigint[], text[], jsonb[],
  text[], text[], jsonb[], text[], bigint[], text[], text[], text[], integer, double precision,
  boolean, boolean)
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION postjob.worker_cycle(bigint, varchar, bigint[], bigint[], text[], jsonb[],
  text[], text[], jsonb[], text[], bigint[], text[], text[], text[], integer, double precision,
  boolean, boolean)
  SET jit = off;
ALTER FUNCTION postjob.finish_jobs(bigint[], bigint[], text[], jsonb[], text[], text[],
  jsonb[], text[], bigint[], boolean)
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION postjob.finish_jobs(bigint[], bigint[], text[], jsonb[], text[], text[],
  jsonb[], text[], bigint[], boolean)
  SET jit = off;
"""
PLANS_DOWN = r"""
ALTER FUNCTION postjob.worker_cycle(bigint, varchar, bigint[], bigint[], text[], jsonb[],
  text[], text[], jsonb[], text[], bigint[], text[], text[], text[], integer, double precision,
  boolean, boolean)
  RESET plan_cache_mode;
ALTER FUNCTION postjob.worker_cycle(bigint, varchar, bigint[], bigint[], text[], jsonb[],
  text[], text[], jsonb[], text[], bigint[], text[], text[], text[], integer, double precision,
  boolean, boolean)
  RESET jit;
ALTER FUNCTION postjob.finish_jobs(bigint[], bigint[], text[], jsonb[], text[], text[],
  jsonb[], text[], bigint[], boolean)
  RESET plan_cache_mode;
ALTER FUNCTION postjob.finish_jobs(bigint[], bigint[], text[], jsonb[], text[], text[],
  jsonb[], text[], bigint[], boolean)
  RESET jit;
"""

VERSION_UP = (
    "CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql "
    "IMMUTABLE AS $$ SELECT 'pj0005'::text $$"
)
# as pj0004 wrote it (the text is part of the function: a downgrade gives it back exactly)
VERSION_DOWN = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0004'::text
$$;
"""


@sends_scripts_whole
def upgrade() -> None:
    op.execute(LOCK_TIMEOUT)
    op.execute(COLUMN_UP)
    op.execute(CHECKOUT_SQL)
    op.execute(PLANS_UP)
    op.execute(VERSION_UP)
    # after the new checkout is in place: no call counts through the index any more
    index_step(INDEX_DOWN)


@sends_scripts_whole
def downgrade() -> None:
    index_step(INVALID_INDEX_DROP, INDEX_UP)
    op.execute(LOCK_TIMEOUT)
    op.execute(PLANS_DOWN)
    op.execute("DROP FUNCTION postjob._queue_processing(varchar, bigint[])")
    # pj0004's checkout_v2 and _queue_allowance (that revision is frozen: its text is the
    # history), then the column they do not know
    op.execute(pj0004_features.CHECKOUT_SQL)
    op.execute(COLUMN_DOWN)
    op.execute(VERSION_DOWN)
