-- History: the ranges of job ids the record (postjob.postjobs) is partitioned by, created
-- ahead of the ids to come and dropped whole once their jobs are past keeping
-- (postjob.history_settings; JobQueue.set_history and rotate_history, postjob history).
--
-- A range is named postjobs_from_<its first id> (the first one, from MINVALUE, postjobs_from_0).
-- A job whose range is not there yet is kept by postjobs_default until the rotation creates
-- that range and moves it there. After a change of partition_size the rotation narrows the
-- open range to end partition_size ids on. A range is closed once every id in it has been
-- handed out; a closed range is dropped when its newest settle is older than keep and it
-- holds no job of an unfinished tree (one whose root or any descendant is unfinished: a
-- parent may read a child's result weeks after the child ended). One rotation runs at a
-- time (an advisory lock: another one meanwhile does nothing and says so).

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
-- in, then attached (its CHECK spares the attach a scan); returns the jobs moved. The record
-- first, then the default partition (the order every insert takes them). The record's writes
-- wait (SHARE ROW EXCLUSIVE; its reads go on) from the lock to the commit: the enqueues under
-- way have committed, so the move sees every job the attach checks, and none routes a job by
-- the ranges as they were before the attach (PostgreSQL would refuse it in the default
-- partition once the range is there). The default is taken without waiting: its reader (a
-- transaction that read the record, a range at a time as every read does) may go on to write
-- the record, which waits for this lock, so a wait here would be a deadlock. When it is
-- read, the record is let go (the subtransaction undone) and both are tried again, 5 s at
-- most (then lock_not_available: busy). Open ranges keep half their pages free, so that a
-- job's updates stay on its page (HOT).
CREATE OR REPLACE FUNCTION postjob._history_add_range(p_from bigint, p_to bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_name text := 'postjobs_from_' || p_from;
  v_moved bigint;
  v_until timestamptz := clock_timestamp() + interval '5 s';
  v_lock_timeout text := current_setting('lock_timeout');
BEGIN
  LOOP
    BEGIN
      PERFORM set_config('lock_timeout', GREATEST(1, (EXTRACT(EPOCH FROM
        v_until - clock_timestamp()) * 1000)::bigint)::text, true);
      LOCK TABLE ONLY postjob.postjobs IN SHARE ROW EXCLUSIVE MODE;
      LOCK TABLE postjob.postjobs_default IN ACCESS EXCLUSIVE MODE NOWAIT;
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      IF clock_timestamp() >= v_until THEN
        RAISE;
      END IF;
    END;
    PERFORM pg_sleep(0.05);
  END LOOP;
  PERFORM set_config('lock_timeout', v_lock_timeout, true);
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

-- The range p_name, [p_from, p_to), ended partition_size ids past the last id it holds or
-- the last id handed out (p_last), whichever is later: the rotation narrows the open range
-- (and the empty ones ahead) to the size set. The caller holds the record (ACCESS
-- EXCLUSIVE); returns its new end, or NULL when it ends there or earlier already.
CREATE OR REPLACE FUNCTION postjob._history_narrow(p_name text, p_from bigint, p_to bigint,
                                                   p_last bigint, p_size bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_max bigint;
  v_to bigint;
BEGIN
  EXECUTE format('LOCK TABLE postjob.%I IN ACCESS EXCLUSIVE MODE', p_name);
  EXECUTE format('SELECT max(id) FROM postjob.%I', p_name) INTO v_max;
  v_to := GREATEST(p_from, p_last + 1, COALESCE(v_max + 1, p_from)) + p_size;
  IF v_to >= p_to THEN
    RETURN NULL;
  END IF;
  EXECUTE format('ALTER TABLE postjob.%I ADD CONSTRAINT %I CHECK (id >= %s AND id < %s)',
                 p_name, p_name || '_range', p_from, v_to);
  EXECUTE format('ALTER TABLE postjob.postjobs DETACH PARTITION postjob.%I', p_name);
  EXECUTE format('ALTER TABLE postjob.postjobs ATTACH PARTITION postjob.%I '
                 'FOR VALUES FROM (%s) TO (%s)', p_name,
                 CASE WHEN p_from = -9223372036854775808 THEN 'MINVALUE' ELSE p_from::text END,
                 v_to);
  EXECUTE format('ALTER TABLE postjob.%I DROP CONSTRAINT %I', p_name, p_name || '_range');
  RETURN v_to;
END;
$$;

-- Drop the range p_name, [p_from, p_to), and what refers to its jobs; returns its jobs. The
-- caller holds the record (ACCESS EXCLUSIVE) and the range, and decided under those locks.
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

-- Compact the closed range p_name, [p_from, p_to), unless it holds an unfinished job (NULL):
-- its jobs copied in id order into a range of full pages (fillfactor 100: settled jobs are
-- not updated again, or seldom), swapped in for it. The caller holds the record (ACCESS
-- EXCLUSIVE): the record waits for the copy; returns its jobs.
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
  EXECUTE format('LOCK TABLE postjob.%I IN ACCESS EXCLUSIVE MODE', p_name);
  IF EXISTS (SELECT 1 FROM postjob.unfinished u WHERE u.job_id >= p_from AND u.job_id < p_to)
  THEN
    RETURN NULL;  -- a job of it was reset before the locks were granted
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

-- One rotation. First what it may do, read without locks: ranges to narrow, closed ranges past
-- keep that nothing pins, the oldest closed range of settled jobs not compacted yet. If there
-- is any, it takes the record (ACCESS EXCLUSIVE, on the partitioned table alone: the order
-- every statement takes, the record before its ranges) and decides each of them again on what
-- it sees then: nothing can make a job unfinished, or write one, until it commits. Then, each
-- step a subtransaction of its own (a step that fails undoes nothing else): the open range
-- (and empty ones ahead) narrowed to partition_size ids on, the ranges ahead created (the
-- range of the next id and the one after it; a rotation fallen more than a range behind
-- makes one range for the ids behind), the ranges past keep dropped, the compaction. One row
-- per range it did something with or left: action created (jobs: moved from the default
-- partition), narrowed (to_id: its new end), dropped (jobs: dropped), compacted (jobs:
-- copied), pinned (root_id: the unfinished tree; detail: a host's foreign key, when rows of
-- the host refer to its jobs), kept (its newest settle is within keep, or a job of it was
-- reset), busy (another rotation runs, or a lock was not had within 5 s: name NULL for the
-- record), failed (detail: the error; the other steps stand). Runs in the caller's transaction, at
-- READ COMMITTED (a statement's snapshot is taken after the locks it waited for): what it
-- drops is gone when that commits. It runs as the schema's owner (only a table's owner may
-- attach or detach its partitions): a worker's role needs no more than its grants
-- (docs/operations.md); what it does is what the settings say.
CREATE OR REPLACE FUNCTION postjob.rotate_history()
RETURNS TABLE (action text, name text, from_id bigint, to_id bigint, jobs bigint,
               root_id bigint, detail text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  c_min constant bigint := -9223372036854775808;
  v_keep interval;
  v_size bigint;
  v_last bigint := postjob._history_last_id();
  v_roots bigint[];
  v_range record;
  v_gap record;
  v_at bigint;
  v_end bigint;
  v_settle timestamptz;
  v_drop text[] := '{}';
  v_compact text;
  v_narrow boolean;
  v_record boolean := false;
  v_creating boolean := true;
  v_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'postjob: rotate_history runs at READ COMMITTED, not %',
      upper(current_setting('transaction_isolation')) USING ERRCODE = 'feature_not_supported';
  END IF;
  IF NOT pg_try_advisory_xact_lock(1886023986, 32) THEN
    action := 'busy'; detail := 'another rotation runs'; RETURN NEXT;
    RETURN;
  END IF;
  PERFORM set_config('lock_timeout', '5s', true);
  SELECT s.keep, s.partition_size INTO v_keep, v_size FROM postjob._history_settings() s;

  -- what may need the record to itself, read without locks
  v_narrow := EXISTS (SELECT 1 FROM postjob._history_ranges() h
                      WHERE GREATEST(COALESCE(h.from_id, c_min), v_last + 1) + v_size < h.to_id);
  IF v_keep IS NOT NULL THEN
    v_roots := postjob._history_live_roots();
    FOR v_range IN SELECT * FROM postjob._history_ranges() h WHERE h.to_id <= v_last + 1 LOOP
      name := v_range.name; from_id := v_range.from_id; to_id := v_range.to_id;
      jobs := NULL; detail := NULL;
      root_id := postjob._history_pin(COALESCE(v_range.from_id, c_min), v_range.to_id, v_roots);
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
      v_drop := v_drop || v_range.name::text;
    END LOOP;
  END IF;
  SELECT h.name INTO v_compact
    FROM postjob._history_ranges() h JOIN pg_class c ON c.relname = h.name
      AND c.relnamespace = 'postjob'::regnamespace
    WHERE h.to_id <= v_last + 1 AND h.name <> ALL (v_drop)
      AND NOT COALESCE(c.reloptions @> ARRAY['fillfactor=100'], false)
      AND NOT EXISTS (SELECT 1 FROM postjob.unfinished u
                      WHERE u.job_id >= COALESCE(h.from_id, c_min) AND u.job_id < h.to_id)
    ORDER BY h.to_id LIMIT 1;

  IF v_narrow OR cardinality(v_drop) > 0 OR v_compact IS NOT NULL THEN
    -- the record, then its default partition (every detach and attach changes what it may
    -- hold): once both are had, a step waits only for a reader of its range by name
    -- (history status); the record waits while the rotation waits for them (5 s at most)
    name := NULL;
    BEGIN
      LOCK TABLE ONLY postjob.postjobs IN ACCESS EXCLUSIVE MODE;
      name := 'postjobs_default';
      LOCK TABLE postjob.postjobs_default IN ACCESS EXCLUSIVE MODE;
      v_record := true;
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
      action := 'busy'; from_id := NULL; to_id := NULL; jobs := NULL; root_id := NULL;
      detail := SQLERRM; RETURN NEXT;
      v_creating := name IS NULL;  -- a range is created under the default's lock too
    END;
  END IF;
  IF v_record THEN  -- what it reads from here on holds until it commits
    v_last := postjob._history_last_id();
    v_roots := postjob._history_live_roots();
    FOR v_range IN
      SELECT * FROM postjob._history_ranges() h
      WHERE GREATEST(COALESCE(h.from_id, c_min), v_last + 1) + v_size < h.to_id ORDER BY h.to_id
    LOOP
      name := v_range.name; from_id := v_range.from_id; jobs := NULL; root_id := NULL;
      detail := NULL;
      BEGIN
        to_id := postjob._history_narrow(v_range.name, COALESCE(v_range.from_id, c_min),
                                         v_range.to_id, v_last, v_size);
        action := 'narrowed';
      EXCEPTION
        WHEN lock_not_available OR deadlock_detected THEN
          action := 'busy'; detail := SQLERRM;
        WHEN OTHERS THEN
          action := 'failed'; detail := SQLERRM;
      END;
      IF action <> 'narrowed' OR to_id IS NOT NULL THEN
        RETURN NEXT;
      END IF;
    END LOOP;
  END IF;

  -- the ranges ahead: the range of the next id and the one after it, gaps filled
  FOR v_gap IN
    SELECT g.gap_from, g.gap_to FROM (
      SELECT h.to_id AS gap_from,
             lead(COALESCE(h.from_id, c_min)) OVER (ORDER BY h.to_id) AS gap_to
      FROM postjob._history_ranges() h
      UNION ALL
      SELECT (v_last / v_size) * v_size, NULL
      WHERE NOT EXISTS (SELECT 1 FROM postjob._history_ranges())) g
    WHERE (g.gap_to IS NULL OR g.gap_to > g.gap_from) AND g.gap_from <= v_last + 1 + v_size
    ORDER BY g.gap_from
  LOOP
    v_at := v_gap.gap_from;
    WHILE v_creating AND v_at <= v_last + 1 + v_size AND v_at < COALESCE(v_gap.gap_to, v_at + 1)
    LOOP
      v_end := CASE WHEN v_last - v_at >= v_size  -- the ids behind in one range
                    THEN v_at + (v_last - v_at) / v_size * v_size ELSE v_at + v_size END;
      v_end := LEAST(v_end, COALESCE(v_gap.gap_to, v_end));
      name := 'postjobs_from_' || v_at; from_id := v_at; to_id := v_end; root_id := NULL;
      detail := NULL;
      BEGIN
        jobs := postjob._history_add_range(v_at, v_end);
        action := 'created';
      EXCEPTION
        WHEN lock_not_available OR deadlock_detected THEN
          action := 'busy'; jobs := NULL; detail := SQLERRM; v_creating := false;
        WHEN OTHERS THEN
          action := 'failed'; jobs := NULL; detail := SQLERRM; v_creating := false;
      END;
      RETURN NEXT;
      v_at := v_end;
    END LOOP;
  END LOOP;

  IF v_record THEN  -- past keep, decided again under the locks
    FOR v_range IN SELECT * FROM postjob._history_ranges() h WHERE h.name = ANY (v_drop) LOOP
      name := v_range.name; from_id := v_range.from_id; to_id := v_range.to_id;
      jobs := NULL; root_id := NULL; detail := NULL;
      BEGIN
        EXECUTE format('LOCK TABLE postjob.%I IN ACCESS EXCLUSIVE MODE', v_range.name);
        root_id := postjob._history_pin(COALESCE(v_range.from_id, c_min), v_range.to_id,
                                        v_roots);
        IF root_id IS NOT NULL THEN
          action := 'pinned';
        ELSE
          EXECUTE format('SELECT max(updated_at) FROM postjob.%I', v_range.name) INTO v_settle;
          IF v_settle IS NOT NULL AND v_settle >= statement_timestamp() - v_keep THEN
            action := 'kept';
          ELSE
            jobs := postjob._history_drop_range(v_range.name, COALESCE(v_range.from_id, c_min),
                                                v_range.to_id);
            action := 'dropped';
          END IF;
        END IF;
      EXCEPTION
        WHEN foreign_key_violation THEN
          action := 'pinned'; detail := SQLERRM;
        WHEN lock_not_available OR deadlock_detected THEN
          action := 'busy'; detail := SQLERRM;
        WHEN OTHERS THEN
          action := 'failed'; detail := SQLERRM;
      END;
      RETURN NEXT;
    END LOOP;
    -- one closed range of settled jobs compacted per rotation (the oldest first)
    FOR v_range IN SELECT * FROM postjob._history_ranges() h WHERE h.name = v_compact LOOP
      name := v_range.name; from_id := v_range.from_id; to_id := v_range.to_id;
      root_id := NULL; detail := NULL;
      BEGIN
        jobs := postjob._history_compact(v_range.name, COALESCE(v_range.from_id, c_min),
                                         v_range.to_id);
        action := CASE WHEN jobs IS NULL THEN 'kept' ELSE 'compacted' END;
      EXCEPTION
        WHEN foreign_key_violation THEN
          action := 'pinned'; jobs := NULL; detail := SQLERRM;
        WHEN lock_not_available OR deadlock_detected THEN
          action := 'busy'; jobs := NULL; detail := SQLERRM;
        WHEN OTHERS THEN
          action := 'failed'; jobs := NULL; detail := SQLERRM;
      END;
      RETURN NEXT;
    END LOOP;
  END IF;
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
