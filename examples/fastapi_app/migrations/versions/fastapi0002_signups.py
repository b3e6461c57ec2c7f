"""The signups table, which references postjob_sa's jobs.

Revision ID: fastapi0002
Revises: fastapi0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "fastapi0002"
# after fastapi0001, which installed postjob's schema: welcome_job_id can reference it
down_revision = "fastapi0001"
branch_labels = None
depends_on = None


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
