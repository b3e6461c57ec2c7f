"""The core as postjob_sa/sql/ describes it: narrow tables for what waits and what runs.

Revision ID: pj0008
Revises: pj0007
Create Date: 2026-12-01

From here on, the current schema and every function body live in ``postjob_sa/sql/`` (one
file per concern); this revision installs its copy of the function files, frozen in
``postjob_sa/sql/history/pj0008/`` when pj0009 changed them.

What changes: the jobs that wait (due now or later, for children, for a token) get a row each
in ``postjob.waiting``, whose index of due jobs is all a checkout reads; the checkouts whose
jobs run get a row each in ``postjob.leases``; a limited queue's places and starts are rows
(``postjob.queue_slots``, ``postjob.queue_starts``) that a checkout locks one by one. The
status indexes of ``postjob.postjobs`` go (an ordinary run's two updates become HOT updates),
and its unique key is held by a column its run's end clears. The retry delay comes from the
worker (the workflow's back-off). Durable workflows get their tables (``postjob.steps``,
``postjob.events``, ``postjob.event_waits``) and a job its trace context. ``oldest_served_code`` becomes pj0007: the functions that
release calls keep their signatures (``postjob_sa/sql/compat.sql``); the ones of older releases
go.

Upgrading a live database: the tables are added first (a short exclusive lock), then, in one
short transaction that holds the jobs table (``lock_timeout`` 10 s), the functions and
triggers are replaced and what waits and runs is copied into the new tables; a step that meets
a worker's transaction in a deadlock, or not its lock in time, is tried again. The indexes are
built and dropped CONCURRENTLY afterwards, and the functions no longer served are dropped once
calls that began on them have ended.
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic import _sql_files
from postjob_sa.alembic._steps import index_step, own_transaction_retried, sends_scripts_whole

revision = "pj0008"
down_revision = "pj0007"
branch_labels = None
depends_on = None

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"
NO_BODY_CHECKS = "SET LOCAL check_function_bodies = off"

TABLES_UP = r"""
SET LOCAL lock_timeout = '10s';
ALTER TABLE postjob.postjobs ADD COLUMN IF NOT EXISTS unique_key_held boolean NOT NULL DEFAULT false;
ALTER TABLE postjob.postjobs SET (fillfactor = 50);

CREATE TABLE postjob.waiting (
  job_id            bigint PRIMARY KEY,
  status            postjob.statuses NOT NULL,
  workflow          varchar NOT NULL,
  workflow_version  varchar NOT NULL,
  queue             varchar NOT NULL,
  priority          integer NOT NULL,
  run_at            timestamptz,
  due               boolean NOT NULL,
  timing_out_at     timestamptz,
  CONSTRAINT waiting_status CHECK (status IN ('ready', 'err', 'sleep')),
  CONSTRAINT waiting_due_has_time CHECK (NOT due OR run_at IS NOT NULL)
) WITH (fillfactor = 90);
CREATE INDEX waiting_due_idx ON postjob.waiting
  (workflow, workflow_version, queue, priority DESC, run_at, job_id) WHERE due;
CREATE INDEX waiting_scheduled_idx ON postjob.waiting (workflow, workflow_version, run_at)
  WHERE NOT due AND run_at IS NOT NULL;
CREATE INDEX waiting_timeout_idx ON postjob.waiting (timing_out_at)
  WHERE timing_out_at IS NOT NULL;

CREATE TABLE postjob.leases (
  token       bigint PRIMARY KEY,
  worker_id   bigint,
  expires_at  timestamptz NOT NULL,
  job_ids     bigint[] NOT NULL
);
CREATE INDEX leases_worker_idx ON postjob.leases (worker_id);

