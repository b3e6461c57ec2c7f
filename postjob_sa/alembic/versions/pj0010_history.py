"""History partitions: the job record partitioned by ranges of job id.

Revision ID: pj0010
Revises: pj0009
Create Date: 2026-12-02

``postjob.postjobs`` becomes a table partitioned by ranges of id (``postjob_sa/sql/history.sql``
creates the ranges ahead and drops those past ``keep``; ``postjob.history_settings`` holds
the settings). The record as it is becomes the first range, ``postjobs_from_0``, without a
rewrite: a CHECK of its ids, validated beside running workers, spares the attach a scan, and
its indexes become the range's (the children index, no longer unique, is built beside the
workers first). The self foreign key and the tokens' go (a job's children and tokens go with
it by a trigger); a host's foreign keys to the record are moved to the partitioned table,
NOT VALID, then validated beside the workers. The function bodies are the live files
(pj0009's are frozen in ``postjob_sa/sql/history/pj0009/``); pj0008's code is still served.
"""

from __future__ import annotations

from postjob_sa.alembic import _sql_files
from postjob_sa.alembic._steps import index_step, own_transaction, own_transaction_retried

revision = "pj0010"
down_revision = "pj0009"
branch_labels = None
depends_on = None

VERSION = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0010'::text $$;
CREATE OR REPLACE FUNCTION postjob.oldest_served_code() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0008'::text $$;
"""

# The first range ends a million ids past the last one at least half a million ahead (an
# insert meanwhile must pass the CHECK, which holds from now on).
RANGE_CHECK = r"""
DO $$
BEGIN
  EXECUTE format('ALTER TABLE postjob.postjobs ADD CONSTRAINT postjobs_from_0_range '
                 'CHECK (id < %s) NOT VALID',
                 ((COALESCE(pg_sequence_last_value('postjob.postjobs_id_seq'), 0) + 1500000)
                  / 1000000) * 1000000);
END
$$;
"""

CHILDREN_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS "
    "postjobs_from_0_parent_id_workflow_workflow_method_md5_idx ON postjob.postjobs "
    "(parent_id, workflow, workflow_method, md5(args::text)) WHERE parent_id IS NOT NULL")

# The record first, as long as it takes; then the rest with a lock_timeout shorter than the
# server's deadlock_timeout (1 s by default): a call that holds a runnable row's table and waits
# for the record (an enqueue, a checkout) would otherwise close a cycle with this
# transaction, and the deadlock detector might end the call rather than the migration. The
# migration gives up first and is tried again (own_transaction_retried).
LOCKED = r"""
SET LOCAL lock_timeout = '10s';
SET LOCAL check_function_bodies = off;
LOCK TABLE postjob.postjobs IN ACCESS EXCLUSIVE MODE;
SET LOCAL lock_timeout = '400ms';
LOCK TABLE postjob.unfinished, postjob.tokens, postjob.waiting, postjob.leases, postjob.workers,
  postjob.queue_limits, postjob.queue_slots, postjob.queue_starts IN ACCESS EXCLUSIVE MODE;
SET LOCAL lock_timeout = '10s'
"""

# A host's foreign keys to the record, kept to be made again on the partitioned table.
HOST_KEYS_OFF = r"""
CREATE TEMP TABLE pj0010_host_keys ON COMMIT DROP AS
  SELECT c.conrelid::regclass::text AS host, c.conname::text AS name,
         pg_get_constraintdef(c.oid) AS definition
  FROM pg_constraint c
  WHERE c.contype = 'f' AND c.confrelid = 'postjob.postjobs'::regclass
    AND c.conrelid NOT IN ('postjob.postjobs'::regclass, 'postjob.tokens'::regclass);
DO $$
DECLARE k record;
BEGIN
  FOR k IN SELECT * FROM pj0010_host_keys LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', k.host, k.name);
  END LOOP;
