"""The hot path: one narrow row per unfinished job, its lease as columns of that row.

Revision ID: pj0009
Revises: pj0008
Create Date: 2026-12-02

``postjob.unfinished`` takes the place of ``postjob.waiting`` and ``postjob.leases``: a
checkout is one UPDATE of those rows, a run that ends ok deletes its row and settles the
record, and the record is no longer written at checkout (the status of a running job is
derived; ``postjob.jobs`` is the view SQL readers use). Event keys are locked by a row of
``postjob.event_keys``, which holds at every isolation level. A new job wakes one idle
worker. The function bodies are the live files of ``postjob_sa/sql/`` (pj0008's are frozen
in ``postjob_sa/sql/history/pj0008/``); ``oldest_served_code`` is pj0008, whose calls keep
their signatures (``compat.sql``), and pj0007's wrappers go (``retire/pj0007.sql``).

Upgrading a live database: one short transaction holds the tables (``lock_timeout`` 10 s;
tried again when it meets a worker's transaction), replaces the functions and triggers, and
moves what waits and runs into the new table. A call of a pj0008 worker that queued behind
that lock goes on with pj0008's function bodies: whatever of them writes what this revision
retired (the record's lease columns, the two old tables, kept empty) is refused with a
serialization failure, which the worker tries again, then reaching this revision's functions.
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic import _sql_files
from postjob_sa.alembic._steps import index_step, own_transaction_retried

revision = "pj0009"
down_revision = "pj0008"
branch_labels = None
depends_on = None

#: What this schema is, and the oldest code it serves (pj0008's workers and apps).
VERSION = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0009'::text $$;
CREATE OR REPLACE FUNCTION postjob.oldest_served_code() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0008'::text $$;
"""

LOCKED = r"""
SET LOCAL lock_timeout = '10s';
SET LOCAL check_function_bodies = off;
LOCK TABLE postjob.postjobs, postjob.waiting, postjob.leases, postjob.workers,
  postjob.queue_limits, postjob.queue_slots, postjob.queue_starts IN ACCESS EXCLUSIVE MODE
"""

TABLES = r"""
ALTER TABLE postjob.postjobs ADD COLUMN queued boolean NOT NULL DEFAULT false;
ALTER TABLE postjob.postjobs DROP CONSTRAINT postjobs_lease_while_processing;
ALTER TABLE postjob.workers ADD COLUMN waiting_since timestamptz;
ALTER TABLE postjob.queue_slots DROP CONSTRAINT queue_slots_queue_fkey;
ALTER TABLE postjob.queue_starts DROP CONSTRAINT queue_starts_queue_fkey;
CREATE TABLE postjob.unfinished (
  job_id            bigint PRIMARY KEY,
  status            postjob.statuses NOT NULL,
  workflow          varchar NOT NULL,
  workflow_version  varchar NOT NULL,
  queue             varchar NOT NULL,
  priority          integer NOT NULL,
  run_at            timestamptz,
  due               boolean NOT NULL,
  timing_out_at     timestamptz,
  parent_id         bigint,
  unique_key        varchar,
  lease_token       bigint,
  worker_id         bigint,
  lease_expires_at  timestamptz,
  started_at        timestamptz,
  holder            varchar,
  woken             boolean NOT NULL DEFAULT false,
  CONSTRAINT unfinished_due_has_time CHECK (NOT due OR run_at IS NOT NULL),
  CONSTRAINT unfinished_lease CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 80);
CREATE TABLE postjob.event_keys (
  bucket   integer PRIMARY KEY,
  changes  bigint NOT NULL DEFAULT 0,
  CONSTRAINT event_keys_bucket CHECK (bucket BETWEEN 0 AND 4095)
);
INSERT INTO postjob.event_keys (bucket) SELECT generate_series(0, 4095);
ALTER TABLE postjob.unfinished SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0,
  vacuum_index_cleanup = on);
ALTER TABLE postjob.queue_slots SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE postjob.queue_starts SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE postjob.postjobs SET (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
CREATE TABLE postjob.wakeups (
  job_id      bigint PRIMARY KEY,
  failed      boolean NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
)
"""