CREATE TABLE postjob.queue_slots (
  queue   varchar NOT NULL REFERENCES postjob.queue_limits (queue) ON DELETE CASCADE,
  slot    integer NOT NULL,
  job_id  bigint,
  PRIMARY KEY (queue, slot)
);
CREATE INDEX queue_slots_job_idx ON postjob.queue_slots (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE postjob.queue_starts (
  queue       varchar NOT NULL REFERENCES postjob.queue_limits (queue) ON DELETE CASCADE,
  n           integer NOT NULL,
  started_at  timestamptz,
  PRIMARY KEY (queue, n)
);
CREATE INDEX queue_starts_oldest_idx ON postjob.queue_starts (queue, started_at NULLS FIRST);

ALTER TABLE postjob.postjobs ADD COLUMN IF NOT EXISTS trace_context jsonb;
CREATE TABLE postjob.steps (
  job_id         bigint NOT NULL,
  kind           varchar NOT NULL,
  name           varchar NOT NULL,
  digest         varchar,
  result         jsonb,
  error          varchar,
  error_message  varchar,
  wake_at        timestamptz,
  created_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, kind, name),
  CONSTRAINT steps_kind CHECK (kind IN ('step', 'sleep', 'event'))
);
CREATE TABLE postjob.events (
  id          bigserial PRIMARY KEY,
  key         varchar NOT NULL,
  payload     jsonb,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_key_idx ON postjob.events (key, id);
CREATE TABLE postjob.event_waits (
  job_id      bigint NOT NULL,
  seq         integer NOT NULL,
  key         varchar NOT NULL,
  timeout_at  timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, seq, key)
);
CREATE INDEX event_waits_key_idx ON postjob.event_waits (key);
"""

# Everything waits while the triggers change and what waits and runs is copied (a short
# transaction: DROP TRIGGER needs the jobs table's exclusive lock, taken first so that no
# weaker lock of ours is upgraded behind a worker's; the limits' table next, for its trigger).
TABLES_LOCKED = ("LOCK TABLE postjob.postjobs IN ACCESS EXCLUSIVE MODE;\n"
                 "LOCK TABLE postjob.queue_limits IN SHARE ROW EXCLUSIVE MODE")

TRIGGERS_UP = r"""
DROP TRIGGER postjobs_notify_insert ON postjob.postjobs;
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
CREATE TRIGGER postjobs_removed AFTER DELETE ON postjob.postjobs
  REFERENCING OLD TABLE AS removed
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._jobs_removed();
CREATE TRIGGER postjobs_truncated AFTER TRUNCATE ON postjob.postjobs
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._jobs_truncated();
CREATE TRIGGER queue_limits_permits AFTER INSERT OR UPDATE ON postjob.queue_limits
  FOR EACH ROW EXECUTE FUNCTION postjob._queue_permits();
"""

# A role granted what workers and applications need (`postjob db grant`) gets the same on the
# new tables: its workers go on after the upgrade.
GRANTS_UP = r"""
DO $$
DECLARE
  v_role name;
BEGIN
  FOR v_role IN
    SELECT DISTINCT grantee FROM information_schema.role_table_grants
    WHERE table_schema = 'postjob' AND table_name = 'postjobs' AND privilege_type = 'INSERT'
      AND grantee <> current_user AND grantee <> 'PUBLIC'
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE postjob.waiting, '
                   'postjob.leases, postjob.queue_slots, postjob.queue_starts, postjob.steps, '
                   'postjob.events, postjob.event_waits TO %I', v_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE postjob.events_id_seq TO %I', v_role);
  END LOOP;
END
$$
"""

# What waits and runs now, in the new tables (read through pj0007's partial indexes).
COPY_UP = r"""
UPDATE postjob.postjobs SET unique_key_held = true
WHERE unique_key IS NOT NULL AND status IN ('ready', 'processing', 'sleep', 'err');

INSERT INTO postjob.waiting (job_id, status, workflow, workflow_version, queue, priority, run_at,
                             due, timing_out_at)
SELECT j.id, j.status, j.workflow, j.workflow_version, j.queue, j.priority, t.run_at,
       COALESCE(t.run_at <= statement_timestamp(), false), j.timing_out_at
FROM (SELECT * FROM postjob.postjobs WHERE status IN ('ready', 'err')
      UNION ALL
      SELECT * FROM postjob.postjobs WHERE status = 'sleep') j
CROSS JOIN LATERAL (SELECT CASE WHEN j.status IN ('ready', 'err') AND j.workflow <> '__manual__'
                                THEN COALESCE(j.next_run_at, statement_timestamp()) END
                           AS run_at) t;

INSERT INTO postjob.leases (token, worker_id, expires_at, job_ids)
SELECT lease_token, worker_id, COALESCE(lease_expires_at, statement_timestamp()), ARRAY[id]
FROM postjob.postjobs WHERE status = 'processing';

