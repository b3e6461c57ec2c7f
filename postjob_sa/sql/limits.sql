-- Queue limits: a limit row (postjob.queue_limits, written by JobQueue.set_queue_limits) and
-- the permits a checkout takes from it (checkout.sql): one place per job that may run at once,
-- one start per job that may start in a period. The permits follow the numbers: raising a
-- limit adds them; lowering it leaves the ones above it unused (a place above the limit stays
-- taken until its job ends).

-- At most this many places and starts are kept for one queue (set_queue_limits refuses more).
CREATE OR REPLACE FUNCTION postjob._permits_max() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 100000 $$;

CREATE OR REPLACE FUNCTION postjob._queue_permits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.concurrency IS NOT NULL THEN
    INSERT INTO postjob.queue_slots (queue, slot)
    SELECT NEW.queue, n FROM generate_series(1, least(NEW.concurrency, postjob._permits_max())) n
    ON CONFLICT DO NOTHING;
  END IF;
  IF NEW.rate IS NOT NULL THEN
    INSERT INTO postjob.queue_starts (queue, n)
    SELECT NEW.queue, n FROM generate_series(1, least(NEW.rate, postjob._permits_max())) n
    ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END;
$$;