# What waits and what runs, into the new table (the record of a running job gets back the
# status it is taken in, and gives its lease to its row).
COPY = r"""
INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, queue, priority,
                                run_at, due, timing_out_at, parent_id, unique_key)
SELECT w.job_id, w.status, w.workflow, w.workflow_version, w.queue, w.priority, w.run_at,
       w.due, w.timing_out_at, j.parent_id, CASE WHEN j.unique_key_held THEN j.unique_key END
FROM postjob.waiting w JOIN postjob.postjobs j ON j.id = w.job_id;
INSERT INTO postjob.unfinished (job_id, status, workflow, workflow_version, queue, priority,
                                run_at, due, timing_out_at, parent_id, unique_key, lease_token,
                                worker_id, lease_expires_at, started_at, holder)
SELECT j.id, CASE WHEN j.status = 'processing' THEN 'ready' ELSE j.status END, j.workflow,
       j.workflow_version, j.queue, j.priority, now(), true, j.timing_out_at, j.parent_id,
       CASE WHEN j.unique_key_held THEN j.unique_key END, l.token, l.worker_id, l.expires_at,
       COALESCE(j.processing_started_at, now()),
       CASE WHEN l.worker_id IS NULL THEN j.processing_client_identifier END
FROM postjob.leases l CROSS JOIN LATERAL unnest(l.job_ids) AS h(id)
JOIN postjob.postjobs j ON j.id = h.id
WHERE j.lease_token = l.token
   OR (j.lease_token IS NULL AND j.status::text IN ('failed', 'timeout', 'cancelled', 'ok'))
ON CONFLICT (job_id) DO NOTHING;
UPDATE postjob.postjobs j SET status = 'ready', lease_token = NULL, lease_expires_at = NULL,
  worker_id = NULL,
  processing_client = CASE WHEN u.worker_id IS NULL THEN j.processing_client END,
  processing_client_identifier = CASE WHEN u.worker_id IS NULL THEN j.processing_client_identifier END,
  processing_started_at = CASE WHEN u.worker_id IS NULL THEN j.processing_started_at END,
  processing_max_duration = CASE WHEN u.worker_id IS NULL THEN j.processing_max_duration END
FROM postjob.unfinished u
WHERE j.status = 'processing' AND u.job_id = j.id;
TRUNCATE postjob.waiting, postjob.leases;
DROP INDEX postjob.waiting_due_idx, postjob.waiting_scheduled_idx, postjob.waiting_timeout_idx,
  postjob.leases_worker_idx;
CREATE INDEX unfinished_due_idx ON postjob.unfinished
  (workflow, workflow_version, queue, priority DESC, run_at, job_id)
  WHERE due AND lease_token IS NULL;
CREATE INDEX unfinished_scheduled_idx ON postjob.unfinished (workflow, workflow_version, run_at)
  WHERE NOT due AND run_at IS NOT NULL AND lease_token IS NULL;
CREATE INDEX unfinished_timeout_idx ON postjob.unfinished (timing_out_at)
  WHERE timing_out_at IS NOT NULL AND lease_token IS NULL;
CREATE INDEX unfinished_leased_idx ON postjob.unfinished (worker_id, lease_expires_at)
  WHERE lease_token IS NOT NULL;
CREATE UNIQUE INDEX unfinished_unique_key_idx ON postjob.unfinished (unique_key)
  WHERE unique_key IS NOT NULL
"""