END
$$
"""

HOST_KEYS_ON = r"""
DO $$
DECLARE k record;
BEGIN
  FOR k IN SELECT * FROM pj0010_host_keys LOOP
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s NOT VALID', k.host, k.name,
                   k.definition);
  END LOOP;
END
$$
"""

PARTITIONED = r"""
ALTER TABLE postjob.tokens DROP CONSTRAINT tokens_postjob_id_fkey;
DROP VIEW postjob.jobs;
DROP TRIGGER postjobs_fill_ids ON postjob.postjobs;
DROP TRIGGER postjobs_added ON postjob.postjobs;
DROP TRIGGER postjobs_removed ON postjob.postjobs;
DROP TRIGGER postjobs_truncated ON postjob.postjobs;
DROP TRIGGER postjobs_retired_lease ON postjob.postjobs;
DROP INDEX postjob.postjobs_child_key_idx;
ALTER TABLE postjob.postjobs RENAME TO postjobs_from_0;
ALTER TABLE postjob.postjobs_from_0 RENAME CONSTRAINT postjobs_pkey TO postjobs_from_0_pkey;
ALTER INDEX postjob.postjobs_tree_idx RENAME TO postjobs_from_0_root_id_full_id_idx;
ALTER INDEX postjob.postjobs_tags_idx RENAME TO postjobs_from_0_tags_idx;
ALTER INDEX postjob.postjobs_errors_idx RENAME TO postjobs_from_0_id_idx;
CREATE TABLE postjob.postjobs (LIKE postjob.postjobs_from_0 INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS) PARTITION BY RANGE (id);
ALTER TABLE postjob.postjobs DROP CONSTRAINT postjobs_from_0_range;
ALTER TABLE postjob.postjobs ADD CONSTRAINT postjobs_pkey PRIMARY KEY (id);
CREATE INDEX postjobs_children_idx
  ON postjob.postjobs (parent_id, workflow, workflow_method, md5(args::text))
  WHERE parent_id IS NOT NULL;
CREATE INDEX postjobs_tree_idx ON postjob.postjobs (root_id, full_id text_pattern_ops)
  WHERE parent_id IS NOT NULL;
CREATE INDEX postjobs_tags_idx ON postjob.postjobs USING gin (tags jsonb_path_ops)
  WHERE tags IS NOT NULL;
CREATE INDEX postjobs_errors_idx ON postjob.postjobs (id) WHERE error IS NOT NULL;
ALTER SEQUENCE postjob.postjobs_id_seq OWNED BY postjob.postjobs.id;
DO $$
BEGIN
  EXECUTE format('ALTER TABLE postjob.postjobs ATTACH PARTITION postjob.postjobs_from_0 '
                 'FOR VALUES FROM (MINVALUE) TO (%s)',
                 (SELECT (regexp_match(pg_get_constraintdef(c.oid), '< \(?''?([0-9]+)'))[1]
                  FROM pg_constraint c WHERE c.conname = 'postjobs_from_0_range'
                    AND c.conrelid = 'postjob.postjobs_from_0'::regclass));
END
$$;
ALTER TABLE postjob.postjobs_from_0 DROP CONSTRAINT postjobs_from_0_range;
CREATE TABLE postjob.postjobs_default PARTITION OF postjob.postjobs DEFAULT
  WITH (fillfactor = 50);
