"""postjob schema pj0001

Revision ID: 0ba0f0330356
Revises: shop0003
Create Date: 2026-11-30 19:40:21.938897
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '0ba0f0330356'
down_revision = 'shop0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0001")


def downgrade() -> None:
    migrations.downgrade(to=None)
