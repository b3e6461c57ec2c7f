-- What this schema is and which code it serves. A worker runs against the schema revision of
-- its own code and the next one ("migrate, then roll the workers"), so the functions the
-- previous release calls keep their signatures here, as thin wrappers of the current ones.
-- They go when oldest_served_code moves past that release.

CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0008'::text $$;

-- The oldest code revision whose workers may run against this schema.
CREATE OR REPLACE FUNCTION postjob.oldest_served_code() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0007'::text $$;

-- The identifier a session's checkouts record as the worker's (postjob_sa's own checkouts
-- pass theirs).
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
  SELECT postjob.reap_v3(p_limit)
$$;

-- -- pj0007 workers ----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION postjob.reap_v2(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE sql AS $$
  SELECT postjob.reap_v3(p_limit)
$$;

-- pj0007's checkout: as checkout_v3 (promoting first, as the pj0007 checkout took the jobs
-- whose time had come).
CREATE OR REPLACE FUNCTION postjob.checkout_v2(
  p_worker_id bigint, p_identifier varchar, p_workflows text[], p_versions text[],
  p_queues text[], p_limit integer, p_lease double precision)
RETURNS TABLE (id bigint, lease_token bigint, workflow varchar, workflow_version varchar,
               args jsonb, queue varchar, root_id bigint, full_id varchar, parent_id bigint)
LANGUAGE sql AS $$
  SELECT c.id, c.lease_token, c.workflow, c.workflow_version, c.args, c.queue, c.root_id,
         c.full_id, c.parent_id
  FROM postjob.checkout_v3(p_worker_id, p_identifier, p_workflows, p_versions, p_queues,
                           p_limit, p_lease, true) c
$$;

-- pj0007's outcomes, as parallel arrays, with the retry delay the pj0007 release used (its
-- policy, kept for its workers: 10 s, or 0.01 s in fast mode, times 1.5 ** attempts). The
-- leases whose jobs have all ended go. Returns the ids recorded.
CREATE OR REPLACE FUNCTION postjob.finish_jobs(
  p_ids bigint[], p_lease_tokens bigint[], p_outcomes text[], p_results jsonb[],
  p_errors text[], p_messages text[], p_backtraces jsonb[], p_versions text[],
  p_awaiting bigint[], p_fast_mode boolean DEFAULT false)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_lost bigint[];
BEGIN
  SELECT array_agg(f.id) FILTER (WHERE f.kind = 'lost') INTO v_lost
  FROM postjob.finish_jobs_v3(
    '{}', '{}', '{}', '{}',
    COALESCE((
      SELECT jsonb_agg(jsonb_build_array(i.id, i.token, i.outcome, i.result, i.error, i.message,
                                         i.backtrace, i.version, i.awaiting,
                                         (CASE WHEN p_fast_mode THEN 0.01 ELSE 10 END)
                                         * power(1.5, COALESCE(j.failed_attempts, 0) + 1))
                       ORDER BY i.ord)
      FROM unnest(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors, p_messages,
                  p_backtraces, p_versions, p_awaiting)
        WITH ORDINALITY AS i(id, token, outcome, result, error, message, backtrace, version,
                             awaiting, ord)
      LEFT JOIN postjob.postjobs j ON j.id = i.id), '[]'::jsonb),
    '{}') f;
  DELETE FROM postjob.leases l
  WHERE l.token = ANY (p_lease_tokens)
    AND NOT EXISTS (SELECT 1 FROM postjob.postjobs j
                    WHERE j.id = ANY (l.job_ids) AND j.lease_token = l.token);
  RETURN ARRAY(SELECT x FROM unnest(p_ids) x WHERE x <> ALL (COALESCE(v_lost, '{}')));
END;
$$;

-- pj0007's cycle: the status each recorded outcome left ('done') with the attempt the run was,
-- the outcomes not recorded ('lost'), then the jobs checked out ('job').
CREATE OR REPLACE FUNCTION postjob.worker_cycle(
  p_worker_id bigint, p_identifier varchar, p_ids bigint[], p_lease_tokens bigint[],
  p_outcomes text[], p_results jsonb[], p_errors text[], p_messages text[],
  p_backtraces jsonb[], p_versions text[], p_awaiting bigint[], p_workflows text[],
  p_workflow_versions text[], p_queues text[], p_limit integer, p_lease double precision,
  p_fast_mode boolean, p_reap boolean)
RETURNS TABLE (kind text, id bigint, status text, lease_token bigint, workflow varchar,
               workflow_version varchar, args jsonb, queue varchar, root_id bigint,
               full_id varchar, parent_id bigint, attempt integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_accepted bigint[];
BEGIN
  IF cardinality(p_ids) > 0 THEN
    v_accepted := postjob.finish_jobs(p_ids, p_lease_tokens, p_outcomes, p_results, p_errors,
                                      p_messages, p_backtraces, p_versions, p_awaiting,
                                      p_fast_mode);
    RETURN QUERY SELECT 'done'::text, d.id, d.status::text, NULL::bigint, NULL::varchar,
                        NULL::varchar, NULL::jsonb, NULL::varchar, NULL::bigint,
                        NULL::varchar, NULL::bigint,
                        d.failed_attempts + CASE WHEN i.outcome IN ('err', 'failed') THEN 0
                                                 ELSE 1 END
      FROM postjob.postjobs d
      JOIN unnest(p_ids, p_outcomes) AS i(id, outcome) ON i.id = d.id
      WHERE d.id = ANY (v_accepted);
    RETURN QUERY SELECT 'lost'::text, x, NULL::text, NULL::bigint, NULL::varchar,
                        NULL::varchar, NULL::jsonb, NULL::varchar, NULL::bigint,
                        NULL::varchar, NULL::bigint, NULL::integer
      FROM unnest(p_ids) AS x WHERE x <> ALL (v_accepted);
  END IF;
  IF p_reap THEN
    PERFORM postjob.reap_v3();
  END IF;
  IF p_limit > 0 THEN
    RETURN QUERY SELECT 'job'::text, c.id, 'processing'::text, c.lease_token, c.workflow,
                        c.workflow_version, c.args, c.queue, c.root_id, c.full_id, c.parent_id,
                        NULL::integer
      FROM postjob.checkout_v3(p_worker_id, p_identifier, p_workflows, p_workflow_versions,
                               p_queues, p_limit, p_lease, true) c;
  END IF;
END;
$$;