-- every limit gets its permits (the trigger), the running jobs of a limited queue its places,
-- and the starts pj0007 counted in the period are taken
UPDATE postjob.queue_limits SET updated_at = updated_at;
UPDATE postjob.queue_slots s SET job_id = p.id
FROM (SELECT j.queue, j.id, row_number() OVER (PARTITION BY j.queue ORDER BY j.id) AS k
      FROM postjob.postjobs j JOIN postjob.queue_limits l ON l.queue = j.queue
      WHERE j.status = 'processing') p
WHERE s.queue = p.queue AND s.slot = p.k;
UPDATE postjob.queue_starts s SET started_at = statement_timestamp()
FROM (SELECT l.queue, (SELECT COALESCE(sum(c), 0) FROM unnest(l.rate_slots, l.rate_counts) AS r(n, c)
                       WHERE r.n >= floor((EXTRACT(EPOCH FROM now()) - l.period) / (l.period / 20)))
             AS started
      FROM postjob.queue_limits l WHERE l.rate IS NOT NULL) r
WHERE s.queue = r.queue AND s.n <= r.started;
"""

INDEXES_UP = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS postjobs_unique_key_held_idx "
    "ON postjob.postjobs (unique_key) WHERE unique_key_held",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_errors_idx "
    "ON postjob.postjobs (id) WHERE error IS NOT NULL",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_unique_key_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_runnable_by_group_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_lease_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_timing_out_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_settled_idx",
    "ALTER INDEX postjob.postjobs_unique_key_held_idx RENAME TO postjobs_unique_key_idx",
)

# The functions of releases before pj0007 (oldest_served_code is pj0007 now) and pj0007's own
# checkout helpers.
OLD_FUNCTIONS_DOWN = r"""
DROP FUNCTION IF EXISTS postjob.checkout(text[], text[], text[], integer, double precision,
                                         boolean, boolean);
DROP FUNCTION IF EXISTS postjob.finish_and_checkout(bigint[], bigint[], text[], jsonb[], text[],
  text[], jsonb[], text[], bigint[], text[], text[], text[], integer, double precision, boolean,
  boolean);
DROP FUNCTION IF EXISTS postjob.time_to_next_job(text[], text[], text[]);
DROP FUNCTION IF EXISTS postjob.time_to_next_job_v2(text[], text[], text[]);
DROP FUNCTION IF EXISTS postjob.extend_leases(bigint[], bigint[], double precision);
DROP FUNCTION IF EXISTS postjob._backoff(integer, boolean);
DROP FUNCTION IF EXISTS postjob._lock_due_jobs(text[], text[], text[], integer, text[], bigint[]);
DROP FUNCTION IF EXISTS postjob._due_jobs(text[], text[], text[], integer, text[], text[],
                                          integer[]);
DROP FUNCTION IF EXISTS postjob._queue_allowance(postjob.queue_limits);
DROP FUNCTION IF EXISTS postjob._queue_processing(varchar, bigint[]);
DROP FUNCTION IF EXISTS postjob._runnable_groups(text, text);
DROP FUNCTION IF EXISTS postjob._runnable_queues(text, text, integer);
DROP FUNCTION IF EXISTS postjob._runnable_keys(text[], text[]);
DROP FUNCTION IF EXISTS postjob._notify_workers();
"""


@sends_scripts_whole
def upgrade() -> None:
    # each step meets the running workers' transactions: one that deadlocks with one of theirs,
    # or waits for its locks longer than lock_timeout, is tried again
    own_transaction_retried(TABLES_UP)
    own_transaction_retried("\n;\n".join([LOCK_TIMEOUT, NO_BODY_CHECKS, TABLES_LOCKED,
                                          *_sql_files.functions("pj0008"), TRIGGERS_UP, GRANTS_UP,
                                          COPY_UP]),
                            then_wait=1.0)
    index_step(*INDEXES_UP)
    op.execute(LOCK_TIMEOUT)
    op.execute(OLD_FUNCTIONS_DOWN)


# -- downgrade: back to pj0007 exactly --------------------------------------------------------

INDEXES_DOWN = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_runnable_by_group_idx "
    "ON postjob.postjobs (workflow, workflow_version, priority, queue, next_run_at, id) "
    "WHERE status IN ('ready', 'err')",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_lease_idx "
    "ON postjob.postjobs (lease_expires_at) WHERE status = 'processing'",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_timing_out_idx "
    "ON postjob.postjobs (timing_out_at) "
    "WHERE status IN ('ready', 'err', 'sleep') AND timing_out_at IS NOT NULL",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_settled_idx "
    "ON postjob.postjobs (status, updated_at) INCLUDE (queue) "
    "WHERE status IN ('sleep', 'failed', 'timeout', 'ok')",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS postjobs_unique_key_pj0007_idx "
    "ON postjob.postjobs (unique_key) "
    "WHERE unique_key IS NOT NULL AND status IN ('ready', 'processing', 'sleep', 'err')",
)

NEW_DOWN = r"""
DROP TRIGGER queue_limits_permits ON postjob.queue_limits;
DROP TRIGGER postjobs_truncated ON postjob.postjobs;
DROP TRIGGER postjobs_removed ON postjob.postjobs;
DROP TRIGGER postjobs_added ON postjob.postjobs;
DROP TRIGGER postjobs_fill_ids ON postjob.postjobs;
CREATE TRIGGER postjobs_fill_ids BEFORE INSERT ON postjob.postjobs
  FOR EACH ROW
  WHEN (NEW.root_id IS NULL OR NEW.full_id IS NULL
        OR (NEW.timing_out_at IS NULL AND NEW.timeout IS NOT NULL))
  EXECUTE FUNCTION postjob._fill_job_ids();
