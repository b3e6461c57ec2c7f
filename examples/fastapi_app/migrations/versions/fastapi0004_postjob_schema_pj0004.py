"""postjob schema pj0004

Revision ID: fastapi0004
Revises: fastapi0003
Create Date: 2026-12-01 02:38:04.067524
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0004'
down_revision = 'fastapi0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0004")


def downgrade() -> None:
    migrations.downgrade(to="pj0003")
