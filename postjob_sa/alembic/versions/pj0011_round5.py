"""Round 5: the function bodies of the fifth round.

Revision ID: pj0011
Revises: pj0010
Create Date: 2026-12-07

Installs the live function files (pj0010's are frozen in ``postjob_sa/sql/history/pj0010/``)
in one short transaction that locks the tables they write, with three columns of
``postjob.workers`` (what a worker serves, its
connection); pj0008's code is still served. What changed is in the live files'
history and in CHANGELOG.md.

``postjob.settled_counts`` (the jobs settled per minute, queue and status: what the
dashboard's last hour reads) is created and filled from the record's last hour, in the same
transaction as the function bodies that keep it from then on (the record's lock makes the
seed exact: no job settles between the two; it reads the record once, so it holds the lock
longer on a big record: about a second a million jobs).
"""

from __future__ import annotations

from postjob_sa.alembic import _sql_files
from postjob_sa.alembic._steps import own_transaction_retried

revision = "pj0011"
down_revision = "pj0010"
branch_labels = None
depends_on = None

VERSION = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0011'::text $$;
CREATE OR REPLACE FUNCTION postjob.oldest_served_code() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0008'::text $$;
"""

# The bodies are replaced while the record is locked: every worker's call reads or writes it,
# so a call runs wholly on the old bodies before the step or on the new ones after it (the
# upgrade window, tests/reliability/upgrade_window.py, holds the step). postjob.unfinished is
# not locked: an enqueue of the release before holds it while it waits for the record, and
# this step would close a cycle with it. postjob.workers (its columns) comes next, with a
# lock_timeout shorter than the server's deadlock_timeout, so that against a call that holds
# it and waits for the record the step gives up first and is tried again
# (own_transaction_retried), never the caller.
BEGIN = r"""
SET LOCAL lock_timeout = '10s';
SET LOCAL check_function_bodies = off;
LOCK TABLE postjob.postjobs IN ACCESS EXCLUSIVE MODE;
SET LOCAL lock_timeout = '400ms';
LOCK TABLE postjob.workers IN ACCESS EXCLUSIVE MODE;
SET LOCAL lock_timeout = '10s'
"""


# What a worker serves (the versions of its workflows: a new job wakes only a worker that
# serves it) and its own connection's server process (gone: the worker is dead, its jobs are
# rescued at once). Columns with no default: no rewrite, a moment's lock of postjob.workers.
WORKERS_UP = r"""
ALTER TABLE postjob.workers ADD COLUMN workflow_versions text[],
  ADD COLUMN backend_pid integer, ADD COLUMN backend_start timestamptz
"""


SETTLED_COUNTS = r"""
CREATE TABLE postjob.settled_counts (
  minute  timestamptz NOT NULL,
  queue   varchar NOT NULL,
  status  postjob.statuses NOT NULL,
  shard   integer NOT NULL,
  n       bigint NOT NULL,
  PRIMARY KEY (minute, queue, status, shard)
) WITH (fillfactor = 50);
ALTER TABLE postjob.settled_counts SET (autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)
"""

# Every outcome writes the counts: a role that may write postjob.unfinished (a worker's, an
# app's: `postjob db grant`) gets the same on them, or its next outcome would be refused.
SETTLED_COUNTS_GRANTS = r"""
DO $$
DECLARE g record;
BEGIN
  FOR g IN
    SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE quote_ident(a.grantee::regrole::text) END AS grantee
    FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    WHERE c.oid = 'postjob.unfinished'::regclass AND a.grantee <> c.relowner
      AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
  LOOP
    EXECUTE format('GRANT %s ON TABLE postjob.settled_counts TO %s', g.privilege_type, g.grantee);
  END LOOP;
END
$$
"""

# After the function bodies that count from now on: what settled in the last hour before
# them, read from the record (its jobs' last update), as the closed minutes' rows (shard 0).
# The statuses are compared as text: a migration from nothing in one transaction has added
# 'cancelled' to the enum in that transaction, and PostgreSQL refuses it as a constant there.
SETTLED_COUNTS_SEED = r"""
INSERT INTO postjob.settled_counts (minute, queue, status, shard, n)
SELECT to_timestamp(floor(extract(epoch FROM updated_at) / 60) * 60), queue, status, 0, count(*)
FROM postjob.postjobs
WHERE status::text IN ('ok', 'failed', 'timeout', 'cancelled')
  AND updated_at > statement_timestamp() - interval '61 minutes'
GROUP BY 1, 2, 3
"""


def upgrade() -> None:
    own_transaction_retried("\n;\n".join([BEGIN, WORKERS_UP, SETTLED_COUNTS, SETTLED_COUNTS_GRANTS,
                                          *_sql_files.functions("pj0011"), SETTLED_COUNTS_SEED,
                                          VERSION]), tries=20)


# -- downgrade: back to pj0010 exactly -------------------------------------------------------

VERSION_DOWN = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0010'::text $$;
"""

# What pj0011's function files added (history.sql: the rotation's narrowing of a range).
DROP_ADDED = r"""
DROP FUNCTION postjob._history_narrow(text, bigint, bigint, bigint, bigint)
"""


WORKERS_DOWN = r"""
DROP FUNCTION postjob.register_worker_v2(varchar, double precision, varchar, text[], text[],
                                         text[]);
DROP FUNCTION postjob.worker_attach_v1(bigint);
DROP FUNCTION postjob._dead_workers();
DROP FUNCTION postjob._wake_for(integer, varchar, varchar, varchar);
DROP FUNCTION postjob.pass_wakeup_v1(bigint, text);
DROP FUNCTION postjob._serves_due(text[], text[], text[]);
DROP FUNCTION postjob._serves(text[], text[], text[], varchar, varchar, varchar);
ALTER TABLE postjob.workers DROP COLUMN workflow_versions, DROP COLUMN backend_pid,
  DROP COLUMN backend_start
"""


SETTLED_COUNTS_DROP = r"""
DROP FUNCTION postjob._count_settled(varchar[], postjob.statuses[]);
DROP FUNCTION postjob._settled_counts_fold();
DROP TABLE postjob.settled_counts
"""


def downgrade() -> None:
    own_transaction_retried("\n;\n".join([BEGIN, *_sql_files.functions("pj0010"),
                                          DROP_ADDED, WORKERS_DOWN, SETTLED_COUNTS_DROP,
                                          VERSION_DOWN]), tries=20)
