-- The postjob schema as it is now: its tables, indexes, constraints and triggers.
--
-- The revisions in postjob_sa/alembic/versions build this step by step, and a test compares a
-- database migrated to head with this file. The functions are in the other files of this folder
-- (README.md there says how a change to one is made).
--
-- Storage, in one paragraph. postjob.postjobs is the record of every job: one wide row that a
-- job keeps for its whole life, written when the job is enqueued and when a run of it ends
-- (and by operator commands), never when a worker checks it out. What the scheduler looks up
-- lives in one narrow row per unfinished job, postjob.unfinished: where the job stands in its
-- queue (due now, due later, waiting for children, an event or a person) and, while it runs,
-- its lease (token, worker, expiry) as columns of that row. A checkout is one UPDATE of those
-- rows; a run that ends ok deletes its row and settles the record once (a HOT update: no
-- index of the record covers what changes). Finished jobs are only in postjob.postjobs:
-- whatever their number, checkout never reads them. The status of a running job is derived:
-- 'processing' while its row holds a lease (postjob.jobs, the view SQL readers use, and the
-- Job model say so); the record keeps the status the job had before the run.
--
-- Lock order. Every function that locks rows of more than one job takes them in this order,
-- so that no two of them wait for each other in a circle:
--   1. an event key's bucket (postjob.event_keys), emits and waits alike;
--   2. rows of postjob.unfinished, by ascending job id. A run's outcome locks its own rows and
--      takes its family's (parent, descendants) only with SKIP LOCKED: what it cannot take
--      now is told later (postjob.wakeups), so an outcome never waits for another job;
--   3. records (postjob.postjobs), by ascending id, after the unfinished rows of those jobs;
--   4. a queue's limit (postjob.queue_limits), then its places (postjob.queue_slots) and
--      starts (postjob.queue_starts) by number;
--   5. steps and event waits (postjob.steps, postjob.event_waits) of jobs locked above;
--   6. the backend's own rows of postjob.settled_counts, last: no other transaction writes
--      them (the upkeep's fold takes only closed minutes, with SKIP LOCKED), so a count never
--      waits, and nothing waits for one.
-- A checkout never waits for a row: it takes job rows, places and starts with SKIP LOCKED.
-- The rotation of history (history.sql) runs one at a time (an advisory lock) and takes only
-- table locks, with a 5 s lock_timeout (one it cannot have is `busy` in its report, never an
-- error): it never holds a row lock. It takes them as every statement does, the partitioned
-- table before its partitions: the record alone (LOCK TABLE ONLY postjob.postjobs; ACCESS
-- EXCLUSIVE to narrow, drop or compact ranges, SHARE ROW EXCLUSIVE to create one: writes
-- wait, reads go on), then the default partition, then a range; and it decides what to do
-- with a range only once those are granted. Under SHARE ROW EXCLUSIVE it takes the default
-- partition with NOWAIT: a reader holds it and may go on to write the record, so it lets
-- the record go (its subtransaction undone) and tries both again, 5 s at most.
-- The one order a function cannot always keep is a tree that grows while it is cancelled or
-- reset (a descendant spawned meanwhile has a later id than rows already locked): those
-- functions try again when PostgreSQL reports a deadlock, so none reaches a caller.

CREATE SCHEMA postjob;

-- The state vocabulary (postjob_sa.Status says the same in Python). ok, failed, timeout and
-- cancelled are final.
CREATE TYPE postjob.statuses AS ENUM (
  'ready', 'processing', 'sleep', 'failed', 'err', 'timeout', 'ok', 'cancelled');

-- Every checkout draws one token; each job it hands out carries it while it runs, and every
-- write of the run is fenced on it (a run that lost its job can no longer write).
CREATE SEQUENCE postjob.lease_tokens;

-- The record is partitioned by ranges of job id (history.sql creates and drops the ranges;
-- postjob.history_settings says how wide they are and how long a finished job is kept): a
-- lookup by id touches one partition, and a parent's children have later ids than the parent.
-- A partitioned table holds no unique index without its key, and no foreign key that a drop
-- of a partition would have to check: a job's children go with it by a trigger
-- (_jobs_removed), and the run that holds a parent's lease keeps its children one per
-- (workflow, method, args) (spawn_children).
CREATE TABLE postjob.postjobs (
  id                            bigserial PRIMARY KEY,
  -- the job that spawned it: checked by the insert trigger (jobs.sql)
  parent_id                     bigint,
  root_id                       bigint,
  full_id                       varchar,
  created_at                    timestamptz NOT NULL DEFAULT now(),
  updated_at                    timestamptz NOT NULL DEFAULT now(),
  queue                         varchar NOT NULL DEFAULT 'q',
  workflow                      varchar NOT NULL,
  workflow_method               varchar NOT NULL DEFAULT 'run',
  workflow_version              varchar NOT NULL DEFAULT '',
  args                          jsonb NOT NULL DEFAULT '[]'::jsonb,
  status                        postjob.statuses NOT NULL DEFAULT 'ready',
  next_run_at                   timestamptz DEFAULT now(),
  timeout                       double precision,
  timing_out_at                 timestamptz,
  failed_attempts               integer NOT NULL DEFAULT 0,
  max_attempts                  integer NOT NULL DEFAULT 5,
  results                       jsonb,
  error                         varchar,
  error_message                 varchar,
  error_backtrace               jsonb,
  workflow_status               varchar,
  tags                          jsonb,
  awaiting_id                   bigint,
  -- who holds the job, when a checkout through the API (JobQueue.checkout, a transactional
  -- job) took it; a worker's checkout writes nothing here (postjob.unfinished has the lease)
  processing_client             varchar,
  processing_client_identifier  varchar,
  processing_started_at         timestamptz,
  processing_max_duration       double precision,
  -- retired: the lease as pj0008 kept it, NULL since pj0009 (a write of these is a call of
  -- that release's code that began before the upgrade: refused, see jobs.sql)
  lease_expires_at              timestamptz,
  lease_token                   bigint,
  worker_id                     bigint,
  priority                      integer NOT NULL DEFAULT 0,
  unique_key                    varchar,
  -- true while the job is unfinished and has a unique_key (the key itself is held by its row
  -- in postjob.unfinished)
  unique_key_held               boolean NOT NULL DEFAULT false,
  -- the W3C trace context of the enqueue ({"traceparent": ..., "tracestate": ...}), when
  -- OpenTelemetry traced it; a child gets its parent's: a job tree is one trace
  trace_context                 jsonb,
  -- the statement that inserted the job also wrote its row in postjob.unfinished (postjob_sa's
  -- enqueue does, in one statement); false: the insert trigger writes it
  queued                        boolean NOT NULL DEFAULT false,
  CONSTRAINT postjobs_args_array CHECK (jsonb_typeof(args) = 'array'),
  CONSTRAINT postjobs_tags_object CHECK (tags IS NULL OR jsonb_typeof(tags) = 'object'),
  CONSTRAINT postjobs_max_attempts_positive CHECK (max_attempts >= 1),
  CONSTRAINT postjobs_timeout_positive CHECK (timeout IS NULL OR timeout > 0)
) PARTITION BY RANGE (id);

-- a parent's children, by (workflow, method, args): what spawn looks up
CREATE INDEX postjobs_children_idx
  ON postjob.postjobs (parent_id, workflow, workflow_method, md5(args::text))
  WHERE parent_id IS NOT NULL;
-- trees (children only: a root is found by its id)
CREATE INDEX postjobs_tree_idx ON postjob.postjobs (root_id, full_id text_pattern_ops)
  WHERE parent_id IS NOT NULL;
CREATE INDEX postjobs_tags_idx ON postjob.postjobs USING gin (tags jsonb_path_ops)
  WHERE tags IS NOT NULL;
-- the jobs with an error: failed, timed out, cancelled, or waiting for a retry (an ok run
-- leaves error NULL, so it never touches this index)
CREATE INDEX postjobs_errors_idx ON postjob.postjobs (id) WHERE error IS NOT NULL;

-- The first range (a database upgraded from pj0009 has its record there, up to the first
-- million ids past its last one), and the default partition: a job whose range is not there
-- yet (the rotation fell behind) is kept there until the rotation moves it into its range.
-- Open ranges keep half their pages free, so a job's updates stay on its page (HOT).
CREATE TABLE postjob.postjobs_from_0 PARTITION OF postjob.postjobs
  FOR VALUES FROM (MINVALUE) TO (1000000) WITH (fillfactor = 50);
CREATE TABLE postjob.postjobs_default PARTITION OF postjob.postjobs DEFAULT
  WITH (fillfactor = 50);

-- How history is kept (JobQueue.set_history): one row, or none for the defaults (ranges of
-- 1,000,000 ids, finished jobs kept for ever).
CREATE TABLE postjob.history_settings (
  id              boolean PRIMARY KEY DEFAULT true,
  keep            interval,
  partition_size  bigint NOT NULL DEFAULT 1000000,
  updated_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT history_settings_one_row CHECK (id),
  CONSTRAINT history_settings_keep_positive CHECK (keep IS NULL OR keep > interval '0'),
  CONSTRAINT history_settings_partition_size CHECK (partition_size >= 1000)
);

-- What the rotation found of each range of the record: its newest settle (the latest
-- updated_at of its jobs, read once it holds no unfinished job, and again before its drop).
CREATE TABLE postjob.history_partitions (
  name           varchar PRIMARY KEY,
  newest_settle  timestamptz,
  checked_at     timestamptz NOT NULL DEFAULT now()
);

-- One row per unfinished job: ready, err, sleep (waiting for its children, an event, a time or a
-- person), or running (it holds a lease). It goes when the job's last run has ended: with the
-- outcome that settles it, or, for a job ended from outside while it ran (cancelled, or timed
-- out by a failed ancestor), when that run has stopped; until then the row keeps the lease,
-- with the final status, so that the job's place in a limited queue and reset's refusal hold.
-- workflow, workflow_version, queue, priority and parent_id are the job's.
CREATE TABLE postjob.unfinished (
  job_id            bigint PRIMARY KEY,
  -- ready, err or sleep: what the job waits as (a running job keeps the one it was taken in)
  status            postjob.statuses NOT NULL,
  workflow          varchar NOT NULL,
  workflow_version  varchar NOT NULL,
  queue             varchar NOT NULL,
  priority          integer NOT NULL,
  -- when it may run: NULL while it waits for children, an event or a token
  run_at            timestamptz,
  -- checkout may take it now (run_at has come; workers set it when it comes)
  due               boolean NOT NULL,
  timing_out_at     timestamptz,
  parent_id         bigint,
  -- the unique key the job holds while it is unfinished
  unique_key        varchar,
  -- the lease of its run: every write of the run is fenced on the token
  lease_token       bigint,
  -- the worker that holds the lease (as long as it beats), or NULL: a checkout through the
  -- API, held until lease_expires_at
  worker_id         bigint,
  lease_expires_at  timestamptz,
  started_at        timestamptz,
  -- who holds a lease taken through the API (a worker is named by its row)
  holder            varchar,
  -- something the running job may wait for happened while it ran (a child ended, an event
  -- came): the sleep its run ends with finds it woken
  woken             boolean NOT NULL DEFAULT false,
  CONSTRAINT unfinished_due_has_time CHECK (NOT due OR run_at IS NOT NULL),
  CONSTRAINT unfinished_lease CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 80);

-- checkout: the due jobs of one (workflow, version, queue), highest priority, then earliest
CREATE INDEX unfinished_due_idx ON postjob.unfinished
  (workflow, workflow_version, queue, priority DESC, run_at, job_id)
  WHERE due AND lease_token IS NULL;
-- the jobs whose time has not come, by when it comes (made due by the workers that run them)
CREATE INDEX unfinished_scheduled_idx ON postjob.unfinished (workflow, workflow_version, run_at)
  WHERE NOT due AND run_at IS NOT NULL AND lease_token IS NULL;
-- deadlines (a job waiting past its deadline times out; a running one is not cut short)
CREATE INDEX unfinished_timeout_idx ON postjob.unfinished (timing_out_at)
  WHERE timing_out_at IS NOT NULL AND lease_token IS NULL;
-- the leases, by holder (heartbeats and the reaper)
CREATE INDEX unfinished_leased_idx ON postjob.unfinished (worker_id, lease_expires_at)
  WHERE lease_token IS NOT NULL;
-- one unfinished job per unique key
CREATE UNIQUE INDEX unfinished_unique_key_idx ON postjob.unfinished (unique_key)
  WHERE unique_key IS NOT NULL;

-- Jobs that reached a final state whose families are still to be told (their parents woken
-- or marked, their descendants ended): a run's outcome tells them at once, unless another
-- transaction holds one of their rows; then they wait here for the next promotion
-- (postjob._tell_pending), and a parent's sleep finds itself woken by its child's row here.
CREATE TABLE postjob.wakeups (
  job_id      bigint PRIMARY KEY,
  failed      boolean NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- Jobs settled (reached ok, failed, timeout or cancelled), per minute, queue and status: what
-- the dashboard's last hour reads (at most 60 minutes of rows), instead of the jobs settled in
-- it. Whatever settles jobs adds them here in one statement per batch (_count_settled), to
-- rows of its own backend (shard: its pid), which no other transaction writes: a count never
-- waits for another transaction's. The upkeep folds the rows of closed minutes into one row
-- each (shard 0) and drops the minutes past two hours (_settled_counts_fold). A job reset and
-- settled again is counted again: these are settlements, not the jobs' statuses now.
CREATE TABLE postjob.settled_counts (
  minute  timestamptz NOT NULL,
  queue   varchar NOT NULL,
  status  postjob.statuses NOT NULL,
  shard   integer NOT NULL,
  n       bigint NOT NULL,
  PRIMARY KEY (minute, queue, status, shard)
) WITH (fillfactor = 50);

-- The narrow tables of pj0008, kept empty while workers of that release may still run: a
-- call of theirs that began before the upgrade and writes them is refused with a
-- serialization failure (its worker tries again, and then reaches this revision's functions;
-- see _stale_call in jobs.sql). They go with the revision that stops serving pj0008.
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
CREATE TABLE postjob.leases (
  token       bigint PRIMARY KEY,
  worker_id   bigint,
  expires_at  timestamptz NOT NULL,
  job_ids     bigint[] NOT NULL
);

CREATE TABLE postjob.tokens (
  id          bigserial PRIMARY KEY,
  -- the job (removed with it: _jobs_removed, and a dropped range's)
  postjob_id  bigint NOT NULL UNIQUE,
  token       uuid NOT NULL UNIQUE,
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per running worker, kept alive by its heartbeat.
CREATE TABLE postjob.workers (
  id             bigserial PRIMARY KEY,
  identifier     varchar NOT NULL,
  started_at     timestamptz NOT NULL DEFAULT now(),
  heartbeat_at   timestamptz NOT NULL DEFAULT now(),
  expires_at     timestamptz NOT NULL,
  code_revision  varchar NOT NULL,
  workflows      text[] NOT NULL DEFAULT '{}',
  queues         text[],
  -- since when the worker waits for work (it listens on postjob_worker_<id>): a new job
  -- wakes the worker waiting longest among those that serve it, and clears this
  waiting_since  timestamptz,
  -- the version of each of its workflows, in the order of workflows (NULL: not said, by a
  -- worker of an earlier release: it is taken to serve every version)
  workflow_versions  text[],
  -- the server process of the worker's own connection, when it is direct (not through a
  -- pooler): once that process has gone from pg_stat_activity (the pid, or a new process
  -- under the same pid: backend_start), the worker is dead and its jobs are rescued at once
  backend_pid    integer,
  backend_start  timestamptz
);

-- A queue's limits. rate_slots, rate_counts and processing_ids are what the checkout of
-- pj0004 to pj0007 kept; they are left for workers of that release and unused since.
CREATE TABLE postjob.queue_limits (
  queue           varchar PRIMARY KEY,
  concurrency     integer,
  rate            integer,
  period          double precision NOT NULL DEFAULT 1,
  rate_slots      bigint[] NOT NULL DEFAULT '{}',
  rate_counts     integer[] NOT NULL DEFAULT '{}',
  updated_at      timestamptz NOT NULL DEFAULT now(),
  processing_ids  bigint[],
  CONSTRAINT queue_limits_concurrency_range CHECK (concurrency IS NULL OR concurrency >= 0),
  CONSTRAINT queue_limits_rate_range CHECK (rate IS NULL OR rate >= 0),
  CONSTRAINT queue_limits_period_positive CHECK (period > 0)
);

-- A limited queue's places: a job takes a free one (job_id NULL) when it is checked out and
-- gives it back when its run ends. Checkout locks the places it takes with SKIP LOCKED, so
-- checkouts of several transactions (a transactional job's lasts as long as the job) never
-- share one, and no checkout waits for another. The places and starts of a queue go with its
-- limit (_queue_permits_removed), not by a foreign key: a key's check would lock the limit
-- after the places when a transaction writes a place twice (a checkout, then the end of its
-- run), against the order above, and meet a change of the limit in a deadlock.
CREATE TABLE postjob.queue_slots (
  queue   varchar NOT NULL,
  slot    integer NOT NULL,
  job_id  bigint,
  PRIMARY KEY (queue, slot)
);
CREATE INDEX queue_slots_job_idx ON postjob.queue_slots (job_id) WHERE job_id IS NOT NULL;

-- A rate-limited queue's starts: one row per start allowed in a period, free again once its
-- last start is a period old. A time, not a count: changing the period never strands a start.
CREATE TABLE postjob.queue_starts (
  queue       varchar NOT NULL,
  n           integer NOT NULL,
  started_at  timestamptz,
  PRIMARY KEY (queue, n)
);
CREATE INDEX queue_starts_oldest_idx ON postjob.queue_starts (queue, started_at NULLS FIRST);

-- Autovacuum, per table (a server keeps its defaults for the rest). The hot tables churn at
-- the queue's rate while holding only the work in flight: vacuumed after a number of dead
-- rows, not a fraction of a size that says nothing of their churn (after a backlog, a 0.2
-- scale factor waits for a fifth of it), unthrottled (they are small; a throttled VACUUM of a
-- swollen one lets dead rows pile up while it sleeps), their indexes always cleaned (what
-- checkouts read; PostgreSQL skips that when few pages hold dead rows, as after a backlog).
-- The record's ranges are vacuumed and analyzed after 2% of them changed: a visit keeps an
-- open one near 400 bytes a job, and its statistics are what the workers' generic plans are
-- made from (history.sql sets the same on every range it creates).
-- (Measured by bench/soak.py: docs/operations.md, "Hot tables".)
ALTER TABLE postjob.unfinished SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0,
  vacuum_index_cleanup = on);
ALTER TABLE postjob.queue_slots SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE postjob.queue_starts SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE postjob.settled_counts SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE postjob.postjobs_from_0 SET (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE postjob.postjobs_default SET (autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- Periodic workflows, declared in code (@workflow(cron=...) or @workflow(every=...)) and
-- written here by the workers that register them. last_tick_at is the last tick handled
-- (enqueued or skipped); a tick is claimed by moving it forward with a conditional UPDATE.
CREATE TABLE postjob.schedules (
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

-- Durable workflows (durable.sql). A job's steps: what its runs did that its re-runs must not
-- do again. kind 'step': a step(name, fn, ...) call, by its name, with its result or the
-- non-recoverable error it raised; 'sleep': the run's n-th sleep (name n) and when it ends;
-- 'event': the run's n-th wait for an event (name n), its key (digest) and the event's
-- payload it got, or its timeout (error EventTimeout). digest is what a step was called with
-- (md5 of its arguments' JSON), to tell when a re-run calls it with others. Removed with
-- their job (jobs.sql).
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

-- The locks of event keys: a key's emits and waits update its bucket's row (one of 4096, by the
-- key's hash) before anything else, so that they see each other (durable.sql).
CREATE TABLE postjob.event_keys (
  bucket   integer PRIMARY KEY,
  changes  bigint NOT NULL DEFAULT 0,
  CONSTRAINT event_keys_bucket CHECK (bucket BETWEEN 0 AND 4095)
);

-- Events (JobQueue.emit_event): a wait gets the first one under its key.
CREATE TABLE postjob.events (
  id          bigserial PRIMARY KEY,
  key         varchar NOT NULL,
  payload     jsonb,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_key_idx ON postjob.events (key, id);

-- The jobs waiting for an event: the seq-th wait of a job's run, for key, until timeout_at
-- (NULL: no deadline). An emit under the key removes them and wakes their jobs; removed with
-- their job (jobs.sql).
CREATE TABLE postjob.event_waits (
  job_id      bigint NOT NULL,
  seq         integer NOT NULL,
  key         varchar NOT NULL,
  timeout_at  timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, seq, key)
);
CREATE INDEX event_waits_key_idx ON postjob.event_waits (key);

-- Whatever inserts a job: its ids, deadline and key are filled in row by row, and, unless the
-- inserting statement queued it itself (postjob_sa's enqueue, spawn and schedule ticks do),
-- its row in postjob.unfinished is written and an idle worker woken, row by row (jobs.sql).
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
-- what only an earlier release's function bodies write (see _stale_call): refused
CREATE TRIGGER postjobs_retired_lease BEFORE UPDATE OF lease_token, lease_expires_at, worker_id
  ON postjob.postjobs FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call();
CREATE TRIGGER waiting_retired BEFORE INSERT OR UPDATE OR DELETE ON postjob.waiting
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call();
CREATE TRIGGER leases_retired BEFORE INSERT OR UPDATE ON postjob.leases
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._stale_call();
-- a limit's places and starts follow its numbers
CREATE TRIGGER queue_limits_permits AFTER INSERT OR UPDATE ON postjob.queue_limits
  FOR EACH ROW EXECUTE FUNCTION postjob._queue_permits();
CREATE TRIGGER queue_limits_removed AFTER DELETE ON postjob.queue_limits
  FOR EACH ROW EXECUTE FUNCTION postjob._queue_permits_removed();
CREATE TRIGGER queue_limits_truncated AFTER TRUNCATE ON postjob.queue_limits
  FOR EACH STATEMENT EXECUTE FUNCTION postjob._queue_permits_removed();

-- The jobs as SQL readers see them (postjob ps, the dashboard, an app's own queries): the
-- record, with the status and lease of a running job, and when a waiting one may run, from
-- its row in postjob.unfinished.
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
LEFT JOIN postjob.workers w ON w.id = u.worker_id;
