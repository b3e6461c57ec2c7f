"""postjob schema pj0003

Revision ID: fastapi0003
Revises: fastapi0002
Create Date: 2026-11-30 20:06:08.825946
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0003'
down_revision = 'fastapi0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0003")


def downgrade() -> None:
    migrations.downgrade(to="pj0001")
