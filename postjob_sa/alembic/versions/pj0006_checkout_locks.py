"""Checkout locks the common case's jobs as it reads them and hands them out in one statement.

Revision ID: pj0006
Revises: pj0005
Create Date: 2026-12-01

pj0005's checkout read the due jobs without locks, locked them by id (SKIP LOCKED), then
handed them out: three statements after the shape was known, and when two workers read the same
head of the queue at once, the second found its candidates locked and scanned again. Now a
first statement finds each (workflow, version) pair's highest (priority, queue) group, whether
its queue is limited and whether another queue shares its priority. When one pair has runnable
jobs and its group is alone at that priority, unlimited and served (a backlog of one kind of
job, the commonest shape), a second statement locks the group's due jobs as it reads them
(passing those another worker holds) and hands them all out: it locks nothing it does not hand
out, since the shape is known before anything is locked. What is left of a batch comes from the
levels below through pj0004's walk; several pairs go through pj0005's one-statement read first,
as before.

``checkout_v2`` keeps its arguments and results, so workers of every earlier revision keep
working on this schema; ``oldest_served_code`` stays pj0001.
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import sends_scripts_whole
from postjob_sa.alembic.versions import pj0005_checkout

revision = "pj0006"
down_revision = "pj0005"
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"

CHECKOUT_SQL = r"""
-- Check out up to p_limit due jobs of the given (workflow, version) pairs, highest priority
-- first, then earliest due, each with a lease of p_lease seconds and a fresh lease token. The
-- common case (one pair with runnable jobs, its highest (priority, queue) group alone at that
-- priority, not limited, served) takes its jobs in one statement that locks them as it reads
-- them; otherwise as in pj0005 (its one-statement read for several pairs, else pj0004's walk
-- of the priority levels and queue limits).
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
  v_taken integer;
  v_pairs integer;
  v_queue text;
  v_workflow text;
  v_version text;
  v_beside text;
  v_read boolean := false;  -- several pairs' top groups, read in one statement, are the batch
BEGIN
  -- Each pair's highest (priority, queue) group (one backward descent), whether its queue is
  -- limited, and whether another queue shares its priority (one more descent).
  SELECT count(*), max(t.priority), max(t.queue), bool_or(t.limited), max(t.beside),
         max(k.workflow), max(k.workflow_version)
    INTO v_pairs, v_top, v_queue, v_limited, v_beside, v_workflow, v_version
    FROM postjob._runnable_keys(p_workflows, p_versions) k
    CROSS JOIN LATERAL (
      SELECT s.priority, s.queue,
             EXISTS (SELECT 1 FROM postjob.queue_limits l WHERE l.queue = s.queue) AS limited,
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
    IF NOT v_limited AND v_beside IS NULL AND (p_queues IS NULL OR v_queue = ANY (p_queues)) THEN
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
  ELSE
    -- Several pairs in one statement: each pair's highest (priority, queue) group, the
    -- priority of the group below it (the next queue of that priority, else the next
    -- priority) and the top group's due jobs (if its queue is served). They are the batch
    -- when every pair's top group has the same priority and no limits, and either nothing
    -- else is runnable or the batch is full and all else ranks lower (as pj0005).
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
    v_read := v_top = v_low AND NOT v_limited
              AND (v_unseen IS NULL OR (v_found >= p_limit AND v_unseen < v_top));
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
$$;

"""

VERSION_UP = (
    "CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql "
    "IMMUTABLE AS $$ SELECT 'pj0006'::text $$"
)


@sends_scripts_whole
def upgrade() -> None:
    op.execute(LOCK_TIMEOUT)
    op.execute(CHECKOUT_SQL)
    op.execute(VERSION_UP)


@sends_scripts_whole
def downgrade() -> None:
    op.execute(LOCK_TIMEOUT)
    # pj0005's functions as that revision wrote them (frozen history), then its version
    op.execute(pj0005_checkout.CHECKOUT_SQL)
    op.execute(pj0005_checkout.VERSION_UP)