ALTER TABLE postjob.postjobs_default SET (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
CREATE TABLE postjob.history_settings (
  id              boolean PRIMARY KEY DEFAULT true,
  keep            interval,
  partition_size  bigint NOT NULL DEFAULT 1000000,
  updated_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT history_settings_one_row CHECK (id),
  CONSTRAINT history_settings_keep_positive CHECK (keep IS NULL OR keep > interval '0'),
  CONSTRAINT history_settings_partition_size CHECK (partition_size >= 1000)
);
CREATE TABLE postjob.history_partitions (
  name           varchar PRIMARY KEY,
  newest_settle  timestamptz,
  checked_at     timestamptz NOT NULL DEFAULT now()
)
"""

# The view as pj0009 made it, now of the partitioned table.
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

# The triggers as pj0009 had them, now on the partitioned table; then the record's grants.
TRIGGERS = r"""
CREATE TRIGGER postjobs_fill_ids BEFORE INSERT ON postjob.postjobs
  FOR EACH ROW
  WHEN (NEW.parent_id IS NOT NULL OR NEW.root_id IS NULL OR NEW.full_id IS NULL
        OR (NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL)
        OR (NEW.unique_key IS NOT NULL AND NOT NEW.queued))
  EXECUTE FUNCTION postjob._fill_job_ids();
CREATE TRIGGER postjobs_added AFTER INSERT ON postjob.postjobs
  FOR EACH ROW WHEN (NOT NEW.queued) EXECUTE FUNCTION postjob._job_added();
CREATE TRIGGER postjobs_removed AFTER DELETE ON postjob.postjobs
  REFERENCING OLD TABLE AS removed
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._jobs_removed();
CREATE TRIGGER postjobs_truncated AFTER TRUNCATE ON postjob.postjobs
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._jobs_truncated();
CREATE TRIGGER postjobs_retired_lease BEFORE UPDATE OF lease_token, lease_expires_at, worker_id
  ON postjob.postjobs FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call()
"""

GRANTS = r"""
DO $$
DECLARE g record;
BEGIN
  FOR g IN
    SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE quote_ident(a.grantee::regrole::text) END AS grantee
    FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    WHERE c.oid = 'postjob.postjobs_from_0'::regclass AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT %s ON TABLE postjob.postjobs TO %s', g.privilege_type, g.grantee);
    IF g.privilege_type = 'SELECT' THEN
      EXECUTE format('GRANT SELECT ON TABLE postjob.jobs TO %s', g.grantee);
    END IF;
    IF g.privilege_type = 'INSERT' AND g.grantee <> 'PUBLIC' THEN
      EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE postjob.history_settings, '
                     'postjob.history_partitions TO %s', g.grantee);
    END IF;
  END LOOP;
END
$$
"""

VALIDATE_HOST_KEYS = r"""
DO $$
DECLARE k record;
BEGIN
  FOR k IN SELECT c.conrelid::regclass::text AS host, c.conname::text AS name
           FROM pg_constraint c
           WHERE c.contype = 'f' AND c.confrelid = 'postjob.postjobs'::regclass
             AND NOT c.convalidated LOOP
    EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT %I', k.host, k.name);
  END LOOP;
END
$$;
"""


def upgrade() -> None:
    own_transaction_retried(RANGE_CHECK)
    own_transaction("ALTER TABLE postjob.postjobs VALIDATE CONSTRAINT postjobs_from_0_range;")
    index_step(CHILDREN_INDEX)
    own_transaction_retried("\n;\n".join([
        LOCKED, HOST_KEYS_OFF, PARTITIONED, *_sql_files.functions("pj0010"), VIEW, TRIGGERS,
        GRANTS, HOST_KEYS_ON, VERSION]), tries=20)
    own_transaction(VALIDATE_HOST_KEYS)


# -- downgrade: back to pj0009 exactly -------------------------------------------------------

# The ranges merged back into one plain table: the first range detached, the others' jobs
# copied into it (the partitioned table goes with them); jobs whose parent a drop of history
# took go, as pj0009's cascade would have taken them.
MERGED = r"""
CREATE TEMP TABLE pj0010_host_keys ON COMMIT DROP AS
  SELECT c.conrelid::regclass::text AS host, c.conname::text AS name,
         pg_get_constraintdef(c.oid) AS definition
  FROM pg_constraint c
  WHERE c.contype = 'f' AND c.confrelid = 'postjob.postjobs'::regclass
    AND c.conparentid = 0 AND c.conrelid <> 'postjob.tokens'::regclass;
DO $$
DECLARE k record;
BEGIN
  FOR k IN SELECT * FROM pj0010_host_keys LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', k.host, k.name);
  END LOOP;
