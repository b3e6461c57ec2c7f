-- Queue limits: a limit row (postjob.queue_limits, written by JobQueue.set_queue_limits) and
-- the permits a checkout takes from it (checkout.sql): one place per job that may run at once,
-- one start per job that may start in a period. The permits follow the numbers: raising a
-- limit adds them; lowering it leaves the ones above it unused (a place above the limit stays
-- taken until its job ends); a queue limited while jobs of it run gives them places first.

-- At most this many places and starts are kept for one queue (set_queue_limits refuses more).
CREATE OR REPLACE FUNCTION postjob._permits_max() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 100000 $$;

CREATE OR REPLACE FUNCTION postjob._queue_permits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.concurrency IS NOT NULL THEN
    INSERT INTO postjob.queue_slots (queue, slot)
    SELECT NEW.queue, n FROM generate_series(1, least(NEW.concurrency, postjob._permits_max())) n
    ON CONFLICT DO NOTHING;
    -- the queue's jobs running already (checked out before it was limited) take places too
    -- (free places a checkout holds right now are passed over: it is taking them)
    UPDATE postjob.queue_slots s SET job_id = r.id
    FROM (SELECT f.slot, j.id
          FROM (SELECT x.slot, row_number() OVER (ORDER BY x.slot) AS k
                FROM (SELECT y.slot FROM postjob.queue_slots y
                      WHERE y.queue = NEW.queue AND y.job_id IS NULL
                      ORDER BY y.slot FOR UPDATE SKIP LOCKED) x) f
          JOIN (SELECT u.job_id AS id, row_number() OVER (ORDER BY u.job_id) AS k
                FROM postjob.unfinished u
                WHERE u.queue = NEW.queue AND u.lease_token IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM postjob.queue_slots y WHERE y.job_id = u.job_id)) j
            ON j.k = f.k) r
    WHERE s.queue = NEW.queue AND s.slot = r.slot;
  END IF;
  IF NEW.rate IS NOT NULL THEN
    INSERT INTO postjob.queue_starts (queue, n)
    SELECT NEW.queue, n FROM generate_series(1, least(NEW.rate, postjob._permits_max())) n
    ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END;
$$;

-- A queue no longer limited: its places and starts go (after its limit, in the lock order);
-- all of them when the limits are truncated.
CREATE OR REPLACE FUNCTION postjob._queue_permits_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    TRUNCATE postjob.queue_slots, postjob.queue_starts;
  ELSE
    DELETE FROM postjob.queue_slots s WHERE s.queue = OLD.queue;
    DELETE FROM postjob.queue_starts s WHERE s.queue = OLD.queue;
  END IF;
  RETURN NULL;
END;
$$;
