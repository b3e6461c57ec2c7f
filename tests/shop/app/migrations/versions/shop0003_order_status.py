"""order status

Revision ID: shop0003
Revises: shop0002
Create Date: 2025-09-08 09:02:33.874410
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "shop0003"
down_revision = "shop0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("orders", sa.Column("status", sa.String(20), server_default="new", nullable=False))
    # a data migration: orders placed before statuses existed were all shipped
    op.execute("UPDATE orders SET status = 'shipped'")


def downgrade() -> None:
    op.drop_column("orders", "status")
