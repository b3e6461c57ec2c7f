"""Round 5: the function bodies of the fifth round.

Revision ID: pj0011
Revises: pj0010
Create Date: 2026-12-07

Installs the live function files (pj0010's are frozen in ``postjob_sa/sql/history/pj0010/``)
in one short transaction; pj0008's code is still served. What changed is in the live files'
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

# Function bodies only: no table lock is needed to replace them (a call under way finishes on
# the body it began with, the next one runs the new body).
BEGIN = r"""
SET LOCAL lock_timeout = '10s';
SET LOCAL check_function_bodies = off
"""


def upgrade() -> None:
    own_transaction_retried("\n;\n".join([BEGIN, *_sql_files.functions("pj0011"), VERSION]))


# -- downgrade: back to pj0010 exactly -------------------------------------------------------

VERSION_DOWN = r"""
CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'pj0010'::text $$;
"""

# What pj0011's function files added (history.sql: the rotation's narrowing of a range).
DROP_ADDED = r"""
DROP FUNCTION postjob._history_narrow(text, bigint, bigint, bigint, bigint)
"""


def downgrade() -> None:
    own_transaction_retried("\n;\n".join([BEGIN, *_sql_files.functions("pj0010"),
                                          DROP_ADDED, VERSION_DOWN]))
