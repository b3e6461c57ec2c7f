-- What pj0011 keeps for workers of pj0008 to pj0010, and the revision that stops serving
-- pj0010 drops (the wrappers of compat.sql's "pj0008 to pj0010" section). Written ahead, so
-- that that revision is a few lines.
DROP FUNCTION IF EXISTS postjob.register_worker(varchar, double precision, varchar, text[],
                                                text[]);
