"""Workflow wake-ups that are not lost.

Revision ID: pj0002w
Revises: pj0001
Create Date: 2026-11-29

Two lost wake-ups in pj0001, both found by tests/test_workflow_races.py:

1. finish_jobs' guard "lock the awaited child FOR SHARE, then look at its status" was one
   statement whose status filter PostgreSQL pushes below the row lock: a child whose
   completion is still committing (status processing in the snapshot) was never locked, so
   the parent went to sleep and the child's wake-up, which had seen the parent processing,
   was lost. Both orders failed: the parent's sleep in flight did not hold the child's
   completion back either. Now the lock is taken unconditionally in one statement and the
   status read in the next (a new snapshot, which sees the committed completion).
2. A child that fails or times out while its parent is processing could not wake the
   parent (only sleeping parents are woken): the parent then slept on another child, maybe
   forever. Now _jobs_ended marks such a processing parent (next_run_at = now, unused while
   processing) and finish_jobs turns that parent's 'sleep' into 'ready'; it locks the
   sleeping job's row before reading the mark, so a marking still in flight is waited for.

Frozen history: later revisions change these objects with CREATE OR REPLACE.
"""

from __future__ import annotations

import re

from alembic import op

revision = "pj0002w"
down_revision = "pj0001"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0002w'::text
$$;

-- What happens when jobs reach a final state: the non-final descendants of failed and
-- timed-out jobs are timed out (no orphan work keeps running); sleeping parents that wait
-- for one of these jobs (or that have a child that failed) become ready; processing parents
-- of a failed or timed-out child are marked (next_run_at = now) so that their coming 'sleep'
-- turns into 'ready' (see finish_jobs).
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
      updated_at = now()
    FROM postjob.postjobs a
    WHERE a.id = ANY (p_failed_ids)
      AND d.root_id = a.root_id
      AND d.full_id LIKE a.full_id || '.%'
      AND d.status NOT IN ('ok', 'failed', 'timeout');
  END IF;

  -- Lock the parents to wake or mark (the lock re-reads a parent whose own finish is
  -- committing), then update them by id.
  SELECT array_agg(l.id) FILTER (WHERE l.status = 'sleep'),
         array_agg(l.id) FILTER (WHERE l.status = 'processing')
    INTO v_wake, v_mark
    FROM (
      SELECT parent.id, parent.status
      FROM postjob.postjobs child
      JOIN postjob.postjobs parent ON parent.id = child.parent_id
      WHERE child.id = ANY (p_final_ids)
        AND ((parent.status = 'sleep'
              AND (parent.awaiting_id = child.id OR child.status IN ('failed', 'timeout')))
          OR (parent.status = 'processing' AND child.status IN ('failed', 'timeout')))
      ORDER BY parent.id
      FOR UPDATE OF parent
    ) l;

  IF v_mark IS NOT NULL THEN
    UPDATE postjob.postjobs SET next_run_at = now()
    WHERE id = ANY (v_mark) AND status = 'processing';
  END IF;
  IF v_wake IS NOT NULL THEN
    UPDATE postjob.postjobs SET
      status = 'ready',
      next_run_at = now(),
      awaiting_id = NULL,
      updated_at = now()
    WHERE id = ANY (v_wake) AND status = 'sleep';
    PERFORM pg_notify('postjob_notifications', '');
  END IF;
END;
$$;

-- Record the outcomes of a batch of runs in one statement. Outcomes: 'ok' (with a result
-- stored as [value]), 'err' (recoverable: retried with back-off until max_attempts), 'failed'
-- (final), 'sleep' (waits for the child p_awaiting; goes to ready at once if that child has
-- already finished or a child failed during the run: no lost wake-up), 'release' (back to
-- ready, no attempt counted).
-- A write only applies to a job still processing under the same lease token (fencing).
-- Returns the ids whose outcome was recorded; the others had lost their lease.
CREATE OR REPLACE FUNCTION postjob.finish_jobs(
  p_ids bigint[],
  p_lease_tokens bigint[],
  p_outcomes text[],
  p_results jsonb[],
  p_errors text[],
  p_messages text[],
  p_backtraces jsonb[],
  p_versions text[],
  p_awaiting bigint[],
  p_fast_mode boolean DEFAULT false)