TRIGGERS = r"""
DROP TRIGGER postjobs_fill_ids ON postjob.postjobs;
DROP TRIGGER postjobs_added ON postjob.postjobs;
DROP FUNCTION postjob._jobs_added();
ALTER TABLE postjob.postjobs DROP CONSTRAINT postjobs_parent_id_fkey;
CREATE TRIGGER postjobs_fill_ids BEFORE INSERT ON postjob.postjobs
  FOR EACH ROW
  WHEN (NEW.parent_id IS NOT NULL OR NEW.root_id IS NULL OR NEW.full_id IS NULL
        OR (NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL)
        OR (NEW.unique_key IS NOT NULL AND NOT NEW.queued))
  EXECUTE FUNCTION postjob._fill_job_ids();
CREATE TRIGGER postjobs_added AFTER INSERT ON postjob.postjobs
  FOR EACH ROW WHEN (NOT NEW.queued) EXECUTE FUNCTION postjob._job_added();
CREATE TRIGGER queue_limits_removed AFTER DELETE ON postjob.queue_limits
  FOR EACH ROW EXECUTE FUNCTION postjob._queue_permits_removed();
CREATE TRIGGER queue_limits_truncated AFTER TRUNCATE ON postjob.queue_limits
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._queue_permits_removed();
CREATE TRIGGER postjobs_retired_lease BEFORE UPDATE OF lease_token, lease_expires_at, worker_id
  ON postjob.postjobs FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call();
CREATE TRIGGER waiting_retired BEFORE INSERT OR UPDATE OR DELETE ON postjob.waiting
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call();
CREATE TRIGGER leases_retired BEFORE INSERT OR UPDATE ON postjob.leases
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call()
"""

# pj0008's functions that are gone (pj0007's wrappers go with retire/pj0007.sql)
OLD_FUNCTIONS = r"""
DROP FUNCTION postjob._take(varchar[], varchar[], varchar[], integer[], bigint, bigint, varchar,
                            double precision);
DROP FUNCTION postjob._ended_early(bigint[])
"""

VIEW = r"""
CREATE VIEW postjob.jobs AS
SELECT j.id, j.parent_id, j.root_id, j.full_id, j.created_at, j.updated_at, j.queue,
       j.workflow, j.workflow_method, j.workflow_version, j.args,
       CASE WHEN u.lease_token IS NOT NULL AND u.status IN ('ready', 'err', 'sleep')
            THEN 'processing'::postjob.statuses ELSE j.status END AS status,
       CASE WHEN u.job_id IS NOT NULL THEN u.run_at ELSE j.next_run_at END AS next_run_at,
       j.timeout, j.timing_out_at, j.failed_attempts, j.max_attempts, j.results, j.error,
       j.error_message, j.error_backtrace, j.workflow_status, j.tags, j.awaiting_id,
       CASE WHEN u.lease_token IS NOT NULL THEN j.processing_client END AS processing_client,
       CASE WHEN u.lease_token IS NOT NULL
            THEN COALESCE(j.processing_client_identifier, u.holder, w.identifier)
       END AS processing_client_identifier,
       u.started_at AS processing_started_at,
       EXTRACT(EPOCH FROM COALESCE(greatest(w.expires_at, u.lease_expires_at), u.lease_expires_at)
                          - u.started_at)::double precision AS processing_max_duration,
       CASE WHEN u.worker_id IS NOT NULL THEN greatest(w.expires_at, u.lease_expires_at)
            ELSE u.lease_expires_at END AS lease_expires_at,
       u.lease_token, u.worker_id, j.priority, j.unique_key,
       u.unique_key IS NOT NULL AS unique_key_held, j.trace_context
FROM postjob.postjobs j
LEFT JOIN postjob.unfinished u ON u.job_id = j.id
LEFT JOIN postjob.workers w ON w.id = u.worker_id
"""

GRANTS = r"""
DO $$
DECLARE
  v_role name;
BEGIN
  FOR v_role IN
    SELECT DISTINCT grantee FROM information_schema.role_table_grants
    WHERE table_schema = 'postjob' AND table_name = 'postjobs' AND privilege_type = 'INSERT'
      AND grantee <> current_user AND grantee <> 'PUBLIC'
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE postjob.unfinished, '
                   'postjob.event_keys, postjob.wakeups TO %I', v_role);
    EXECUTE format('GRANT SELECT ON TABLE postjob.jobs TO %I', v_role);
  END LOOP;
END
$$
"""


