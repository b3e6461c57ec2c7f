-- What pj0009 keeps for workers and applications of pj0008, and the revision that stops
-- serving pj0008 drops: the wrappers of compat.sql's pj0008 section, the narrow tables of
-- pj0008 (kept empty, their writes refused), and the record's lease columns (NULL since).
-- Written ahead, so that that revision is a few lines.
DROP FUNCTION IF EXISTS postjob.worker_cycle_v3(bigint, varchar, bigint[], bigint[], jsonb[],
                                                text[], jsonb, bigint[], text[], text[], text[],
                                                integer, double precision, boolean, boolean);
DROP FUNCTION IF EXISTS postjob.finish_jobs_v3(bigint[], bigint[], jsonb[], text[], jsonb,
                                               bigint[]);
DROP FUNCTION IF EXISTS postjob.checkout_v3(bigint, varchar, text[], text[], text[], integer,
                                            double precision, boolean);
DROP FUNCTION IF EXISTS postjob.worker_idle(text[], text[], text[], boolean);
DROP FUNCTION IF EXISTS postjob.reap_v3(integer);
DROP FUNCTION IF EXISTS postjob.reap_v2(integer);
DROP TRIGGER IF EXISTS postjobs_retired_lease ON postjob.postjobs;
DROP TABLE IF EXISTS postjob.waiting;
DROP TABLE IF EXISTS postjob.leases;
ALTER TABLE postjob.postjobs DROP COLUMN IF EXISTS lease_token,
  DROP COLUMN IF EXISTS lease_expires_at, DROP COLUMN IF EXISTS worker_id;
