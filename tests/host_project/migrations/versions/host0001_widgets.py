"""The host's widgets table, which references postjob's jobs.

Revision ID: host0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "host0001"
down_revision = None
branch_labels = ("host",)
# our table references postjob.postjobs: postjob's branch must be applied first
depends_on = "postjob"


def upgrade() -> None:
    op.create_table(
        "widgets",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("job_id", sa.BigInteger, sa.ForeignKey("postjob.postjobs.id", ondelete="SET NULL")),
    )


def downgrade() -> None:
    op.drop_table("widgets")
