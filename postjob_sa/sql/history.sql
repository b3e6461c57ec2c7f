-- History: the ranges of job ids the record (postjob.postjobs) is partitioned by, created
-- ahead of the ids to come and dropped whole once their jobs are past keeping
-- (postjob.history_settings; JobQueue.set_history and rotate_history, postjob history).
--
-- A range is named postjobs_from_<its first id> (the first one, from MINVALUE, postjobs_from_0).
-- A job whose range is not there yet is kept by postjobs_default until the rotation creates
-- that range and moves it there. A range is closed once every id in it has been handed out;
-- a closed range is dropped when its newest settle is older than keep and it holds no job of
-- an unfinished tree (one whose root or any descendant is unfinished: a parent may read a
-- child's result weeks after the child ended). One rotation runs at a time (an advisory
-- lock: another one meanwhile does nothing and says so).

-- The settings (the defaults without a row: ranges of 1,000,000 ids, kept for ever).
-- Taken at most at the bounds JobQueue.set_history checks (a century, a billion ids): a row
-- written past them (by older code) keeps the rotation's arithmetic in range.
CREATE OR REPLACE FUNCTION postjob._history_settings(OUT keep interval, OUT partition_size bigint)
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN s.keep > interval '36500 days' THEN interval '36500 days' ELSE s.keep END,
         LEAST(COALESCE(s.partition_size, 1000000), 1000000000)
  FROM (VALUES (1)) AS x (one) LEFT JOIN postjob.history_settings s ON s.id
$$;

-- The ranges of the record, by their first id (NULL: from MINVALUE); the default is not one.
CREATE OR REPLACE FUNCTION postjob._history_ranges()
RETURNS TABLE (name text, from_id bigint, to_id bigint)
LANGUAGE sql STABLE AS $$
  SELECT c.relname::text,
         (regexp_match(b.bound, 'FROM \(''?(-?[0-9]+)'))[1]::bigint,
         (regexp_match(b.bound, 'TO \(''?(-?[0-9]+)'))[1]::bigint
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
  WHERE i.inhparent = 'postjob.postjobs'::regclass AND b.bound <> 'DEFAULT'
  ORDER BY 3
$$;

-- The last id handed out (0 before the first).
CREATE OR REPLACE FUNCTION postjob._history_last_id() RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT COALESCE(pg_sequence_last_value(
    pg_get_serial_sequence('postjob.postjobs', 'id')::regclass), 0)
$$;

-- The roots of the unfinished trees.
CREATE OR REPLACE FUNCTION postjob._history_live_roots() RETURNS bigint[]
LANGUAGE sql STABLE AS $$
  SELECT ARRAY(SELECT DISTINCT COALESCE(j.root_id, j.id)
               FROM postjob.unfinished u JOIN postjob.postjobs j ON j.id = u.job_id)
$$;

