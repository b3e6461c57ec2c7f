"""The dashboard's index: settled jobs (sleep, failed, timeout, ok) by status and time.

Revision ID: pj0003
Revises: pj0001
Create Date: 2026-11-30

Serves what a sequential scan of the whole table would otherwise answer on every refresh of
the dashboard: jobs finished per minute over the last hour (a range of updated_at per final
status), and exact counts of sleeping, failed and timed-out jobs per queue (index-only
scans: the queue is included). Ready, err and processing jobs are counted through the
partial indexes pj0001 already has. A job enters this index once when it settles (plus
once per sleep of a parent), so the worker's checkout path does not grow.

The build takes the table's write lock for as long as it runs (about 2 s per million jobs
on a small machine); see docs/operations.md.
"""

from __future__ import annotations

from alembic import op

revision = "pj0003"
down_revision = "pj0001"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
CREATE INDEX postjobs_settled_idx ON postjob.postjobs (status, updated_at) INCLUDE (queue)
  WHERE status IN ('sleep', 'failed', 'timeout', 'ok');

CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0003'::text
$$;
"""

DOWNGRADE_SQL = r"""
DROP INDEX postjob.postjobs_settled_idx;

CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT 'pj0001'::text
$$;
"""


def upgrade() -> None:
    op.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.execute(DOWNGRADE_SQL)