def upgrade() -> None:
    own_transaction_retried("\n;\n".join([
        LOCKED, TABLES, *_sql_files.functions("pj0009"), COPY, TRIGGERS, OLD_FUNCTIONS,
        _sql_files.retire("pj0007"), VIEW, GRANTS, VERSION]))
    index_step("DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_unique_key_idx")


# -- downgrade: back to pj0008 exactly ---------------------------------------------------------

# What waits and runs back in pj0008's tables; the record of a running job is processing again.
COPY_DOWN = r"""
DROP TRIGGER waiting_retired ON postjob.waiting;
DROP TRIGGER leases_retired ON postjob.leases;
DROP TRIGGER postjobs_retired_lease ON postjob.postjobs;
CREATE INDEX waiting_due_idx ON postjob.waiting
  (workflow, workflow_version, queue, priority DESC, run_at, job_id) WHERE due;
CREATE INDEX waiting_scheduled_idx ON postjob.waiting (workflow, workflow_version, run_at)
  WHERE NOT due AND run_at IS NOT NULL;
CREATE INDEX waiting_timeout_idx ON postjob.waiting (timing_out_at)
  WHERE timing_out_at IS NOT NULL;
CREATE INDEX leases_worker_idx ON postjob.leases (worker_id);
INSERT INTO postjob.waiting (job_id, status, workflow, workflow_version, queue, priority, run_at,
                             due, timing_out_at)
SELECT u.job_id, u.status, u.workflow, u.workflow_version, u.queue, u.priority, u.run_at, u.due,
       u.timing_out_at
FROM postjob.unfinished u
WHERE u.lease_token IS NULL AND u.status IN ('ready', 'err', 'sleep');
INSERT INTO postjob.leases (token, worker_id, expires_at, job_ids)
SELECT u.lease_token, min(u.worker_id), max(u.lease_expires_at), array_agg(u.job_id)
FROM postjob.unfinished u WHERE u.lease_token IS NOT NULL GROUP BY u.lease_token;
UPDATE postjob.postjobs j SET status = 'processing', lease_token = u.lease_token,
  lease_expires_at = u.lease_expires_at, worker_id = u.worker_id,
  processing_started_at = COALESCE(j.processing_started_at, u.started_at),
  processing_client_identifier = COALESCE(j.processing_client_identifier, u.holder)
FROM postjob.unfinished u
WHERE u.job_id = j.id AND u.lease_token IS NOT NULL AND u.status IN ('ready', 'err', 'sleep');
ALTER TABLE postjob.postjobs ADD CONSTRAINT postjobs_lease_while_processing
  CHECK ((status = 'processing') = (lease_token IS NOT NULL)) NOT VALID
"""

