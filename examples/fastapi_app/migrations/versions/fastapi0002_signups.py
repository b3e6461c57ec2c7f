"""The signups table, which references postjob_sa's jobs.

Revision ID: fastapi0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "fastapi0001"
down_revision = None
branch_labels = ("app",)
# signups.welcome_job_id references postjob.postjobs: apply postjob_sa's branch first
depends_on = "postjob"


def upgrade() -> None:
    op.create_table(
        "signups",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("email", sa.String(320), nullable=False, unique=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("welcomed_at", sa.DateTime(timezone=True)),
        sa.Column(
            "welcome_job_id",
            sa.BigInteger,
            sa.ForeignKey("postjob.postjobs.id", ondelete="SET NULL"),
        ),
    )


def downgrade() -> None:
    op.drop_table("signups")
