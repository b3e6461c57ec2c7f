-- The postjob schema as it is now: its tables, indexes, constraints and triggers.
--
-- The revisions in postjob_sa/alembic/versions build this step by step, and a test compares a
-- database migrated to head with this file. The functions are in the other files of this folder.
--
-- Storage, in one paragraph. postjob.postjobs is the record of every job: one wide row that a
-- job keeps for its whole life. Its indexes are on columns a run never changes (id, parent,
-- tree, tags, unique key, errors), so the two updates of an ordinary run (checked out, then
-- ok) are HOT updates: the new row version goes on the same page and no index is touched
-- (hence the fillfactor). What the scheduler looks up lives in narrow tables of their own:
-- postjob.waiting has one row per job that waits (to run, now or later; for its children; for
-- a token), postjob.leases one row per checkout while its jobs run, and the limits of a queue
-- are rows that a checkout locks one by one (postjob.queue_slots, postjob.queue_starts).
-- Finished jobs are only in postjob.postjobs: whatever their number, checkout never reads them.

CREATE SCHEMA postjob;

-- The state vocabulary (postjob_sa.Status says the same in Python). ok, failed, timeout and
-- cancelled are final.
CREATE TYPE postjob.statuses AS ENUM (
  'ready', 'processing', 'sleep', 'failed', 'err', 'timeout', 'ok', 'cancelled');

-- Every checkout draws one token; each job it hands out carries it while it runs, and every
-- write of the run is fenced on it (a run that lost its job can no longer write).
CREATE SEQUENCE postjob.lease_tokens;

CREATE TABLE postjob.postjobs (
  id                            bigserial PRIMARY KEY,
  parent_id                     bigint REFERENCES postjob.postjobs (id) ON DELETE CASCADE,
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
  processing_client             varchar,
  processing_client_identifier  varchar,
  processing_started_at         timestamptz,
  processing_max_duration       double precision,
  lease_expires_at              timestamptz,
  lease_token                   bigint,
  worker_id                     bigint,
  priority                      integer NOT NULL DEFAULT 0,
  unique_key                    varchar,
  -- true while the job is unfinished and has a unique_key: it holds the key
  unique_key_held               boolean NOT NULL DEFAULT false,
  -- the W3C trace context of the enqueue ({"traceparent": ..., "tracestate": ...}), when
  -- OpenTelemetry traced it; a child gets its parent's: a job tree is one trace
  trace_context                 jsonb,
  CONSTRAINT postjobs_args_array CHECK (jsonb_typeof(args) = 'array'),
  CONSTRAINT postjobs_tags_object CHECK (tags IS NULL OR jsonb_typeof(tags) = 'object'),
  CONSTRAINT postjobs_max_attempts_positive CHECK (max_attempts >= 1),
  CONSTRAINT postjobs_timeout_positive CHECK (timeout IS NULL OR timeout > 0),
  CONSTRAINT postjobs_lease_while_processing
    CHECK ((status = 'processing') = (lease_token IS NOT NULL))
) WITH (fillfactor = 50);

-- one child per (parent, workflow, method, args); also serves parent_id lookups
CREATE UNIQUE INDEX postjobs_child_key_idx
  ON postjob.postjobs (parent_id, workflow, workflow_method, md5(args::text))
  WHERE parent_id IS NOT NULL;
-- trees (children only: a root is found by its id)
CREATE INDEX postjobs_tree_idx ON postjob.postjobs (root_id, full_id text_pattern_ops)
  WHERE parent_id IS NOT NULL;
CREATE INDEX postjobs_tags_idx ON postjob.postjobs USING gin (tags jsonb_path_ops)
  WHERE tags IS NOT NULL;
-- one unfinished job per unique key
CREATE UNIQUE INDEX postjobs_unique_key_idx ON postjob.postjobs (unique_key)
  WHERE unique_key_held;
-- the jobs with an error: failed, timed out, cancelled, or waiting for a retry (an ok run
-- leaves error NULL, so it never touches this index)
CREATE INDEX postjobs_errors_idx ON postjob.postjobs (id) WHERE error IS NOT NULL;

