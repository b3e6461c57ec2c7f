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
    UPDATE postjob.queue_slots s SET job_id = r.id
    FROM (SELECT f.slot, j.id
          FROM (SELECT x.slot, row_number() OVER (ORDER BY x.slot) AS k
                FROM postjob.queue_slots x WHERE x.queue = NEW.queue AND x.job_id IS NULL) f
          JOIN (SELECT j.id, row_number() OVER (ORDER BY j.id) AS k
                FROM postjob.leases l
                CROSS JOIN unnest(l.job_ids) AS h(id)
                JOIN postjob.postjobs j ON j.id = h.id AND j.lease_token = l.token
                WHERE j.queue = NEW.queue
                  AND NOT EXISTS (SELECT 1 FROM postjob.queue_slots y WHERE y.job_id = j.id)) j
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
