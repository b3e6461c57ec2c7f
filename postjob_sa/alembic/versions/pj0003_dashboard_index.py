"""The dashboard's index: settled jobs (sleep, failed, timeout, ok) by status and time.

Revision ID: pj0003
Revises: pj0002
Create Date: 2026-11-30

Serves what a sequential scan of the whole table would otherwise answer on every refresh of
the dashboard: jobs finished per minute over the last hour (a range of updated_at per final
status), and exact counts of sleeping, failed and timed-out jobs per queue (index-only
scans: the queue is included). Ready, err and processing jobs are counted through the
partial indexes the schema already has. A job enters this index once when it settles (plus
once per sleep of a parent), so the worker's checkout path does not grow.

Built CONCURRENTLY when Alembic owns the transaction (writes go on meanwhile).
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import index_step

revision = "pj0003"
down_revision = "pj0002"
branch_labels = None
depends_on = None

INDEX_UP = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS postjobs_settled_idx "
    "ON postjob.postjobs (status, updated_at) INCLUDE (queue) "
    "WHERE status IN ('sleep', 'failed', 'timeout', 'ok')"
)
INDEX_DOWN = "DROP INDEX CONCURRENTLY IF EXISTS postjob.postjobs_settled_idx"


VERSION_UP = (
    "CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql "
    "IMMUTABLE AS $$ SELECT 'pj0003'::text $$"
)
VERSION_DOWN = (
    "CREATE OR REPLACE FUNCTION postjob.schema_version() RETURNS text LANGUAGE sql "
    "IMMUTABLE AS $$ SELECT 'pj0002'::text $$"
)


def upgrade() -> None:
    index_step(INDEX_UP)
    op.execute(VERSION_UP)


def downgrade() -> None:
    op.execute(VERSION_DOWN)
    index_step(INDEX_DOWN)
