"""postjob schema pj0005

Revision ID: fastapi0005
Revises: fastapi0004
Create Date: 2026-12-01 05:32:04.164479
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = 'fastapi0005'
down_revision = 'fastapi0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0005")


def downgrade() -> None:
    migrations.downgrade(to="pj0004")
