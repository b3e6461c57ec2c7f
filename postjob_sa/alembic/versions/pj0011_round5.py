"""Round 5: the function bodies of the fifth round.

Revision ID: pj0011
Revises: pj0010
Create Date: 2026-12-07

Installs the live function files (pj0010's are frozen in ``postjob_sa/sql/history/pj0010/``)
in one short transaction that locks the tables they write, with three columns of
``postjob.workers`` (what a worker serves, its
connection); pj0008's code is still served. What changed is in the live files'
history and in CHANGELOG.md.
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


def upgrade() -> None:
    own_transaction_retried("\n;\n".join([BEGIN, WORKERS_UP, *_sql_files.functions("pj0011"),
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


def downgrade() -> None:
    own_transaction_retried("\n;\n".join([BEGIN, *_sql_files.functions("pj0010"),
                                          DROP_ADDED, WORKERS_DOWN, VERSION_DOWN]), tries=20)