-- One row per job that waits: to be run (ready or err; due now or at run_at), for its
-- children (sleep), or for a person (a manual step: ready, no run_at). Checkout deletes the
-- row of each job it hands out; a run that ends unfinished puts it back. workflow,
-- workflow_version, queue and priority are the job's.
CREATE TABLE postjob.waiting (
  job_id            bigint PRIMARY KEY,
  status            postjob.statuses NOT NULL,
  workflow          varchar NOT NULL,
  workflow_version  varchar NOT NULL,
  queue             varchar NOT NULL,
  priority          integer NOT NULL,
  -- when it may run: NULL while it waits for children or for a token
  run_at            timestamptz,
  -- checkout may take it now (run_at has come; workers set it when it comes)
  due               boolean NOT NULL,
  timing_out_at     timestamptz,
  CONSTRAINT waiting_status CHECK (status IN ('ready', 'err', 'sleep')),
  CONSTRAINT waiting_due_has_time CHECK (NOT due OR run_at IS NOT NULL)
) WITH (fillfactor = 90);

-- checkout: the due jobs of one (workflow, version, queue), highest priority, then earliest
CREATE INDEX waiting_due_idx ON postjob.waiting
  (workflow, workflow_version, queue, priority DESC, run_at, job_id) WHERE due;
-- the jobs whose time has not come, by when it comes (made due by the workers that run them)
CREATE INDEX waiting_scheduled_idx ON postjob.waiting (workflow, workflow_version, run_at)
  WHERE NOT due AND run_at IS NOT NULL;
-- deadlines (a job waiting past its deadline times out)
CREATE INDEX waiting_timeout_idx ON postjob.waiting (timing_out_at)
  WHERE timing_out_at IS NOT NULL;

-- One row per checkout whose jobs may still be running: the token they carry, the worker that
-- holds them (NULL: a checkout through the API, held until expires_at) and their ids. A
-- worker's lease lasts as long as its heartbeat; the worker deletes the row when its jobs have
-- ended, the reaper when the worker has gone.
CREATE TABLE postjob.leases (
  token       bigint PRIMARY KEY,
  worker_id   bigint,
  expires_at  timestamptz NOT NULL,
  job_ids     bigint[] NOT NULL
);
CREATE INDEX leases_worker_idx ON postjob.leases (worker_id);

CREATE TABLE postjob.tokens (
  id          bigserial PRIMARY KEY,
  postjob_id  bigint NOT NULL UNIQUE REFERENCES postjob.postjobs (id) ON DELETE CASCADE,
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
  queues         text[]
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
-- share one, and no checkout waits for another.
CREATE TABLE postjob.queue_slots (
  queue   varchar NOT NULL REFERENCES postjob.queue_limits (queue) ON DELETE CASCADE,
  slot    integer NOT NULL,
  job_id  bigint,
  PRIMARY KEY (queue, slot)
);
CREATE INDEX queue_slots_job_idx ON postjob.queue_slots (job_id) WHERE job_id IS NOT NULL;

-- A rate-limited queue's starts: one row per start allowed in a period, free again once its
-- last start is a period old. A time, not a count: changing the period never strands a start.
CREATE TABLE postjob.queue_starts (
  queue       varchar NOT NULL REFERENCES postjob.queue_limits (queue) ON DELETE CASCADE,
  n           integer NOT NULL,
  started_at  timestamptz,
  PRIMARY KEY (queue, n)
);
CREATE INDEX queue_starts_oldest_idx ON postjob.queue_starts (queue, started_at NULLS FIRST);

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

-- Whatever inserts a job (JobQueue.enqueue, session.add(Job(...)), a spawn, a schedule's tick):
-- its ids, deadline and key are filled in row by row, and its waiting row is written and the
-- workers are woken once per statement (jobs.sql).
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
-- a limit's places and starts follow its numbers
CREATE TRIGGER queue_limits_permits AFTER INSERT OR UPDATE ON postjob.queue_limits
  FOR EACH ROW EXECUTE FUNCTION postjob._queue_permits();
