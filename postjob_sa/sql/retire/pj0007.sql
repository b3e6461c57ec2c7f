-- What pj0008 kept for workers of pj0007 and the revision that stops serving pj0007 (pj0009)
-- drops. Written ahead, so that the revision which stops serving a release is a few lines.
DROP FUNCTION IF EXISTS postjob.checkout_v2(bigint, varchar, text[], text[], text[], integer,
                                            double precision);
DROP FUNCTION IF EXISTS postjob.finish_jobs(bigint[], bigint[], text[], jsonb[], text[], text[],
                                            jsonb[], text[], bigint[], boolean);
DROP FUNCTION IF EXISTS postjob.worker_cycle(bigint, varchar, bigint[], bigint[], text[],
                                             jsonb[], text[], text[], jsonb[], text[], bigint[],
                                             text[], text[], text[], integer, double precision,
                                             boolean, boolean);
