-- Workers and leases: a worker's row and heartbeat, its idle wait, and the reaper that rescues
-- the jobs of a worker that has gone and ends the jobs past their deadline.
--
-- A checkout's jobs hold their lease in their rows of postjob.unfinished: a worker's for as
-- long as the worker beats (its row in postjob.workers; a beat writes that row only), one
-- through the API until lease_expires_at. A job whose worker beats is never presumed
-- abandoned, unless the worker's own connection, a direct one, is gone: a dead process's
-- connection goes with it, and its jobs are rescued at the next reap, not at the lease's end.

-- A worker's row: what it serves (its workflows, the version of each in the same order, its
-- queues or NULL for all: a new job wakes only a worker that serves it, see _wake_for).
CREATE OR REPLACE FUNCTION postjob.register_worker_v2(
  p_identifier varchar, p_lease double precision, p_code_revision varchar,
  p_workflows text[], p_versions text[], p_queues text[])
RETURNS bigint LANGUAGE sql AS $$
  INSERT INTO postjob.workers (identifier, expires_at, code_revision, workflows,
                               workflow_versions, queues)
  VALUES (p_identifier, statement_timestamp() + p_lease * interval '1 second',
          p_code_revision, COALESCE(p_workflows, '{}'), p_versions, p_queues)
  RETURNING id
$$;

-- The worker's own connection is this session's, and direct (no pooler between them): from
-- now on its jobs are rescued as soon as this server process is gone (_dead_workers). Called
-- by the worker after it registered and after each reconnection.
CREATE OR REPLACE FUNCTION postjob.worker_attach_v1(p_worker_id bigint) RETURNS void
LANGUAGE sql AS $$
  UPDATE postjob.workers SET backend_pid = pg_backend_pid(),
    backend_start = (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a)
  WHERE id = p_worker_id
$$;

-- The workers presumed alive whose own direct connection is gone: no server process has its
-- pid any more, or a new one does (another backend_start). A process whose backend_start this
-- role may not see (another role's, without pg_read_all_stats) is taken to be alive. Workers
-- behind a pooler record no connection: for them the lease rule alone holds.
CREATE OR REPLACE FUNCTION postjob._dead_workers() RETURNS bigint[]
LANGUAGE sql STABLE AS $$
  SELECT ARRAY(
    SELECT w.id FROM postjob.workers w
    WHERE w.backend_pid IS NOT NULL AND w.expires_at > statement_timestamp()
      AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a
                      WHERE a.pid = w.backend_pid
                        AND (a.backend_start IS NULL OR a.backend_start = w.backend_start)))
$$;

CREATE OR REPLACE FUNCTION postjob.unregister_worker(p_worker_id bigint) RETURNS void
LANGUAGE sql AS $$
  DELETE FROM postjob.workers WHERE id = p_worker_id
$$;