-- The unfinished tree (its root) that has a job in [p_from, p_to), if any: a tree's jobs have
-- ids from its root's on, and its descendants are found by the tree index of that range.
-- Planned at each call (EXECUTE): the rotation drops ranges between two calls in one
-- transaction, and a plan kept from before the drop fails on PostgreSQL 16.2 ("could not
-- match partition child tables to plan elements").
CREATE OR REPLACE FUNCTION postjob._history_pin(p_from bigint, p_to bigint, p_roots bigint[])
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
  v_root bigint;
BEGIN
  EXECUTE 'SELECT r.id FROM unnest($3) AS r (id) WHERE r.id < $2 AND (r.id >= $1 OR EXISTS ('
          '  SELECT 1 FROM postjob.postjobs t WHERE t.root_id = r.id'
          '  AND t.parent_id IS NOT NULL AND t.id >= $1 AND t.id < $2))'
          ' ORDER BY r.id LIMIT 1'
    INTO v_root USING p_from, p_to, p_roots;
  RETURN v_root;
END;
$$;

-- A new range [p_from, p_to): made apart, the jobs the default partition kept for it moved
-- in, then attached (its CHECK spares the attach a scan); returns the jobs moved. Open
-- ranges keep half their pages free, so that a job's updates stay on its page (HOT).
CREATE OR REPLACE FUNCTION postjob._history_add_range(p_from bigint, p_to bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_name text := 'postjobs_from_' || p_from;
  v_moved bigint;
BEGIN
  EXECUTE format('CREATE TABLE postjob.%I (LIKE postjob.postjobs INCLUDING DEFAULTS '
                 'INCLUDING CONSTRAINTS) WITH (fillfactor = 50, '
                 'autovacuum_vacuum_scale_factor = 0.02, '
                 'autovacuum_vacuum_insert_scale_factor = 0.02, '
                 'autovacuum_analyze_scale_factor = 0.02)', v_name);
  EXECUTE format('ALTER TABLE postjob.%I ADD CONSTRAINT %I CHECK (id >= %s AND id < %s)',
                 v_name, v_name || '_range', p_from, p_to);
  EXECUTE format('WITH moved AS (DELETE FROM postjob.postjobs_default '
                 'WHERE id >= %s AND id < %s RETURNING *) '
                 'INSERT INTO postjob.%I SELECT * FROM moved', p_from, p_to, v_name);
  GET DIAGNOSTICS v_moved = ROW_COUNT;
  EXECUTE format('ALTER TABLE postjob.postjobs ATTACH PARTITION postjob.%I '
                 'FOR VALUES FROM (%s) TO (%s)', v_name, p_from, p_to);
  EXECUTE format('ALTER TABLE postjob.%I DROP CONSTRAINT %I', v_name, v_name || '_range');
  RETURN v_moved;
END;
$$;

-- Drop the range p_name, [p_from, p_to), and what refers to its jobs; returns its jobs.
CREATE OR REPLACE FUNCTION postjob._history_drop_range(p_name text, p_from bigint, p_to bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_jobs bigint;
BEGIN
  EXECUTE format('SELECT count(*) FROM postjob.%I', p_name) INTO v_jobs;
  DELETE FROM postjob.tokens WHERE postjob_id >= p_from AND postjob_id < p_to;
  DELETE FROM postjob.steps WHERE job_id >= p_from AND job_id < p_to;
  DELETE FROM postjob.event_waits WHERE job_id >= p_from AND job_id < p_to;
  DELETE FROM postjob.wakeups WHERE job_id >= p_from AND job_id < p_to;
  EXECUTE format('ALTER TABLE postjob.postjobs DETACH PARTITION postjob.%I', p_name);
  EXECUTE format('DROP TABLE postjob.%I', p_name);
  DELETE FROM postjob.history_partitions h WHERE h.name = p_name;
  RETURN v_jobs;
END;
$$;

-- Compact the closed range p_name, [p_from, p_to), which holds no unfinished job: its jobs
-- copied in id order into a range of full pages (fillfactor 100: settled jobs are not
-- updated again, or seldom), swapped in for it. Writes to the range wait for the copy (a
-- SHARE lock: its reads go on); returns its jobs.
CREATE OR REPLACE FUNCTION postjob._history_compact(p_name text, p_from bigint, p_to bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_new text := p_name || '_compact';
  v_columns text := (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
                     FROM pg_attribute a
                     WHERE a.attrelid = 'postjob.postjobs'::regclass AND a.attnum > 0
                       AND NOT a.attisdropped);
  v_jobs bigint;
BEGIN
  EXECUTE format('LOCK TABLE postjob.%I IN SHARE MODE', p_name);
  IF EXISTS (SELECT 1 FROM postjob.unfinished u WHERE u.job_id >= p_from AND u.job_id < p_to)
  THEN
    RETURN NULL;  -- a job of it was reset meanwhile
  END IF;
  EXECUTE format('CREATE TABLE postjob.%I (LIKE postjob.postjobs INCLUDING DEFAULTS '
                 'INCLUDING CONSTRAINTS) WITH (fillfactor = 100, '
                 'autovacuum_vacuum_scale_factor = 0.02, '
                 'autovacuum_vacuum_insert_scale_factor = 0.02, '
                 'autovacuum_analyze_scale_factor = 0.02)', v_new);
  EXECUTE format('INSERT INTO postjob.%I (%s) SELECT %s FROM postjob.%I ORDER BY id',
                 v_new, v_columns, v_columns, p_name);
  GET DIAGNOSTICS v_jobs = ROW_COUNT;
  EXECUTE format('ALTER TABLE postjob.%I ADD CONSTRAINT %I CHECK (id >= %s AND id < %s)',
                 v_new, v_new || '_range', p_from, p_to);
  EXECUTE format('ALTER TABLE postjob.postjobs DETACH PARTITION postjob.%I', p_name);
  EXECUTE format('ALTER TABLE postjob.postjobs ATTACH PARTITION postjob.%I '
                 'FOR VALUES FROM (%s) TO (%s)', v_new,
                 CASE WHEN p_from = -9223372036854775808 THEN 'MINVALUE' ELSE p_from::text END,
                 p_to);
  EXECUTE format('ALTER TABLE postjob.%I DROP CONSTRAINT %I', v_new, v_new || '_range');
  EXECUTE format('DROP TABLE postjob.%I', p_name);
  EXECUTE format('ALTER TABLE postjob.%I RENAME TO %I', v_new, p_name);
  RETURN v_jobs;
END;
$$;

-- One rotation: the ranges ahead (the one of the next id and the one after it), then, with
-- a keep set, each closed range past it that nothing pins dropped, then the oldest closed
-- range of settled jobs not compacted yet compacted. One row per range it did something
-- with or left: action created (jobs: moved from the default partition), dropped (jobs:
-- dropped), compacted (jobs: copied), pinned (root_id: the unfinished tree; detail: a host's foreign
-- key, when rows of the host refer to its jobs), kept (its newest settle is within keep),
-- busy (another rotation runs, or a lock was not had within 5 s). Runs in the caller's
-- transaction: what it drops is gone when that commits. It runs as the schema's owner (only
-- a table's owner may attach or detach its partitions): a worker's role needs no more than
-- its grants (docs/operations.md); what it does is what the settings say.
CREATE OR REPLACE FUNCTION postjob.rotate_history()
RETURNS TABLE (action text, name text, from_id bigint, to_id bigint, jobs bigint,
               root_id bigint, detail text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_keep interval;
  v_size bigint;
  v_last bigint := postjob._history_last_id();
  v_top bigint;
  v_roots bigint[];
  v_range record;
  v_from bigint;
  v_settle timestamptz;
  v_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF NOT pg_try_advisory_xact_lock(1886023986, 32) THEN
    action := 'busy'; detail := 'another rotation runs'; RETURN NEXT;
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', '5s', true);
  SELECT s.keep, s.partition_size INTO v_keep, v_size FROM postjob._history_settings() s;
  SELECT max(h.to_id) INTO v_top FROM postjob._history_ranges() h;
  -- fallen behind by more than a range: one range for the gap, then ranges of v_size
  v_from := (v_last / v_size) * v_size;
  IF v_top IS NULL THEN
    v_top := v_from;
  ELSIF v_top < v_from THEN
    action := 'created'; name := 'postjobs_from_' || v_top; from_id := v_top;
    to_id := v_from; root_id := NULL; detail := NULL;
    jobs := postjob._history_add_range(v_top, v_from);
    RETURN NEXT;
    v_top := v_from;
  END IF;
  WHILE v_top <= v_last + v_size LOOP
    action := 'created'; name := 'postjobs_from_' || v_top; from_id := v_top;
    to_id := v_top + v_size; root_id := NULL; detail := NULL;
    jobs := postjob._history_add_range(v_top, v_top + v_size);
    RETURN NEXT;
    v_top := v_top + v_size;
  END LOOP;
  IF v_keep IS NOT NULL THEN
    v_roots := postjob._history_live_roots();
    FOR v_range IN SELECT * FROM postjob._history_ranges() h WHERE h.to_id <= v_last + 1 LOOP
      v_from := COALESCE(v_range.from_id, -9223372036854775808);
      name := v_range.name; from_id := v_range.from_id; to_id := v_range.to_id;
      jobs := NULL; root_id := postjob._history_pin(v_from, v_range.to_id, v_roots);
      detail := NULL;
      IF root_id IS NOT NULL THEN
        action := 'pinned'; RETURN NEXT;
        CONTINUE;
      END IF;
      -- its newest settle: read when unknown, or when what was read says it is past keep
      SELECT h.newest_settle INTO v_settle FROM postjob.history_partitions h
        WHERE h.name = v_range.name;
      IF NOT FOUND OR v_settle < statement_timestamp() - v_keep THEN
        EXECUTE format('SELECT max(updated_at) FROM postjob.%I', v_range.name) INTO v_settle;
        INSERT INTO postjob.history_partitions AS h (name, newest_settle, checked_at)
          VALUES (v_range.name, v_settle, statement_timestamp())
          ON CONFLICT ON CONSTRAINT history_partitions_pkey DO UPDATE
            SET newest_settle = EXCLUDED.newest_settle, checked_at = EXCLUDED.checked_at;
      END IF;
      IF v_settle IS NOT NULL AND v_settle >= statement_timestamp() - v_keep THEN
        action := 'kept'; RETURN NEXT;
        CONTINUE;
      END IF;
      BEGIN
        jobs := postjob._history_drop_range(v_range.name, v_from, v_range.to_id);
        action := 'dropped';
      EXCEPTION
        WHEN foreign_key_violation THEN
          action := 'pinned'; detail := SQLERRM;
        WHEN lock_not_available THEN
          action := 'busy'; detail := SQLERRM;
      END;
      RETURN NEXT;
    END LOOP;
  END IF;
  -- one closed range of settled jobs compacted per rotation (the oldest first)
  FOR v_range IN
    SELECT h.* FROM postjob._history_ranges() h JOIN pg_class c ON c.relname = h.name
      AND c.relnamespace = 'postjob'::regnamespace
    WHERE h.to_id <= v_last + 1
      AND NOT COALESCE(c.reloptions @> ARRAY['fillfactor=100'], false)
      AND NOT EXISTS (SELECT 1 FROM postjob.unfinished u
                      WHERE u.job_id >= COALESCE(h.from_id, -9223372036854775808)
                        AND u.job_id < h.to_id)
    ORDER BY h.to_id LIMIT 1
  LOOP
    name := v_range.name; from_id := v_range.from_id; to_id := v_range.to_id;
    root_id := NULL; detail := NULL;
    BEGIN
      jobs := postjob._history_compact(v_range.name,
                                       COALESCE(v_range.from_id, -9223372036854775808),
                                       v_range.to_id);
      action := CASE WHEN jobs IS NULL THEN 'kept' ELSE 'compacted' END;
    EXCEPTION
      WHEN foreign_key_violation THEN
        action := 'pinned'; detail := SQLERRM;
      WHEN lock_not_available THEN
        action := 'busy'; detail := SQLERRM;
    END;
    RETURN NEXT;
  END LOOP;
  PERFORM set_config('lock_timeout', v_lock_timeout, true);
END;
$$;

-- The ranges as `postjob history status` lists them: ids, jobs (counted in a small range,
-- else as the statistics say), bytes on disk, the newest settle the rotation read, and the
-- unfinished tree that pins it. The default partition comes last (its ids NULL). As the
-- owner, like the rotation (it counts the jobs of a range, which no grant names).
CREATE OR REPLACE FUNCTION postjob.history_status()
RETURNS TABLE (name text, from_id bigint, to_id bigint, jobs bigint, bytes bigint,
               newest_settle timestamptz, pinned_by bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_roots bigint[] := postjob._history_live_roots();
  v_range record;
BEGIN
  FOR v_range IN
    SELECT h.name, h.from_id, h.to_id FROM postjob._history_ranges() h
    UNION ALL SELECT 'postjobs_default', NULL, NULL
  LOOP
    name := v_range.name; from_id := v_range.from_id; to_id := v_range.to_id;
    SELECT CASE WHEN c.relpages < 1000 OR c.reltuples < 0 THEN NULL
                ELSE c.reltuples::bigint END,
           pg_total_relation_size(c.oid)
      INTO jobs, bytes
      FROM pg_class c WHERE c.oid = ('postjob.' || quote_ident(v_range.name))::regclass;
    IF jobs IS NULL THEN
      EXECUTE format('SELECT count(*) FROM postjob.%I', v_range.name) INTO jobs;
    END IF;
    newest_settle := (SELECT h.newest_settle FROM postjob.history_partitions h
                      WHERE h.name = v_range.name);
    pinned_by := CASE WHEN v_range.to_id IS NOT NULL THEN postjob._history_pin(
                   COALESCE(v_range.from_id, -9223372036854775808), v_range.to_id, v_roots) END;
    RETURN NEXT;
  END LOOP;
END;
$$;