END
$$;
DROP VIEW postjob.jobs;
ALTER TABLE postjob.postjobs DETACH PARTITION postjob.postjobs_from_0;
DO $$
BEGIN
  EXECUTE format('INSERT INTO postjob.postjobs_from_0 (%1$s) SELECT %1$s FROM postjob.postjobs',
                 (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
                  FROM pg_attribute a
                  WHERE a.attrelid = 'postjob.postjobs'::regclass AND a.attnum > 0
                    AND NOT a.attisdropped));
END
$$;
ALTER SEQUENCE postjob.postjobs_id_seq OWNED BY postjob.postjobs_from_0.id;
DROP TABLE postjob.postjobs;
ALTER TABLE postjob.postjobs_from_0 RENAME TO postjobs;
ALTER TABLE postjob.postjobs RENAME CONSTRAINT postjobs_from_0_pkey TO postjobs_pkey;
ALTER INDEX postjob.postjobs_from_0_root_id_full_id_idx RENAME TO postjobs_tree_idx;
ALTER INDEX postjob.postjobs_from_0_tags_idx RENAME TO postjobs_tags_idx;
ALTER INDEX postjob.postjobs_from_0_id_idx RENAME TO postjobs_errors_idx;
DROP INDEX postjob.postjobs_from_0_parent_id_workflow_workflow_method_md5_idx;
DELETE FROM postjob.tokens t
  WHERE NOT EXISTS (SELECT 1 FROM postjob.postjobs p WHERE p.id = t.postjob_id);
ALTER TABLE postjob.tokens ADD CONSTRAINT tokens_postjob_id_fkey FOREIGN KEY (postjob_id)
  REFERENCES postjob.postjobs (id) ON DELETE CASCADE NOT VALID;
DROP TABLE postjob.history_settings;
DROP TABLE postjob.history_partitions
"""

NEW_DOWN = r"""
DROP FUNCTION postjob.rotate_history();
DROP FUNCTION postjob.history_status();
DROP FUNCTION postjob._history_settings();
DROP FUNCTION postjob._history_ranges();
DROP FUNCTION postjob._history_last_id();
DROP FUNCTION postjob._history_live_roots();
DROP FUNCTION postjob._history_pin(bigint, bigint, bigint[]);
DROP FUNCTION postjob._history_add_range(bigint, bigint);
DROP FUNCTION postjob._history_drop_range(text, bigint, bigint);
DROP FUNCTION postjob._history_compact(text, bigint, bigint)
"""

VERSION_DOWN = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0009'::text $$;
"""

GRANTS_DOWN = r"""
DO $$
DECLARE g record;
BEGIN
  FOR g IN
    SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                ELSE quote_ident(a.grantee::regrole::text) END AS grantee
    FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    WHERE c.oid = 'postjob.postjobs'::regclass AND a.grantee <> c.relowner
      AND a.privilege_type = 'SELECT'
  LOOP
    EXECUTE format('GRANT SELECT ON TABLE postjob.jobs TO %s', g.grantee);
  END LOOP;
END
$$
"""

VALIDATE_DOWN = r"""
ALTER TABLE postjob.tokens VALIDATE CONSTRAINT tokens_postjob_id_fkey;
"""


def downgrade() -> None:
    # pj0009's unique children index, on the first range (it holds the others' jobs next)
    index_step("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS postjobs_child_key_idx "
               "ON postjob.postjobs_from_0 (parent_id, workflow, workflow_method, "
               "md5(args::text)) WHERE parent_id IS NOT NULL")
    own_transaction_retried("\n;\n".join([
        LOCKED, MERGED, *_sql_files.functions("pj0009"), VIEW, TRIGGERS, GRANTS_DOWN,
        HOST_KEYS_ON, NEW_DOWN, VERSION_DOWN]), tries=20)
    own_transaction(VALIDATE_DOWN)
    own_transaction(VALIDATE_HOST_KEYS)
