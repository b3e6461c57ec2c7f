"""customers

Revision ID: shop0001
Revises:
Create Date: 2025-03-02 10:14:07.518274
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "shop0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "customers",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("email", sa.String(320), nullable=False, unique=True),
    )


def downgrade() -> None:
    op.drop_table("customers")