CREATE TRIGGER postjobs_notify_insert AFTER INSERT ON postjob.postjobs
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._notify_workers();

-- what pj0008 added
DROP FUNCTION postjob.worker_cycle_v3(bigint, varchar, bigint[], bigint[], jsonb[], text[], jsonb,
                                      bigint[], text[], text[], text[], integer,
                                      double precision, boolean, boolean);
DROP FUNCTION postjob.checkout_v3(bigint, varchar, text[], text[], text[], integer,
                                  double precision, boolean);
DROP FUNCTION postjob.finish_jobs_v3(bigint[], bigint[], jsonb[], text[], jsonb, bigint[]);
DROP FUNCTION postjob.reap_v3(integer);
DROP FUNCTION postjob._take(varchar[], varchar[], varchar[], integer[], bigint, bigint, varchar,
                            double precision);
DROP FUNCTION postjob._due_groups(text[], text[], text[]);
DROP FUNCTION postjob._promote(text[], text[], integer);
DROP FUNCTION postjob._served_keys(text[], text[]);
DROP FUNCTION postjob._permits_free(postjob.queue_limits, integer);
DROP FUNCTION postjob._next_start(postjob.queue_limits);
DROP FUNCTION postjob._period(double precision);
DROP FUNCTION postjob._make_ready(bigint[], postjob.statuses[]);
DROP FUNCTION postjob._ended_early(bigint[]);
DROP FUNCTION postjob._run_may_be_executing(bigint);
DROP FUNCTION postjob._jobs_added();
DROP FUNCTION postjob._jobs_removed();
DROP FUNCTION postjob._jobs_truncated();
DROP FUNCTION postjob._queue_permits();
DROP FUNCTION postjob._permits_max();
DROP FUNCTION postjob.record_step_v1(bigint, bigint, varchar, varchar, varchar, jsonb, varchar,
                                     varchar, double precision, timestamptz);
DROP FUNCTION postjob.wait_event_v1(bigint, bigint, integer, varchar, double precision);
DROP FUNCTION postjob.emit_event_v1(varchar, jsonb);

DROP TABLE postjob.event_waits;
DROP TABLE postjob.events;
DROP TABLE postjob.steps;
ALTER TABLE postjob.postjobs DROP COLUMN trace_context;
DROP TABLE postjob.queue_starts;
DROP TABLE postjob.queue_slots;
DROP TABLE postjob.leases;
DROP TABLE postjob.waiting;
-- pj0007's checkout counts the running jobs and starts itself again
UPDATE postjob.queue_limits SET processing_ids = NULL, rate_slots = '{}', rate_counts = '{}';
ALTER TABLE postjob.postjobs DROP COLUMN unique_key_held;
ALTER INDEX postjob.postjobs_unique_key_pj0007_idx RENAME TO postjobs_unique_key_idx;
ALTER TABLE postjob.postjobs SET (fillfactor = 90);
"""


def downgrade() -> None:
    index_step(*INDEXES_DOWN)
    own_transaction_retried("\n;\n".join([LOCK_TIMEOUT, NO_BODY_CHECKS, TABLES_LOCKED,
                                          _sql_files.frozen("pj0007_functions"), NEW_DOWN]))
    index_step("DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_errors_idx")
