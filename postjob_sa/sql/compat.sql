-- Which code this schema serves besides its own. A worker runs against the schema revision of
-- its own code and the next one ("migrate, then roll the workers"), so the functions the
-- previous release calls keep their signatures here, as thin wrappers of the current ones.
-- They go when the revision that stops serving that release drops them (its file in
-- postjob_sa/sql/retire/ is written ahead). What a revision is and which code it serves are
-- the revision's own functions (schema_version, oldest_served_code: see the revision).

-- The identifier a session's checkouts record as the holder (postjob_sa's own checkouts pass
-- theirs).
CREATE OR REPLACE FUNCTION postjob.set_client_identifier(p_identifier varchar) RETURNS void
LANGUAGE sql AS $$
  SELECT set_config('postjob.client_identifier', p_identifier, false);
$$;

CREATE OR REPLACE FUNCTION postjob._client_identifier() RETURNS varchar
LANGUAGE sql STABLE AS $$
  SELECT NULLIF(current_setting('postjob.client_identifier', true), '')
$$;

-- Reaping, as cron and `postjob reap` call it (and as docs/operations.md grants it).
CREATE OR REPLACE FUNCTION postjob.reap(p_fast_mode boolean DEFAULT false,
                                        p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE sql AS $$
  SELECT postjob.reap_v4(p_limit)
$$;

-- -- pj0008 workers and applications ---------------------------------------------------------

CREATE OR REPLACE FUNCTION postjob.reap_v2(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE sql AS $$
  SELECT postjob.reap_v4(p_limit)
$$;

CREATE OR REPLACE FUNCTION postjob.reap_v3(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE sql AS $$
  SELECT postjob.reap_v4(p_limit)
$$;

-- pj0008's checkout: a worker's (p_worker_id) makes due first when asked; one through the API
-- takes what has come due as checkout_v4 does (and names its holder).
CREATE OR REPLACE FUNCTION postjob.checkout_v3(
  p_worker_id bigint, p_identifier varchar, p_workflows text[], p_versions text[],
  p_queues text[], p_limit integer, p_lease double precision, p_promote boolean)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint,
               attempt integer, max_attempts integer)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY SELECT * FROM postjob.checkout_v4(
    p_worker_id, CASE WHEN p_worker_id IS NULL
                      THEN COALESCE(p_identifier, postjob._client_identifier()) END,
    p_workflows, p_versions, p_queues, p_limit, p_lease, p_worker_id IS NULL, false,
    p_promote AND p_worker_id IS NOT NULL);
END;
$$;

-- pj0008's outcomes: ok ones as arrays, the others as a JSON array of
-- [id, lease_token, kind, result, error, message, backtrace, version, awaiting, retry_in,
-- wake_in]; p_done names lease tokens whose jobs have all ended (a job still held under one
-- was given up by its run).
CREATE OR REPLACE FUNCTION postjob.finish_jobs_v3(
  p_ok_ids bigint[], p_ok_tokens bigint[], p_ok_results jsonb[], p_ok_versions text[],
  p_outcomes jsonb, p_done bigint[])
RETURNS TABLE (kind text, id bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_stopped bigint[];
  v_tokens bigint[];
BEGIN
  RETURN QUERY
  SELECT f.kind, f.id FROM postjob.finish_v4(
    p_ok_ids, p_ok_tokens, p_ok_results, p_ok_versions,
    ARRAY(SELECT (e->>0)::bigint FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT (e->>1)::bigint FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT e->>2 FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT e->>4 FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT e->>5 FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT NULLIF(e->6, 'null'::jsonb) FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT e->>7 FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT (e->>8)::bigint FROM jsonb_array_elements(p_outcomes) e),
    ARRAY(SELECT (CASE WHEN e->>2 = 'err' THEN e->>9 ELSE e->>10 END)::float8
          FROM jsonb_array_elements(p_outcomes) e),
    '{}', '{}') f;
  IF cardinality(p_done) > 0 THEN
    SELECT array_agg(u.job_id ORDER BY u.job_id), array_agg(u.lease_token ORDER BY u.job_id)
      INTO v_stopped, v_tokens FROM postjob.unfinished u WHERE u.lease_token = ANY (p_done);
    IF v_stopped IS NOT NULL THEN
      PERFORM postjob.finish_v4('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}',
                                '{}', '{}', v_stopped, v_tokens);
    END IF;
  END IF;
END;
$$;

-- pj0008's cycle: its outcomes, reaping and making due when asked, then its checkout.
CREATE OR REPLACE FUNCTION postjob.worker_cycle_v3(
  p_worker_id bigint, p_identifier varchar, p_ok_ids bigint[], p_ok_tokens bigint[],
  p_ok_results jsonb[], p_ok_versions text[], p_outcomes jsonb, p_done bigint[],
  p_workflows text[], p_versions text[], p_queues text[], p_limit integer,
  p_lease double precision, p_reap boolean, p_promote boolean)
RETURNS TABLE (kind text, id bigint, lease_token bigint, workflow varchar,
               workflow_version varchar, args jsonb, queue varchar, root_id bigint,
               full_id varchar, parent_id bigint, attempt integer, max_attempts integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(p_ok_ids) > 0 OR jsonb_array_length(p_outcomes) > 0
     OR cardinality(p_done) > 0 THEN
    RETURN QUERY
    SELECT f.kind, f.id, NULL::bigint, NULL::varchar, NULL::varchar, NULL::jsonb,
           NULL::varchar, NULL::bigint, NULL::varchar, NULL::bigint, NULL::integer,
           NULL::integer
    FROM postjob.finish_jobs_v3(p_ok_ids, p_ok_tokens, p_ok_results, p_ok_versions,
                                p_outcomes, p_done) f;
  END IF;
  IF p_reap THEN
    PERFORM postjob.reap_v4();
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY
    SELECT 'job'::text, c.id, c.lease_token, c.workflow, c.workflow_version, c.args, c.queue,
           c.root_id, c.full_id, c.parent_id, c.attempt, c.max_attempts
    FROM postjob.checkout_v3(p_worker_id, p_identifier, p_workflows, p_versions, p_queues,
                             p_limit, p_lease, p_promote) c;
  ELSIF p_promote THEN
    PERFORM postjob._promote(p_workflows, p_versions);
  END IF;
END;
$$;

-- pj0008's idle wait (its workers listen on postjob_notifications only: they are not marked
-- waiting, and a wake-up that finds no marked worker tells them all).
CREATE OR REPLACE FUNCTION postjob.worker_idle(
  p_workflows text[], p_versions text[], p_queues text[], p_reap boolean)
RETURNS double precision LANGUAGE sql AS $$
  SELECT postjob.worker_idle_v2(NULL, p_workflows, p_versions, p_queues, p_reap)
$$;

-- -- pj0008 to pj0010 workers ---------------------------------------------------------------

-- Their registration, which does not say the versions of their workflows: such a worker is
-- taken to serve every version (see _serves).
CREATE OR REPLACE FUNCTION postjob.register_worker(
  p_identifier varchar, p_lease double precision, p_code_revision varchar,
  p_workflows text[], p_queues text[])
RETURNS bigint LANGUAGE sql AS $$
  SELECT postjob.register_worker_v2(p_identifier, p_lease, p_code_revision, p_workflows, NULL,
                                    p_queues)
$$;