RETURNS bigint[] LANGUAGE plpgsql AS $$
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
    -- Lock first, read after, in separate statements: a lock waits for a completion of an
    -- awaited child (or a failed child's mark on its parent) that is committing right now,
    -- and the reads that follow take a new snapshot that sees it. The locks also hold back a
    -- completion that starts now until this sleep has committed, so it finds the parent
    -- asleep. Children before parents, as a completion locks them.
    PERFORM 1 FROM postjob.postjobs WHERE id = ANY (p_awaiting) ORDER BY id FOR SHARE;
    PERFORM 1 FROM postjob.postjobs WHERE id = ANY (v_sleeping) ORDER BY id FOR UPDATE;
    SELECT COALESCE(array_agg(id), '{}') INTO v_awaited_final FROM postjob.postjobs
      WHERE id = ANY (p_awaiting) AND status IN ('ok', 'failed', 'timeout');
    SELECT COALESCE(array_agg(id), '{}') INTO v_marked FROM postjob.postjobs
      WHERE id = ANY (v_sleeping) AND status = 'processing' AND next_run_at IS NOT NULL;
  END IF;

  WITH input AS (
    SELECT * FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors, p_messages,
                         p_backtraces, p_versions, p_awaiting)
      AS i(id, lease_token, outcome, result, error, message, backtrace, version, awaiting)
  ), decided AS (
    SELECT i.*, j.failed_attempts, j.max_attempts,
      CASE
        WHEN i.outcome = 'ok' THEN 'ok'
        WHEN i.outcome = 'failed' THEN 'failed'
        WHEN i.outcome = 'err' AND j.failed_attempts + 1 < j.max_attempts THEN 'err'
        WHEN i.outcome = 'err' THEN 'failed'
        WHEN i.outcome = 'sleep'
             AND (i.awaiting = ANY (v_awaited_final) OR i.id = ANY (v_marked)) THEN 'ready'
        WHEN i.outcome = 'sleep' THEN 'sleep'
        WHEN i.outcome = 'release' THEN 'ready'
      END AS new_status
    FROM input i JOIN postjob.postjobs j ON j.id = i.id
  ), updated AS (
    UPDATE postjob.postjobs j SET
      status = d.new_status::postjob.statuses,
      results = CASE WHEN d.outcome = 'ok' THEN d.result END,
      error = CASE WHEN d.outcome IN ('err', 'failed') THEN d.error END,
      error_message = CASE WHEN d.outcome IN ('err', 'failed') THEN d.message END,
      error_backtrace = CASE WHEN d.outcome IN ('err', 'failed') THEN d.backtrace END,
      failed_attempts = j.failed_attempts
        + CASE WHEN d.outcome IN ('err', 'failed') THEN 1 ELSE 0 END,
      next_run_at = CASE
        WHEN d.new_status = 'err' THEN now() + postjob._backoff(j.failed_attempts + 1, p_fast_mode)
        WHEN d.new_status = 'ready' THEN now()
      END,
      awaiting_id = CASE WHEN d.new_status = 'sleep' THEN d.awaiting END,
      workflow_version = COALESCE(d.version, j.workflow_version),
      processing_client = NULL,
      processing_client_identifier = NULL,
      processing_started_at = NULL,
      processing_max_duration = NULL,
      lease_expires_at = NULL,
      lease_token = NULL,
      updated_at = now()
    FROM decided d
    WHERE j.id = d.id AND j.status = 'processing' AND j.lease_token = d.lease_token
    RETURNING j.id, j.status
  )
  SELECT array_agg(id),
         array_agg(id) FILTER (WHERE status IN ('ok', 'failed')),
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
  RETURN COALESCE(v_accepted, '{}');
END;
$$;
"""

_REPLACED = ("schema_version", "_jobs_ended", "finish_jobs")


def _pj0001_bodies() -> str:
    """pj0001's definitions of the functions this revision replaces, as CREATE OR REPLACE."""
    from postjob_sa.alembic.versions import pj0001_schema

    out = []
    for name in _REPLACED:
        match = re.search(
            rf"^CREATE FUNCTION postjob\.{name}\(.*?^\$\$;$",
            pj0001_schema.FUNCTIONS_SQL,
            re.DOTALL | re.MULTILINE,
        )
        assert match is not None, name
        out.append(match.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    return "\n\n".join(out)


def upgrade() -> None:
    op.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.execute(_pj0001_bodies())