NEW_DOWN = r"""
DROP VIEW postjob.jobs;
DROP TRIGGER queue_limits_removed ON postjob.queue_limits;
DROP TRIGGER queue_limits_truncated ON postjob.queue_limits;
DROP FUNCTION postjob._queue_permits_removed();
ALTER TABLE postjob.queue_slots ADD CONSTRAINT queue_slots_queue_fkey FOREIGN KEY (queue)
  REFERENCES postjob.queue_limits (queue) ON DELETE CASCADE;
ALTER TABLE postjob.queue_starts ADD CONSTRAINT queue_starts_queue_fkey FOREIGN KEY (queue)
  REFERENCES postjob.queue_limits (queue) ON DELETE CASCADE;
DROP TRIGGER postjobs_added ON postjob.postjobs;
DROP TRIGGER postjobs_fill_ids ON postjob.postjobs;
CREATE TRIGGER postjobs_fill_ids BEFORE INSERT ON postjob.postjobs
  FOR EACH ROW
  WHEN (NEW.root_id IS NULL OR NEW.full_id IS NULL
        OR (NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL)
        OR NEW.unique_key IS NOT NULL)
  EXECUTE FUNCTION postjob._fill_job_ids();
CREATE TRIGGER postjobs_added AFTER INSERT ON postjob.postjobs
  REFERENCING NEW TABLE AS added
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._jobs_added();
DROP FUNCTION postjob._job_added();
DROP FUNCTION postjob._first_run_at(postjob.statuses, varchar, timestamptz);
DROP FUNCTION postjob.enqueue_v1(varchar, jsonb, varchar, integer, double precision, varchar,
                                 jsonb, timestamptz, integer, varchar, jsonb);
DROP FUNCTION postjob._wake(integer);
DROP FUNCTION postjob._stale_call();
ALTER TABLE postjob.postjobs ADD CONSTRAINT postjobs_parent_id_fkey FOREIGN KEY (parent_id)
  REFERENCES postjob.postjobs (id) ON DELETE CASCADE NOT VALID;
DROP FUNCTION postjob.checkout_v4(bigint, varchar, text[], text[], text[], integer,
                                  double precision, boolean, boolean, boolean);
DROP FUNCTION postjob._checkout_counted(bigint, bigint, varchar, text[], text[], text[], integer,
                                        double precision, boolean);
DROP FUNCTION postjob._checkout_shares(text[], text[], text[], integer, boolean);
DROP FUNCTION postjob._limited_queues(text[], text[], text[]);
DROP FUNCTION postjob.finish_v4(bigint[], bigint[], jsonb[], text[], bigint[], bigint[], text[],
                                text[], text[], jsonb[], text[], bigint[], double precision[],
                                bigint[], bigint[]);
DROP FUNCTION postjob._settle(bigint[], bigint[], text[], jsonb[], text[], text[], jsonb[],
                              text[], bigint[], double precision[], bigint[], bigint[]);
DROP FUNCTION postjob._runs_stopped(bigint[], bigint[]);
DROP FUNCTION postjob._sleep_woken(bigint, bigint, boolean);
DROP FUNCTION postjob._outcome_next(text, double precision, postjob.statuses, boolean, integer,
                                    integer, timestamptz);
DROP FUNCTION postjob._permits_lock(postjob.queue_limits, integer, timestamptz);
DROP FUNCTION postjob._pick(varchar, varchar, varchar, boolean, text[], integer, timestamptz);
DROP FUNCTION postjob._free_places(bigint[]);
DROP FUNCTION postjob._lock_family(bigint[], bigint[]);
DROP FUNCTION postjob._tell_family(bigint[], bigint[]);
DROP FUNCTION postjob._tell_pending(integer);
DROP FUNCTION postjob._descendants(bigint[]);
DROP FUNCTION postjob._end_unfinished(bigint[], postjob.statuses, varchar, varchar);
DROP FUNCTION postjob._hold(bigint, bigint);
DROP FUNCTION postjob.reap_v4(integer);
DROP FUNCTION postjob.worker_idle_v2(bigint, text[], text[], text[], boolean);
DROP FUNCTION postjob._event_key_lock(varchar);
ALTER TABLE postjob.queue_slots RESET (autovacuum_vacuum_scale_factor,
  autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay);
ALTER TABLE postjob.queue_starts RESET (autovacuum_vacuum_scale_factor,
  autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay);
ALTER TABLE postjob.postjobs RESET (autovacuum_vacuum_scale_factor,
  autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
DROP TABLE postjob.unfinished;
DROP TABLE postjob.event_keys;
DROP TABLE postjob.wakeups;
ALTER TABLE postjob.workers DROP COLUMN waiting_since;
ALTER TABLE postjob.postjobs DROP COLUMN queued;
"""


def downgrade() -> None:
    index_step("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS postjobs_unique_key_idx "
               "ON postjob.postjobs (unique_key) WHERE unique_key_held")
    own_transaction_retried("\n;\n".join([
        LOCKED, COPY_DOWN, *_sql_files.functions("pj0008"), NEW_DOWN]))
    op.execute("ALTER TABLE postjob.postjobs VALIDATE CONSTRAINT postjobs_lease_while_processing")
    op.execute("ALTER TABLE postjob.postjobs VALIDATE CONSTRAINT postjobs_parent_id_fkey")