-- Keep the worker alive for p_lease more seconds, and with it the leases of its jobs; return
-- the held jobs (p_ids, under p_lease_tokens) that are no longer its own (cancelled, reaped,
-- reset), or NULL when the worker's row is gone (it was presumed dead). It never waits: it
-- writes the worker's own row and reads the others.
CREATE OR REPLACE FUNCTION postjob.worker_heartbeat(
  p_worker_id bigint, p_lease double precision, p_ids bigint[], p_lease_tokens bigint[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  v_lost bigint[];
BEGIN
  UPDATE postjob.workers SET heartbeat_at = statement_timestamp(),
    expires_at = statement_timestamp() + p_lease * interval '1 second'
  WHERE id = p_worker_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  SELECT array_agg(h.id) INTO v_lost
    FROM unnest(p_ids, p_lease_tokens) AS h(id, lease_token)
    WHERE NOT EXISTS (SELECT 1 FROM postjob.unfinished u
                      WHERE u.job_id = h.id AND u.lease_token = h.lease_token
                        AND u.status IN ('ready', 'err', 'sleep'));
  RETURN COALESCE(v_lost, '{}');
END;
$$;

-- Rescue and end what nobody will: the jobs whose lease's holder has gone (its lease ended
-- with no heartbeat, or its connection is gone: zombies, retried at once, or failed with no
-- attempts left) and the waiting jobs past their deadline
-- (timeout), at most p_limit of each; free the places of jobs no longer running; forget
-- workers gone for an hour. It waits for no row: what another transaction holds is left for
-- the next call, and the families are told as a run's outcome tells them (_tell_family).
-- Returns how many jobs it rescued or ended.
CREATE OR REPLACE FUNCTION postjob.reap_v4(p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_now timestamptz := statement_timestamp();
  v_zombies bigint[];
  v_tokens bigint[];
  v_messages text[];
  v_stopped bigint[];
  v_stopped_tokens bigint[];
  v_timeouts bigint[];
  v_dead bigint[];
  v_n integer;
  v_count integer := 0;
BEGIN
  -- a worker whose connection is gone is dead: it no longer counts as alive (its row is
  -- left when another transaction holds it: a wake-up's), and the jobs it held are rescued
  -- now, whatever their lease
  v_dead := postjob._dead_workers();
  IF cardinality(v_dead) > 0 THEN
    UPDATE postjob.workers SET expires_at = v_now, waiting_since = NULL
    WHERE id = ANY (ARRAY(SELECT x.id FROM postjob.workers x WHERE x.id = ANY (v_dead)
                          FOR NO KEY UPDATE SKIP LOCKED));
  END IF;
  SELECT array_agg(u.job_id) FILTER (WHERE u.status IN ('ready', 'err', 'sleep')),
         array_agg(u.lease_token) FILTER (WHERE u.status IN ('ready', 'err', 'sleep')),
         array_agg(CASE WHEN u.worker_id = ANY (v_dead)
                        THEN 'zombie: the connection of worker ' || w.identifier || ' is gone'
                        ELSE 'zombie: the lease expired (worker '
                             || COALESCE(w.identifier, u.holder, 'unknown') || ')' END)
           FILTER (WHERE u.status IN ('ready', 'err', 'sleep')),
         array_agg(u.job_id) FILTER (WHERE u.status NOT IN ('ready', 'err', 'sleep')),
         array_agg(u.lease_token) FILTER (WHERE u.status NOT IN ('ready', 'err', 'sleep'))
    INTO v_zombies, v_tokens, v_messages, v_stopped, v_stopped_tokens
    FROM (SELECT u.* FROM postjob.unfinished u
          WHERE u.lease_token IS NOT NULL
            AND ((u.lease_expires_at <= v_now
                  AND NOT EXISTS (SELECT 1 FROM postjob.workers w
                                  WHERE w.id = u.worker_id AND w.expires_at > v_now))
                 OR u.worker_id = ANY (v_dead))
          ORDER BY u.lease_expires_at LIMIT p_limit) u
    LEFT JOIN postjob.workers w ON w.id = u.worker_id;
  v_n := COALESCE(cardinality(v_zombies), 0);
  IF v_zombies IS NOT NULL OR v_stopped IS NOT NULL THEN
    -- a zombie's run failed (an attempt counted: retried at once or failed); the run of a job
    -- ended from outside is over
    PERFORM postjob._settle(
      COALESCE(v_zombies, '{}'), COALESCE(v_tokens, '{}'),
      array_fill('err'::text, ARRAY[v_n]),
      array_fill(NULL::jsonb, ARRAY[v_n]),
      array_fill('Zombie'::text, ARRAY[v_n]), COALESCE(v_messages, '{}'),
      array_fill(NULL::jsonb, ARRAY[v_n]),
      array_fill(NULL::text, ARRAY[v_n]),
      array_fill(NULL::bigint, ARRAY[v_n]),
      array_fill(0::double precision, ARRAY[v_n]),
      COALESCE(v_stopped, '{}'), COALESCE(v_stopped_tokens, '{}'));
    v_count := v_count + v_n;
  END IF;

  v_timeouts := ARRAY(SELECT u.job_id FROM postjob.unfinished u
                      WHERE u.timing_out_at <= v_now AND u.lease_token IS NULL
                      ORDER BY u.job_id LIMIT p_limit FOR UPDATE SKIP LOCKED);
  IF cardinality(v_timeouts) > 0 THEN
    v_timeouts := postjob._end_unfinished(v_timeouts, 'timeout', 'Timeout', 'timeout');
    PERFORM postjob._tell_family(v_timeouts, v_timeouts);
    v_count := v_count + cardinality(v_timeouts);
  END IF;

  -- a place whose job no longer runs is free (its end was recorded without freeing it)
  UPDATE postjob.queue_slots s SET job_id = NULL
  WHERE s.job_id IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM postjob.unfinished u
                    WHERE u.job_id = s.job_id AND u.lease_token IS NOT NULL);
  DELETE FROM postjob.workers WHERE expires_at < v_now - interval '1 hour';
  RETURN v_count;
END;
$$;

-- When a rate-limited queue may start a job next: when its oldest start is a period old (now,
-- when a start is free).
CREATE OR REPLACE FUNCTION postjob._next_start(p_limits postjob.queue_limits)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
  SELECT greatest(statement_timestamp(),
                  COALESCE(min(s.started_at), '-infinity') + postjob._period(p_limits.period))
  FROM (SELECT s.started_at FROM postjob.queue_starts s
        WHERE s.queue = p_limits.queue AND s.n <= p_limits.rate
        ORDER BY s.started_at NULLS FIRST LIMIT 1) s
$$;

-- Before an idle worker waits (its checkout found nothing it could take): it is marked
-- waiting (p_worker_id; a new job's insert then wakes it on its own channel, see _wake),
-- reaps when asked, makes due what has come due, and gets the seconds until there may be
-- work for it (0: now; NULL: nothing in sight): jobs it just made due, the next of its jobs
-- to come due, the next start of a rate-limited queue where jobs of its wait, the next
-- deadline, a second from now while ends are still to be told (postjob.wakeups), the moment
-- a lease would be presumed abandoned, two seconds from now while another worker with a
-- direct connection holds jobs (its death is seen at the next reap). Jobs due now that its checkout
-- did not take are another checkout's, or in a queue whose places are all taken (the end of
-- a run there wakes a worker): nothing here reads them, so what lies in levels, queues or
-- times it cannot take costs the wait nothing.
CREATE OR REPLACE FUNCTION postjob.worker_idle_v2(
  p_worker_id bigint, p_workflows text[], p_versions text[], p_queues text[], p_reap boolean)
RETURNS double precision
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_now timestamptz := statement_timestamp();
BEGIN
  IF p_worker_id IS NOT NULL THEN
    UPDATE postjob.workers SET waiting_since = v_now
    WHERE id = p_worker_id AND waiting_since IS NULL;
  END IF;
  IF p_reap THEN
    PERFORM postjob.reap_v4();
  END IF;
  IF postjob._promote(p_workflows, p_versions) > 0 THEN
    RETURN 0;
  END IF;
  RETURN EXTRACT(EPOCH FROM LEAST(
    (SELECT min(s.run_at)
       FROM postjob._served_keys(p_workflows, p_versions) k
       CROSS JOIN LATERAL (
         SELECT u.run_at FROM postjob.unfinished u
         WHERE u.workflow = k.workflow AND u.workflow_version = k.workflow_version
           AND NOT u.due AND u.run_at IS NOT NULL AND u.lease_token IS NULL
         ORDER BY u.run_at LIMIT 1) s),
    (SELECT min(postjob._next_start(l))
       FROM postjob.queue_limits l
       WHERE l.rate IS NOT NULL AND (p_queues IS NULL OR l.queue = ANY (p_queues))
         AND EXISTS (SELECT 1 FROM postjob._served_keys(p_workflows, p_versions) k
                     JOIN postjob.unfinished u ON u.workflow = k.workflow
                      AND u.workflow_version = k.workflow_version AND u.queue = l.queue
                     WHERE u.due AND u.lease_token IS NULL)),
    (SELECT min(u.timing_out_at) FROM postjob.unfinished u
      WHERE u.timing_out_at IS NOT NULL AND u.lease_token IS NULL),
    (SELECT v_now + interval '1 second' FROM postjob.wakeups LIMIT 1),
    (SELECT min(u.lease_expires_at) FROM postjob.unfinished u
      WHERE u.lease_token IS NOT NULL AND u.worker_id IS NULL),
    (SELECT min(greatest(w.expires_at, u.lease_expires_at))
       FROM postjob.unfinished u JOIN postjob.workers w ON w.id = u.worker_id
      WHERE u.lease_token IS NOT NULL),
    (SELECT v_now + interval '2 seconds'
       FROM postjob.workers w
      WHERE w.backend_pid IS NOT NULL AND w.id IS DISTINCT FROM p_worker_id
        AND EXISTS (SELECT 1 FROM postjob.unfinished u
                    WHERE u.worker_id = w.id AND u.lease_token IS NOT NULL)
      LIMIT 1)) - v_now
  )::double precision;
END;
$$;
