"""orders

Revision ID: shop0002
Revises: shop0001
Create Date: 2025-04-17 16:40:51.093311
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "shop0002"
down_revision = "shop0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        # unnamed, as most histories have them: PostgreSQL calls it orders_customer_id_fkey
        sa.Column("customer_id", sa.BigInteger(), sa.ForeignKey("customers.id"), nullable=False),
        sa.Column("total", sa.Numeric(10, 2), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orders")
